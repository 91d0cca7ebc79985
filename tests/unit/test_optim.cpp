// Optimisers and gradient clipping against hand-written references. Each reference
// spells the update out in double from the published formulas (PyTorch's SGD and
// AdamW), so a wrong kernel or wrong hyperparameter wiring cannot also fix its own
// expectation.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/sgd.h"

using namespace ht;
using ht::optim::AdamW;
using ht::optim::SGD;

namespace {

// The same values in float32 and double: inputs are exact in both.
const std::vector<double> kInit = {1.0, -2.0, 0.5, 3.0};
const std::vector<std::vector<double>> kGrads = {
    {0.5, -0.25, 1.0, -2.0}, {0.25, 0.75, -0.5, 1.5}, {-1.0, 0.125, 0.25, 0.5}};

Tensor tensor_of(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_vector(std::vector<float>(v.begin(), v.end()), shape, cpu_backend());
}

Tensor make_param(const std::vector<double>& v = kInit) {
  Tensor p = tensor_of(v, {2, 2});
  p.set_requires_grad();
  return p;
}

void check_close(const Tensor& t, const std::vector<double>& want, double rel = 2e-6) {
  std::vector<float> got = t.to_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element ", i);
    CHECK(static_cast<double>(got[i]) == doctest::Approx(want[i]).epsilon(rel));
  }
}


struct SgdRef {
  double lr, momentum, wd;
  bool nesterov;
  std::vector<double> p = kInit, buf = std::vector<double>(kInit.size(), 0.0);
  int t = 0;
  void step(const std::vector<double>& grad) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + wd * p[i];
      if (momentum != 0.0) {
        buf[i] = t == 1 ? g : momentum * buf[i] + g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  }
};

struct AdamWRef {
  double lr, b1, b2, eps, wd;
  std::vector<double> p = kInit, m = std::vector<double>(kInit.size(), 0.0),
                      v = std::vector<double>(kInit.size(), 0.0);
  int t = 0;
  void step(const std::vector<double>& grad) {
    ++t;
    double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1.0 - b1) * grad[i];
      v[i] = b2 * v[i] + (1.0 - b2) * grad[i] * grad[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

void check_sgd(const optim::SgdOptions& o) {
  Tensor w = make_param();
  SGD opt({{"w", w}}, o);
  SgdRef ref{o.lr, o.momentum, o.weight_decay, o.nesterov};
  for (const auto& g : kGrads) {
    w.set_grad(tensor_of(g, {2, 2}));
    opt.step();
    ref.step(g);
    check_close(w, ref.p);
  }
  CHECK(opt.step_count() == 3);
}

int32_t counter(const std::vector<nn::NamedTensor>& state, const std::string& name) {
  for (const auto& [n, t] : state)
    if (n == name) return t.to_ints()[0];
  FAIL("no state entry ", name);
  return -1;
}

}  // namespace

TEST_CASE("optim/sgd plain") { check_sgd({.lr = 0.1f}); }
TEST_CASE("optim/sgd weight decay") { check_sgd({.lr = 0.1f, .weight_decay = 0.25f}); }
TEST_CASE("optim/sgd momentum") { check_sgd({.lr = 0.1f, .momentum = 0.9f}); }
TEST_CASE("optim/sgd nesterov with weight decay") {
  check_sgd({.lr = 0.05f, .momentum = 0.8f, .weight_decay = 0.1f, .nesterov = true});
}

TEST_CASE("optim/adamw three steps with weight decay") {
  Tensor w = make_param();
  optim::AdamWOptions o{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                        .weight_decay = 0.1f};
  AdamW opt({{"w", w}}, o);
  AdamWRef ref{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  for (const auto& g : kGrads) {
    w.set_grad(tensor_of(g, {2, 2}));
    opt.step();
    ref.step(g);
    check_close(w, ref.p);
  }
}

TEST_CASE("optim/adamw counts updates per parameter and skips missing grads") {
  Tensor a = make_param(), b = make_param();
  optim::AdamWOptions o{.lr = 0.1f, .weight_decay = 0.1f};
  AdamW opt({{"a", a}, {"b", b}}, o);
  AdamWRef ref_a{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  AdamWRef ref_b = ref_a;

  a.set_grad(tensor_of(kGrads[0], {2, 2}));
  opt.step();  // b has no gradient: untouched, no weight decay either
  ref_a.step(kGrads[0]);
  check_close(b, kInit);

  a.set_grad(tensor_of(kGrads[1], {2, 2}));
  b.set_grad(tensor_of(kGrads[1], {2, 2}));
  opt.step();  // b's first update: bias correction with t = 1, as PyTorch
  ref_a.step(kGrads[1]);
  ref_b.step(kGrads[1]);
  check_close(a, ref_a.p);
  check_close(b, ref_b.p);

  auto state = opt.state();
  CHECK(counter(state, "a.step") == 2);
  CHECK(counter(state, "b.step") == 1);
  CHECK(counter(state, "step") == 2);

  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  opt.step();
  check_close(a, ref_a.p);
  CHECK(opt.step_count() == 3);
}

TEST_CASE("optim/sgd steps a gradient from a real backward pass") {
  Tensor w = make_param();
  Tensor x = tensor_of({2.0, -1.0, 0.5, 4.0}, {2, 2});
  sum(mul(w, x)).backward();  // d/dw = x
  SGD opt({{"w", w}}, {.lr = 0.5f});
  opt.step();
  check_close(w, {1.0 - 1.0, -2.0 + 0.5, 0.5 - 0.25, 3.0 - 2.0});
}

TEST_CASE("optim/clip_grad_norm scales by max_norm / (norm + 1e-6)") {
  Tensor a = make_param(), b = Tensor::zeros({3}, cpu_backend()).set_requires_grad(), c = make_param();
  a.set_grad(tensor_of({3.0, 0.0, 0.0, 4.0}, {2, 2}));
  // A strided gradient (every other element of `base`): clipping must give b a
  // scaled dense copy and leave `base` alone.
  Tensor base = tensor_of({12.0, 99.0, 0.0, 99.0, 0.0, 99.0}, {6});
  b.set_grad(base.view_as({3}, {2}, 0));
  std::vector<nn::NamedTensor> params{{"a", a}, {"b", b}, {"c", c}};  // c: no grad

  double norm = std::sqrt(3.0 * 3.0 + 4.0 * 4.0 + 12.0 * 12.0);  // 13
  CHECK(optim::clip_grad_norm(params, 20.f) == doctest::Approx(norm));  // below: unchanged
  check_close(a.grad(), {3.0, 0.0, 0.0, 4.0});

  double scale = 6.5 / (norm + 1e-6);
  CHECK(optim::clip_grad_norm(params, 6.5f) == doctest::Approx(norm).epsilon(1e-7));
  check_close(a.grad(), {3.0 * scale, 0.0, 0.0, 4.0 * scale});
  check_close(b.grad(), {12.0 * scale, 0.0, 0.0});
  check_close(base, {12.0, 99.0, 0.0, 99.0, 0.0, 99.0});
  CHECK_FALSE(c.grad().defined());

  // A second call sees the clipped norm.
  CHECK(optim::clip_grad_norm(params, 100.f) ==
        doctest::Approx(13.0 * scale).epsilon(1e-6));
  CHECK(contains(error_of([&] { optim::clip_grad_norm(params, 0.f); }),
                 "clip_grad_norm: max_norm 0 is out of range; expected a finite max_norm > 0"));
}

TEST_CASE("optim/state round trip restores an optimiser mid-way") {
  auto run = [](auto make_opt) {
    auto grad_at = [](int k) {
      std::vector<double> g(kInit.size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(1.0 + k * 0.7 + i * 1.3);
      return g;
    };
    Tensor wa = make_param();
    auto straight = make_opt(wa);
    for (int k = 0; k < 5; ++k) {
      wa.set_grad(tensor_of(grad_at(k), {2, 2}));
      straight->step();
    }

    Tensor wb = make_param();
    auto first = make_opt(wb);
    for (int k = 0; k < 2; ++k) {
      wb.set_grad(tensor_of(grad_at(k), {2, 2}));
      first->step();
    }
    // A checkpoint: copies of the parameter and state, as a file would hold them.
    std::vector<nn::NamedTensor> saved;
    for (const auto& [name, t] : first->state()) saved.emplace_back(name, clone(t));
    Tensor wc = clone(wb.detach()).set_requires_grad();
    first.reset();

    auto resumed = make_opt(wc);
    resumed->load_state(saved);
    CHECK(resumed->step_count() == 2);
    for (int k = 2; k < 5; ++k) {
      wc.set_grad(tensor_of(grad_at(k), {2, 2}));
      resumed->step();
    }
    CHECK(resumed->step_count() == 5);
    CHECK(wc.to_vector() == wa.to_vector());  // the same float ops: bit-identical
  };
  SUBCASE("adamw") {
    run([](Tensor w) {
      return std::make_unique<AdamW>(std::vector<nn::NamedTensor>{{"w", w}},
                                     optim::AdamWOptions{.lr = 0.05f, .weight_decay = 0.1f});
    });
  }
  SUBCASE("sgd nesterov") {
    run([](Tensor w) {
      return std::make_unique<SGD>(
          std::vector<nn::NamedTensor>{{"w", w}},
          optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f, .nesterov = true});
    });
  }
}

TEST_CASE("optim/state names and load_state mismatches") {
  Tensor w = make_param(), b = Tensor::zeros({3}, cpu_backend()).set_requires_grad();
  AdamW opt({{"fc.weight", w}, {"fc.bias", b}});
  std::vector<std::string> names;
  for (const auto& [n, t] : opt.state()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"fc.weight.exp_avg", "fc.weight.exp_avg_sq",
                                          "fc.weight.step", "fc.bias.exp_avg",
                                          "fc.bias.exp_avg_sq", "fc.bias.step", "step"});

  auto with = [&](const std::string& name, const Tensor& t) {
    auto s = opt.state();
    for (auto& [n, x] : s)
      if (n == name) x = t;
    return s;
  };
  CHECK(contains(error_of([&] { opt.load_state(with("fc.bias.exp_avg", Tensor::zeros({4}, cpu_backend()))); }),
                 "AdamW: load_state: 'fc.bias.exp_avg' has shape [4]; expected [3]"));
  CHECK(contains(
      error_of([&] { opt.load_state(with("fc.weight.step", Tensor::zeros({1}, cpu_backend()))); }),
      "AdamW: load_state: 'fc.weight.step' is float32; expected int32"));
  CHECK(contains(error_of([&] {
                   opt.load_state(with("step", Tensor::from_ints({-3}, {1}, cpu_backend())));
                 }),
                 "counter 'step' is -3"));

  auto missing = opt.state();
  missing.erase(missing.begin() + 1);
  CHECK(contains(error_of([&] { opt.load_state(missing); }),
                 "AdamW: load_state: no tensor named 'fc.weight.exp_avg_sq'"));

  auto extra = opt.state();
  extra.emplace_back("fc.weight.momentum_buffer", Tensor::zeros({2, 2}, cpu_backend()));
  CHECK(contains(error_of([&] { opt.load_state(extra); }),
                 "unexpected tensor 'fc.weight.momentum_buffer'"));

  // SGD state does not load into AdamW.
  SGD sgd({{"fc.weight", make_param()}, {"fc.bias", Tensor::zeros({3}, cpu_backend())}},
          {.lr = 0.1f, .momentum = 0.9f});
  CHECK(contains(error_of([&] { opt.load_state(sgd.state()); }),
                 "no tensor named 'fc.weight.exp_avg'"));

  // A load that fails late (a bad last entry) changes nothing.
  auto late = with("step", Tensor::from_ints({7}, {1}, cpu_backend()));
  late[0].second = Tensor::full({2, 2}, 1.f, cpu_backend());
  late[5].second = Tensor::zeros({2}, cpu_backend());
  CHECK(contains(error_of([&] { opt.load_state(late); }), "'fc.bias.step' has shape [2]"));
  check_close(opt.state()[0].second, {0.0, 0.0, 0.0, 0.0});
  CHECK(opt.step_count() == 0);
}

TEST_CASE("optim/load_state refuses a negative exp_avg_sq and a parameter updated more often than stepped") {
  Tensor w = make_param(), b = Tensor::zeros({3}, cpu_backend()).set_requires_grad();
  AdamW opt({{"fc.weight", w}, {"fc.bias", b}});
  auto with = [&](std::vector<std::pair<std::string, Tensor>> changes) {
    auto s = opt.state();
    for (auto& [n, x] : s)
      for (const auto& [name, t] : changes)
        if (n == name) x = t;
    return s;
  };
  const Tensor five = Tensor::from_ints({5}, {1}, cpu_backend());
  // A negative mean of squares (sqrt of it is NaN on the next update): refused by its
  // value, as a StateValueError, and nothing is loaded, the exp_avg before it included.
  auto negative = with({{"step", five},
                        {"fc.weight.exp_avg", Tensor::full({2, 2}, 1.f, cpu_backend())},
                        {"fc.bias.exp_avg_sq", Tensor::from_vector({0.f, -1.f, 0.f}, {3}, cpu_backend())}});
  bool value_error = false;
  try {
    opt.load_state(negative);
  } catch (const optim::StateValueError& e) {
    value_error = true;
    CHECK(contains(e.what(), "AdamW: load_state: 'fc.bias.exp_avg_sq' holds -1 at element 1; expected values >= 0"));
  }
  CHECK(value_error);
  check_close(opt.state()[0].second, {0.0, 0.0, 0.0, 0.0});
  CHECK(opt.step_count() == 0);
  // A NaN is not >= 0 either.
  CHECK(contains(error_of([&] {
                   opt.load_state(with({{"fc.weight.exp_avg_sq", Tensor::full({2, 2}, NAN, cpu_backend())}}));
                 }),
                 "'fc.weight.exp_avg_sq' holds nan at element 0"));
  // exp_avg may be negative (a mean of gradients).
  opt.load_state(with({{"step", five}, {"fc.weight.exp_avg", Tensor::full({2, 2}, -1.f, cpu_backend())}}));
  CHECK(opt.step_count() == 5);
  // A parameter's count above the step count.
  CHECK(contains(error_of([&] {
                   opt.load_state(with({{"step", five}, {"fc.weight.step", Tensor::from_ints({6}, {1}, cpu_backend())}}));
                 }),
                 "counter 'fc.weight.step' is 6, above the optimiser's step count 5"));
}

TEST_CASE("optim/load_state from a source reads one tensor at a time, and none before all is checked") {
  Tensor w = make_param(), b = Tensor::zeros({3}, cpu_backend()).set_requires_grad();
  AdamW opt({{"fc.weight", w}, {"fc.bias", b}});
  // A checkpoint's state: every slot a distinct value.
  std::map<std::string, Tensor> saved;
  float v = 1.f;
  for (const auto& [name, t] : opt.state())
    saved[name] = t.dtype() == DType::i32 ? Tensor::from_ints({3}, {1}, cpu_backend())
                                          : Tensor::full(t.shape(), v++, cpu_backend());
  std::vector<std::string> reads;
  // The allocator's live bytes as each read starts: a tensor read before and still held
  // would show as a rise between reads.
  std::vector<size_t> live;
  optim::Optimizer::StateSource source;
  for (const auto& [name, t] : saved) source.names.push_back(name);
  source.shape = [&](const std::string& name) { return std::make_pair(saved.at(name).shape(), saved.at(name).dtype()); };
  source.read = [&](const std::string& name) {
    reads.push_back(name);
    live.push_back(cpu_backend().allocator().live_bytes());
    const Tensor& t = saved.at(name);
    return t.dtype() == DType::i32 ? Tensor::from_ints(t.to_ints(), t.shape(), cpu_backend())
                                   : Tensor::from_vector(t.to_vector(), t.shape(), cpu_backend());
  };
  // A wrong shape is found before anything is read.
  optim::Optimizer::StateSource bad = source;
  bad.shape = [&](const std::string& name) {
    return name == "fc.bias.exp_avg_sq" ? std::make_pair(Shape{4}, DType::f32) : source.shape(name);
  };
  CHECK(contains(error_of([&] { opt.load_state(bad); }), "'fc.bias.exp_avg_sq' has shape [4]; expected [3]"));
  CHECK(reads.empty());
  opt.load_state(source);
  CHECK(opt.step_count() == 3);
  for (const auto& [name, t] : opt.state())
    if (t.dtype() == DType::f32) CHECK(t.to_vector() == saved.at(name).to_vector());
  // Each tensor once, and exp_avg_sq twice: checked (>= 0) before anything changes, then
  // read again to copy, so that none is held past its read.
  for (const auto& [name, t] : saved) {
    const bool checked = name.size() > 11 && name.compare(name.size() - 11, 11, ".exp_avg_sq") == 0;
    CHECK_MESSAGE(std::count(reads.begin(), reads.end(), name) == (checked ? 2 : 1), name);
  }
  CHECK(reads.size() == saved.size() + 2);
  REQUIRE(!live.empty());
  CHECK(*std::max_element(live.begin(), live.end()) == *std::min_element(live.begin(), live.end()));
}

TEST_CASE("optim/bad hyperparameters and parameters are rejected") {
  auto params = [] { return std::vector<nn::NamedTensor>{{"w", make_param()}}; };
  CHECK(error_of([&] { AdamW(params(), {.beta1 = 1.5f}); }) ==
        "AdamW: beta1 1.5 is out of range; expected 0 <= beta1 < 1");
  CHECK(error_of([&] { AdamW(params(), {.beta2 = 1.f}); }) ==
        "AdamW: beta2 1 is out of range; expected 0 <= beta2 < 1");
  CHECK(error_of([&] { AdamW(params(), {.eps = -1e-8f}); }) ==
        "AdamW: eps -1e-08 is out of range; expected a finite eps >= 0");
  CHECK(error_of([&] { AdamW(params(), {.lr = std::nanf("")}); }) ==
        "AdamW: lr nan is out of range; expected a finite lr >= 0");
  CHECK(error_of([&] { AdamW(params(), {.weight_decay = -0.1f}); }) ==
        "AdamW: weight_decay -0.1 is out of range; expected a finite weight_decay >= 0");
  CHECK(error_of([&] { SGD(params(), {.lr = -0.1f}); }) ==
        "SGD: lr -0.1 is out of range; expected a finite lr >= 0");
  CHECK(error_of([&] { SGD(params(), {.momentum = -0.5f}); }) ==
        "SGD: momentum -0.5 is out of range; expected a finite momentum >= 0");
  CHECK(error_of([&] { SGD(params(), {.nesterov = true}); }) ==
        "SGD: nesterov needs momentum > 0; got momentum 0");

  SGD ok(params(), {.lr = 0.1f});
  CHECK(error_of([&] { ok.set_lr(-1.f); }) ==
        "SGD: lr -1 is out of range; expected a finite lr >= 0");
  ok.set_lr(0.01f);
  CHECK(ok.lr() == 0.01f);

  CHECK(contains(error_of([] { SGD({}, {}); }), "SGD: got an empty parameter list"));
  Tensor w = make_param();
  CHECK(contains(error_of([&] { AdamW({{"w", w}, {"w", make_param()}}); }),
                 "AdamW: state name 'w.exp_avg' arises twice"));
  CHECK(contains(error_of([&] { AdamW({{"w", w}, {"v", w}}); }),
                 "AdamW: parameter 'v' is the same tensor as an earlier entry"));
  CHECK(contains(error_of([&] { AdamW({{"wt", transpose(w, 0, 1).detach()}}); }),
                 "AdamW: parameter 'wt' of shape [2, 2] is a strided view"));
}
