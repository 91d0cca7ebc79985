// Tensors between the CPU and a GPU: Tensor::to both ways with its gradient, rehome of a
// parameter onto the GPU and back, GPU to GPU where two are present, and the registry's
// entry for the GPU. Values are small integers and their products, exact in float32, so
// every comparison is equality.
#include <doctest/doctest.h>

#include <vector>

#include "autograd/graph.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_select.h"
#include "backend/registry.h"
#include "models/models.h"
#include "nn/block.h"
#include "ops/ops.h"

using namespace ht;

namespace {

Backend& gpu(int index = 0) {
  DeviceChoice c;
  c.kind = DeviceKind::cuda;
  c.index = index;
  return backend_for(c);  // registers it, and the GPU-to-GPU copy
}

}  // namespace

TEST_CASE("device to: CPU to GPU and back keeps every value, float32 and int32, views densely") {
  Backend& g = gpu();
  Tensor x = Tensor::from_vector({1, -2, 3, 4, 5, -6}, {2, 3}, cpu_backend());
  Tensor on = x.to(g);
  CHECK(&on.backend() == &g);
  CHECK(on.to(g).impl() == on.impl());  // already there: the tensor itself
  Tensor back = on.to(cpu_backend());
  CHECK(&back.backend() == &cpu_backend());
  CHECK(back.to_vector() == x.to_vector());
  CHECK(transpose(x, 0, 1).to(g).to_vector() == std::vector<float>{1, 4, -2, 5, 3, -6});
  CHECK(transpose(on, 0, 1).to(cpu_backend()).to_vector() == std::vector<float>{1, 4, -2, 5, 3, -6});
  Tensor ids = Tensor::from_ints({0, 95, -7, 1 << 20}, {4}, cpu_backend()).to(g);
  CHECK(ids.to_ints() == std::vector<int32_t>{0, 95, -7, 1 << 20});
}

TEST_CASE("device to: the gradient of a GPU computation comes home to the CPU leaf") {
  Backend& g = gpu();
  Tensor x = Tensor::from_vector({1, 2, 3, 4}, {4}, cpu_backend()).set_requires_grad();
  Tensor w = Tensor::from_vector({2, -1, 3, 1}, {4}, g).set_requires_grad();
  // f = sum(x_gpu * w * x_gpu): df/dx = 2 w x, df/dw = x^2, computed on the GPU.
  Tensor xg = x.to(g);
  sum(mul(mul(xg, w), xg)).to(cpu_backend()).backward();
  REQUIRE(x.grad().defined());
  CHECK(&x.grad().backend() == &cpu_backend());
  CHECK(x.grad().to_vector() == std::vector<float>{4, -4, 18, 8});
  CHECK(&w.grad().backend() == &g);
  CHECK(w.grad().to_vector() == std::vector<float>{1, 4, 9, 16});
}

TEST_CASE("device to: rehome moves a parameter onto the GPU in place, for every handle, and back") {
  Backend& g = gpu();
  Tensor p = Tensor::from_vector({1, 2, 3}, {3}, cpu_backend()).set_requires_grad();
  Tensor alias = p;
  p.rehome(g, false);
  CHECK(&alias.backend() == &g);
  CHECK(alias.to_vector() == std::vector<float>{1, 2, 3});
  sum(mul(p, 3.f)).backward();
  CHECK(&p.grad().backend() == &g);
  p.rehome(cpu_backend(), false);
  CHECK(&alias.backend() == &cpu_backend());
  CHECK(alias.grad().to_vector() == std::vector<float>{3, 3, 3});
}

TEST_CASE("device to: the registry finds the GPU's backend by device, and GPU to GPU copies") {
  Backend& g = gpu();
  CHECK(find_backend(DeviceKind::cuda, 0) == &g);
  CHECK(device_name(g) == "cuda:0");
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) {
    MESSAGE("one GPU: the GPU-to-GPU copy is not exercised");
    return;
  }
  Backend& h = gpu(1);
  Tensor a = Tensor::from_vector({5, 6, 7}, {3}, g).set_requires_grad();
  Tensor b = a.to(h);
  CHECK(&b.backend() == &h);
  CHECK(b.to_vector() == std::vector<float>{5, 6, 7});
  sum(mul(b, b)).to(g).backward();
  CHECK(&a.grad().backend() == &g);
  CHECK(a.grad().to_vector() == std::vector<float>{10, 12, 14});
}

TEST_CASE("device to: a model in host memory evaluates on the GPU block by block, as rank 0 does") {
  // Rank 0 keeps the other stages' weights in host memory and streams them through its
  // GPU to evaluate (nn::Sequential::stream_weights_to): logits within float rounding of
  // the CPU's (the GPU's kernels sum in another order), the weights back where they were
  // and the GPU's copies freed.
  Backend& g = gpu();
  nn::Sequential model = models::build_gpt({.vocab = 16, .context = 8, .layers = 2, .heads = 2, .d_model = 8}, 7);
  std::vector<int32_t> ids;
  for (int i = 0; i < 2 * 8; ++i) ids.push_back(i % 16);
  NoGradGuard no_grad;
  const std::vector<float> want = model.forward(Tensor::from_ints(ids, {2, 8}, cpu_backend())).to_vector();
  std::vector<const void*> storage;
  for (const auto& [name, p] : model.named_parameters()) storage.push_back(p.raw());
  const size_t live = g.allocator().live_bytes();
  model.stream_weights_to(&g);
  Tensor out = model.forward(Tensor::from_ints(ids, {2, 8}, g));
  model.stream_weights_to(nullptr);
  CHECK(&out.backend() == &g);
  const std::vector<float> got = out.to_vector();
  REQUIRE(got.size() == want.size());
  // Logits of a 2-layer model of width 8 with weights of order 0.02-1: well within 1e-4.
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-4));
  out = Tensor();
  CHECK(g.allocator().live_bytes() == live);
  size_t i = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    CHECK(&p.backend() == &cpu_backend());
    CHECK(p.raw() == storage[i++]);
  }
}
