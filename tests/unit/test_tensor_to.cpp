// Tensor::to and the device registry, on the CPU: a second CpuBackend instance stands in
// for another device, so the copy between backends and its backward run here exactly as
// they do between the CPU and a GPU (tests/cuda/test_device_to.cpp runs those).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/graph.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "core/error.h"
#include "models/models.h"
#include "nn/block.h"
#include "ops/ops.h"

using namespace ht;

namespace {

// Another device, as far as tensors can tell: its own backend object and allocator.
CpuBackend& other_device() {
  static CpuBackend be;
  return be;
}

std::vector<float> iota(int n, float start, float step) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(start + step * static_cast<float>(i));
  return v;
}

}  // namespace

TEST_CASE("to: on the tensor's own device it is the tensor itself, and the gradient flows") {
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}, cpu_backend()).set_requires_grad();
  Tensor y = x.to(cpu_backend());
  CHECK(y.impl() == x.impl());
  sum(mul(y, y)).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{2, 4, 6});
}

TEST_CASE("to: a copy onto another backend holds the values there; its backward copies the gradient home") {
  Backend& home = cpu_backend();
  Backend& away = other_device();
  Tensor x = Tensor::from_vector({1, -2, 3, 4, 5, -6}, {2, 3}, home).set_requires_grad();
  Tensor y = x.to(away);
  CHECK(&y.backend() == &away);
  CHECK_FALSE(y.same_storage(x));
  CHECK(y.shape() == x.shape());
  CHECK(y.to_vector() == x.to_vector());
  CHECK(y.requires_grad());
  CHECK(std::string(y.impl()->grad_fn->name) == "to");
  // d/dx sum(y * y * 3) = 6x, computed on `away` and sent back.
  sum(mul(mul(y, y), 3.f)).backward();
  REQUIRE(x.grad().defined());
  CHECK(&x.grad().backend() == &home);
  CHECK(x.grad().to_vector() == std::vector<float>{6, -12, 18, 24, 30, -36});

  // A strided view is copied as its values, densely.
  Tensor t = transpose(Tensor::from_vector(iota(6, 0, 1), {2, 3}, home), 0, 1);  // (3, 2)
  Tensor moved = t.to(away);
  CHECK(moved.is_contiguous());
  CHECK(moved.to_vector() == std::vector<float>{0, 3, 1, 4, 2, 5});
  // int32 tensors travel too, outside autograd.
  Tensor ids = Tensor::from_ints({7, -1, 65536}, {3}, home).to(away);
  CHECK(&ids.backend() == &away);
  CHECK(ids.to_ints() == std::vector<int32_t>{7, -1, 65536});
  CHECK_FALSE(ids.requires_grad());
  // Without recording, nothing is recorded.
  NoGradGuard off;
  CHECK_FALSE(x.to(away).requires_grad());
}

TEST_CASE("to: a graph through to() and back has the gradients of the same graph on one device, and of finite differences") {
  Backend& home = cpu_backend();
  Backend& away = other_device();
  const std::vector<float> xv = {0.3f, -0.8f, 0.5f, 1.1f, -0.2f, 0.7f}, wv = {0.4f, -0.6f, 0.9f, 0.2f, -0.5f, 0.1f};
  const std::vector<float> cv = {1.5f, -0.7f, 0.2f, 0.9f};
  // f(x, w) = sum(tanh(x @ w) * c): x (2, 3) and c at home, w (3, 2) away; the product and
  // tanh run away and the result comes home for the weighting.
  auto f = [&](const Tensor& x, const Tensor& w, bool across) {
    Tensor c = Tensor::from_vector(cv, {2, 2}, home);
    if (!across) return sum(mul(tanh(matmul(x, w)), c));
    return sum(mul(tanh(matmul(x.to(away), w)).to(home), c));
  };
  Tensor x = Tensor::from_vector(xv, {2, 3}, home).set_requires_grad();
  Tensor w = Tensor::from_vector(wv, {3, 2}, away).set_requires_grad();
  f(x, w, true).backward();
  Tensor x1 = Tensor::from_vector(xv, {2, 3}, home).set_requires_grad();
  Tensor w1 = Tensor::from_vector(wv, {3, 2}, home).set_requires_grad();
  f(x1, w1, false).backward();
  CHECK(&w.grad().backend() == &away);
  // The copies move bits and the ops are the same CPU code: equal to the last bit.
  CHECK(x.grad().to_vector() == x1.grad().to_vector());
  CHECK(w.grad().to_vector() == w1.grad().to_vector());

  // Central differences around the float values. f is a sum of 4 terms c * tanh(u), u
  // linear in each x with coefficient w (|w| <= 0.9, |c| <= 1.5, |tanh'''| <= 2), so
  // |f'''| <= 2 terms * 1.5 * 2 * 0.9^3 < 4.4 and the truncation error h^2/6 |f'''| is
  // below 8e-5 at h = 1e-2. Each float evaluation of f (|f| < 6, ulp 4.8e-7) rounds by
  // less than 10 ulps, 5e-6, which the difference divides by 2h: 2.5e-4. Tolerance 1e-3.
  auto f_at = [&](std::vector<float> xs, std::vector<float> ws) {
    NoGradGuard off;
    return static_cast<double>(
        f(Tensor::from_vector(xs, {2, 3}, home), Tensor::from_vector(ws, {3, 2}, away), true).item());
  };
  const double h = 1e-2;
  const std::vector<float> gx = x.grad().to_vector(), gw = w.grad().to_vector();
  for (size_t i = 0; i < xv.size(); ++i) {
    std::vector<float> up = xv, down = xv;
    up[i] += static_cast<float>(h);
    down[i] -= static_cast<float>(h);
    const double fd = (f_at(up, wv) - f_at(down, wv)) / (static_cast<double>(up[i]) - down[i]);
    CHECK(std::abs(fd - gx[i]) < 1e-3);
  }
  for (size_t i = 0; i < wv.size(); ++i) {
    std::vector<float> up = wv, down = wv;
    up[i] += static_cast<float>(h);
    down[i] -= static_cast<float>(h);
    const double fd = (f_at(xv, up) - f_at(xv, down)) / (static_cast<double>(up[i]) - down[i]);
    CHECK(std::abs(fd - gw[i]) < 1e-3);
  }
}

TEST_CASE("to: operands on two devices are refused by the ops, naming both") {
  Tensor a = Tensor::from_vector({1, 2}, {2}, cpu_backend());
  Tensor b = Tensor::from_vector({1, 2}, {2}, other_device());
  CHECK_THROWS_AS(add(a, b), Error);
  CHECK(add(a.to(other_device()), b).to_vector() == std::vector<float>{2, 4});
}

TEST_CASE("rehome: onto another backend in place, for every handle, with its gradient") {
  Tensor t = Tensor::from_vector({1, 2, 3}, {3}, cpu_backend()).set_requires_grad();
  sum(mul(t, 2.f)).backward();
  Tensor alias = t;
  t.rehome(other_device(), false);
  CHECK(&alias.backend() == &other_device());
  CHECK(alias.to_vector() == std::vector<float>{1, 2, 3});
  CHECK(&t.grad().backend() == &other_device());
  CHECK(t.grad().to_vector() == std::vector<float>{2, 2, 2});
  CHECK(t.requires_grad());
  t.rehome(cpu_backend(), false);
  CHECK(&alias.backend() == &cpu_backend());
  CHECK(alias.to_vector() == std::vector<float>{1, 2, 3});
}

TEST_CASE("registry: the CPU is always there; lookups by device; the run's device is set once") {
  CHECK(find_backend(DeviceKind::cpu, 0) == &cpu_backend());
  CHECK(&backend_at(DeviceKind::cpu, 0) == &cpu_backend());
  CHECK(device_name(cpu_backend()) == "cpu");
  CHECK(find_backend(DeviceKind::cuda, 7) == nullptr);
  try {
    backend_at(DeviceKind::cuda, 7);
    FAIL("no error for an unregistered device");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("cuda:7") != std::string::npos);
    CHECK(msg.find("this process has cpu") != std::string::npos);
  }
  // A CPU backend is not a GPU, and one place holds one backend.
  CHECK_THROWS_AS(register_backend(DeviceKind::cuda, 0, other_device()), Error);
  CHECK_THROWS_AS(register_backend(DeviceKind::cpu, 0, other_device()), Error);
  register_backend(DeviceKind::cpu, 0, cpu_backend());  // again, the same: nothing happens
  CHECK_THROWS_AS(set_run_device(other_device()), Error);  // never registered
  CHECK(&run_device() == &cpu_backend());
  set_run_device(cpu_backend());
  set_run_device(cpu_backend());  // the same again: nothing happens
  CHECK(&run_device() == &cpu_backend());
}

TEST_CASE("copy_between: host to host within one backend and across two") {
  std::vector<float> src = {1.5f, -2.f, 3.25f}, dst(3, 0.f);
  Tensor a = Tensor::from_vector(src, {3}, cpu_backend());
  Tensor b = Tensor::zeros({3}, other_device());
  copy_between(other_device(), b.raw(), cpu_backend(), a.raw(), 3 * sizeof(float));
  CHECK(b.to_vector() == src);
  Tensor c = Tensor::zeros({3}, cpu_backend());
  copy_between(cpu_backend(), c.raw(), cpu_backend(), a.raw(), 3 * sizeof(float));
  CHECK(c.to_vector() == src);
  CHECK_THROWS_AS(copy_between(cpu_backend(), c.raw(), cpu_backend(), a.raw(), 5), Error);
}

TEST_CASE("streamed weights: a model in host memory evaluates on another device, block by block") {
  // Rank 0 keeps the other stages' weights in host memory and evaluates through its device
  // (nn::Sequential::stream_weights_to): the same logits as the model on one device, bit
  // for bit, and afterwards every weight where it was and the device's copies gone.
  nn::Sequential model = models::build_gpt({.vocab = 16, .context = 8, .layers = 2, .heads = 2, .d_model = 8}, 7);
  std::vector<int32_t> ids;
  for (int i = 0; i < 2 * 8; ++i) ids.push_back(i % 16);
  const Tensor host_ids = Tensor::from_ints(ids, {2, 8}, cpu_backend());
  const Tensor device_ids = Tensor::from_ints(ids, {2, 8}, other_device());
  const std::vector<nn::NamedTensor> before = model.named_parameters();
  std::vector<const void*> storage;
  for (const auto& [name, p] : before) storage.push_back(p.raw());
  model.stream_weights_to(&other_device());
  // With autograd on it refuses: a graph would hold the copies.
  CHECK_THROWS_WITH_AS(model.forward(device_ids), doctest::Contains("expected an evaluation"), Error);
  {
    NoGradGuard no_grad;
    model.stream_weights_to(nullptr);
    const std::vector<float> want = model.forward(host_ids).to_vector();
    // Without streaming the first op meets weights on another device and says so.
    CHECK_THROWS_WITH_AS(model.forward(device_ids), doctest::Contains("expected both on one device"), Error);
    const size_t live = other_device().allocator().live_bytes();
    model.stream_weights_to(&other_device());
    Tensor out = model.forward(device_ids);
    CHECK(&out.backend() == &other_device());
    CHECK(out.to_vector() == want);
    out = Tensor();
    CHECK(other_device().allocator().live_bytes() == live);  // every copy dropped
  }
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(&before[i].second.backend() == &cpu_backend());
    CHECK(before[i].second.raw() == storage[i]);
  }
  model.stream_weights_to(nullptr);
}
