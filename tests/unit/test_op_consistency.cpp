// Every op case of the harness on the CPU backend: forward against the double
// reference, gradients against central finite differences; and a convolution unfolded in
// chunks against its samples one at a time.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ops/ops.h"
#include "tests/harness/consistency.h"

using namespace ht;
using namespace ht::harness;

TEST_CASE("op consistency: every case matches its reference and finite differences") {
  for (const OpCase& c : all_op_cases()) {
    CAPTURE(c.name);
    for (uint64_t seed : {1u, 2u}) {
      Report f = check_forward(c, cpu_backend(), seed);
      CHECK_MESSAGE(f.ok, f.detail);
      Report g = check_gradients(c, cpu_backend(), seed);
      CHECK_MESSAGE(g.ok, g.detail);
      MESSAGE(c.name << " seed " << seed << ": forward error " << f.worst << ", gradient error "
                     << g.worst);
    }
  }
}

TEST_CASE("op consistency: the harness covers every differentiable op") {
  std::set<std::string> names;
  for (const OpCase& c : all_op_cases()) names.insert(c.name);
  for (const char* required :
       {"matmul", "batched_matmul", "add_broadcast_row", "sub_broadcast_both",
        "mul_broadcast_column", "div_broadcast", "neg", "add_scalar", "mul_scalar", "pow_scalar",
        "sum_non_adjacent_axes", "mean_keepdim", "max_two_axes", "exp", "log", "sqrt", "tanh",
        "relu", "gelu", "softmax_last_axis", "log_softmax", "cross_entropy_mean",
        "cross_entropy_sum", "layernorm", "embedding", "conv2d_pad1", "maxpool2d", "dropout",
        "concat", "slice", "where_broadcast", "causal_attention"})
    CHECK_MESSAGE(names.count(required), "no harness case named ", required);
}

TEST_CASE("op consistency: the harness catches a wrong gradient") {
  // A deliberately wrong op (forward x^2, backward claims 3x) must fail the check,
  // or the harness could pass anything.
  OpCase wrong{"wrong_square", {InputSpec{{4}, InputSpec::Kind::real, -1, 1, 0, 0}},
               [](const std::vector<Tensor>& x) { return mul(x[0], x[0]); },
               [](const std::vector<Values>& v) {
                 Values out(v[0].size());
                 for (size_t i = 0; i < out.size(); ++i) out[i] = 1.5 * v[0][i] * v[0][i];
                 return out;
               }};
  CHECK_FALSE(check_forward(wrong, cpu_backend()).ok);
  CHECK_FALSE(check_gradients(wrong, cpu_backend()).ok);
}

TEST_CASE("op consistency: a NaN gradient after a finite forward is the report's worst") {
  // sqrt(x * x) at x = 0: a forward of 0, a gradient of inf * 0 = NaN. A caller that reads
  // only `worst` (the reduced-precision checks) must see the NaN, not the forward's 0.
  OpCase nan_grad{"nan_gradient", {InputSpec{{3}, InputSpec::Kind::real, 0, 0, 0, 0}},
                  [](const std::vector<Tensor>& x) { return sqrt(mul(x[0], x[0])); },
                  [](const std::vector<Values>& v) { return Values(v[0].size(), 0.0); }};
  const Report r = check_against_cpu(nan_grad, cpu_backend());
  CHECK_FALSE(r.ok);
  CHECK(std::isnan(r.worst));
}

TEST_CASE("op consistency: the backend comparison runs every case") {
  // The CUDA suite compares each case with the CPU through check_against_cpu; here the
  // CPU against itself must agree exactly, which exercises the same path end to end.
  for (const OpCase& c : all_op_cases()) {
    CAPTURE(c.name);
    Report r = check_against_cpu(c, cpu_backend());
    CHECK_MESSAGE(r.ok, r.detail);
    CHECK(r.worst == 0.0);
  }
}

TEST_CASE("backend: the CPU backend answers its capability and memory queries") {
  Backend& be = cpu_backend();
  for (int k = 0; k < static_cast<int>(OpKind::count_); ++k)
    CHECK_MESSAGE(be.supports(static_cast<OpKind>(k)), op_kind_name(static_cast<OpKind>(k)));
  MemoryInfo m = be.memory_info();
  CHECK(m.total > (size_t{1} << 28));
  CHECK(m.available > 0);
  CHECK(m.available <= m.total);
}

TEST_CASE("conv2d: a batch unfolded in chunks gives its samples' outputs and summed gradients") {
  // The convolution unfolds at most 512 KiB of columns at a time. A 7x7 window over one
  // 32x32 channel unfolds 196 KiB a sample (chunks of 2: 5 samples go as 2, 2, 1) and a
  // 9x9 one 324 KiB (chunks of 1). Each sample alone is one chunk, which the harness checks
  // against finite differences; the batch must give the same output, the same input
  // gradients, and the weight and bias gradients summed over its samples.
  for (int64_t k : {7, 9}) {
    CAPTURE(k);
    const int64_t n = 5, pad = k / 2, size = 32 * 32;
    std::vector<float> xs(n * size), ws(2 * k * k), gs(n * 2 * size);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < ws.size(); ++i) ws[i] = std::cos(0.91f * static_cast<float>(i)) / k;
    for (size_t i = 0; i < gs.size(); ++i) gs[i] = std::sin(1.3f * static_cast<float>(i) + 0.5f);
    Tensor x = Tensor::from_vector(xs, {n, 1, 32, 32}, cpu_backend()).set_requires_grad();
    Tensor w = Tensor::from_vector(ws, {2, 1, k, k}, cpu_backend()).set_requires_grad();
    Tensor b = Tensor::from_vector({0.1f, -0.2f}, {2}, cpu_backend()).set_requires_grad();
    Tensor y = conv2d(x, w, b, 1, pad);
    sum(mul(y, Tensor::from_vector(gs, {n, 2, 32, 32}, cpu_backend()))).backward();
    const std::vector<float> y_all = y.to_vector(), gx_all = x.grad().to_vector();
    const std::vector<float> gw_all = w.grad().to_vector(), gb_all = b.grad().to_vector();
    std::vector<double> gw(ws.size()), gb(2);
    for (int64_t s = 0; s < n; ++s) {
      CAPTURE(s);
      Tensor xi = Tensor::from_vector({xs.begin() + s * size, xs.begin() + (s + 1) * size}, {1, 1, 32, 32}, cpu_backend())
                      .set_requires_grad();
      w.zero_grad();
      b.zero_grad();
      Tensor yi = conv2d(xi, w, b, 1, pad);
      sum(mul(yi, Tensor::from_vector({gs.begin() + s * 2 * size, gs.begin() + (s + 1) * 2 * size},
                                      {1, 2, 32, 32}, cpu_backend())))
          .backward();
      const std::vector<float> yv = yi.to_vector(), gxv = xi.grad().to_vector();
      for (int64_t i = 0; i < 2 * size; ++i) REQUIRE(y_all[s * 2 * size + i] == yv[i]);
      for (int64_t i = 0; i < size; ++i) REQUIRE(gx_all[s * size + i] == gxv[i]);
      const std::vector<float> gwv = w.grad().to_vector(), gbv = b.grad().to_vector();
      for (size_t i = 0; i < gw.size(); ++i) gw[i] += gwv[i];
      for (size_t i = 0; i < 2; ++i) gb[i] += gbv[i];
    }
    // The batch's weight gradient accumulates in float, sample after sample.
    double scale = 0;
    for (double v : gw) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < gw.size(); ++i) CHECK(std::fabs(gw_all[i] - gw[i]) <= 1e-5 * scale);
    for (size_t i = 0; i < 2; ++i) CHECK(std::fabs(gb_all[i] - gb[i]) <= 1e-5 * std::fabs(gb[i]) + 1e-4);
  }
}
