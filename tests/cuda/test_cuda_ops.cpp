// Every op case of the harness on GPU 0: against the CPU backend on the same inputs,
// against the double-precision reference, and its gradients against finite differences;
// plus the paths the harness does not reach (an empty GEMM sum, the device's input checks),
// and the primitives behind conv2d, maxpool2d, attention, the optimisers and the
// all-reduce called directly against the CPU's, host staging's pinned memory, and the
// weighted all-reduce of GPU tensors on two in-process ranks (tests/harness/pair_comm.h).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "ops/ops.h"
#include "tests/harness/consistency.h"
#include "tests/harness/pair_comm.h"

using namespace ht;
using namespace ht::harness;

namespace {
cuda::CudaBackend& gpu() { return cuda::cuda_backend(0); }
}  // namespace

TEST_CASE("cuda ops: every case matches the CPU, its reference and finite differences") {
  for (const OpCase& c : all_op_cases()) {
    CAPTURE(c.name);
    for (uint64_t seed : {1u, 2u}) {
      Report vs_cpu = check_against_cpu(c, gpu(), seed);
      CHECK_MESSAGE(vs_cpu.ok, vs_cpu.detail);
      Report f = check_forward(c, gpu(), seed);
      CHECK_MESSAGE(f.ok, f.detail);
      Report g = check_gradients(c, gpu(), seed);
      CHECK_MESSAGE(g.ok, g.detail);
      MESSAGE(c.name << " seed " << seed << ": vs cpu " << vs_cpu.worst << ", forward "
                     << f.worst << ", gradient " << g.worst);
    }
  }
  gpu().synchronize();
}

TEST_CASE("cuda ops: a GEMM with an empty sum leaves beta * C") {
  // C (2, 3) = A (2, 0) @ B (0, 3) + beta * C: cuBLAS is called with k = 0.
  Tensor c = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, gpu());
  Tensor none = Tensor::zeros({1}, gpu());
  for (float beta : {0.5f, 0.f}) {
    GemmArgs g;
    g.m = 2, g.n = 3, g.k = 0;
    g.beta = beta;
    g.a = none.data(), g.b = none.data(), g.c = c.data();
    g.lda = 0, g.ldb = 3, g.ldc = 3;
    std::vector<float> before = c.to_vector();
    gpu().gemm(g);
    std::vector<float> after = c.to_vector();
    for (size_t i = 0; i < after.size(); ++i) CHECK(after[i] == before[i] * beta);
  }
}

TEST_CASE("cuda ops: a label or id out of range is an error naming the op, after which the "
          "device works on") {
  Tensor logits = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3}, gpu());
  Tensor bad_labels = Tensor::from_ints({0, 3}, {2}, gpu());
  CHECK_THROWS_WITH_AS(cross_entropy(logits, bad_labels).to_vector(),
                       doctest::Contains("cross_entropy on cuda:0: a label is out of range; "
                                         "expected 0 <= label < 3"),
                       Error);
  Tensor table = Tensor::from_vector({1, 2, 3, 4}, {2, 2}, gpu());
  Tensor bad_ids = Tensor::from_ints({1, -1}, {2}, gpu());
  CHECK_THROWS_WITH_AS(embedding(table, bad_ids).to_vector(),
                       doctest::Contains("embedding on cuda:0: an id is out of range; expected "
                                         "0 <= id < 2"),
                       Error);
  // The flags were cleared: good input passes, and its values are right.
  Tensor ids = Tensor::from_ints({1, 0}, {2}, gpu());
  CHECK(embedding(table, ids).to_vector() == std::vector<float>{3, 4, 1, 2});
  CHECK_NOTHROW(gpu().synchronize());
}

// ---- the primitives behind conv2d, maxpool2d, attention, the optimisers and the
// all-reduce, called directly on the GPU and on the CPU with the same inputs.

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double error_vs(const Tensor& got, const Tensor& want) {
  std::vector<float> a = got.to_vector(), b = want.to_vector();
  return normalized_error(std::vector<double>(a.begin(), a.end()),
                          std::vector<double>(b.begin(), b.end()));
}

// The same values on the GPU and on the CPU.
struct Pair {
  Tensor gpu, cpu;
  Pair(const std::vector<float>& v, const Shape& s)
      : gpu(Tensor::from_vector(v, s, ht::cuda::cuda_backend(0))),
        cpu(Tensor::from_vector(v, s, cpu_backend())) {}
  Pair(const Shape& s, float fill)
      : gpu(Tensor::full(s, fill, ht::cuda::cuda_backend(0))),
        cpu(Tensor::full(s, fill, cpu_backend())) {}
  double error() const { return error_vs(gpu, cpu); }
};

// fp32 sums of up to a few thousand terms in another order: well under 1e-5 of the
// largest value (the bound on a GPU is 1e-4).
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("cuda ops: cuDNN's convolutions match the CPU's im2col and gemm, forward and both "
          "backward passes") {
  struct Geometry {
    Window2d g;
    int64_t out_ch;
  };
  for (const Geometry& c : {Geometry{{4, 3, 28, 28, 5, 5, 1, 2}, 8},
                            Geometry{{2, 16, 14, 13, 3, 3, 2, 1}, 32},
                            Geometry{{3, 1, 9, 9, 9, 9, 1, 0}, 4},
                            Geometry{{1, 2, 6, 6, 1, 1, 1, 0}, 3}}) {
    const Window2d& g = c.g;
    CAPTURE(g.c);
    CAPTURE(g.kh);
    const Shape xs{g.n, g.c, g.h, g.w}, ws{c.out_ch, g.c, g.kh, g.kw};
    const Shape ys{g.n, c.out_ch, g.out_h(), g.out_w()};
    Pair x(random_values(static_cast<size_t>(numel(xs)), 1), xs);
    Pair w(random_values(static_cast<size_t>(numel(ws)), 2), ws);
    Pair gy(random_values(static_cast<size_t>(numel(ys)), 3), ys);
    Pair y(ys, 9.f), gx(xs, 9.f), gw(ws, 9.f);  // every output is overwritten
    for (Backend* be : {static_cast<Backend*>(&gpu()), &cpu_backend()}) {
      const bool on_gpu = be == &gpu();
      be->conv2d((on_gpu ? x.gpu : x.cpu).data(), (on_gpu ? w.gpu : w.cpu).data(),
                 (on_gpu ? y.gpu : y.cpu).data(), g, c.out_ch);
      be->conv2d_backward_data((on_gpu ? gy.gpu : gy.cpu).data(), (on_gpu ? w.gpu : w.cpu).data(),
                               (on_gpu ? gx.gpu : gx.cpu).data(), g, c.out_ch);
      be->conv2d_backward_filter((on_gpu ? x.gpu : x.cpu).data(), (on_gpu ? gy.gpu : gy.cpu).data(),
                                 (on_gpu ? gw.gpu : gw.cpu).data(), g, c.out_ch);
    }
    CHECK(y.error() < kTol);
    CHECK(gx.error() < kTol);
    CHECK(gw.error() < kTol);
  }
}

TEST_CASE("cuda ops: max pooling through cuDNN and through the argmax kernels match the CPU "
          "exactly") {
  const Window2d g{3, 4, 11, 10, 3, 3, 2, 0};
  const Shape xs{g.n, g.c, g.h, g.w}, ys{g.n, g.c, g.out_h(), g.out_w()};
  // Distinct values: a window's maximum is unique, so every way routes alike.
  std::vector<float> xv(static_cast<size_t>(numel(xs)));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>((i * 7919) % xv.size()) * 0.01f;
  Pair x(xv, xs), gy(random_values(static_cast<size_t>(numel(ys)), 4), ys);
  Pair y(ys, 9.f), gx(xs, 9.f);
  Tensor argmax = Tensor::empty(ys, DType::i32, cpu_backend());
  cpu_backend().maxpool2d(x.cpu.data(), y.cpu.data(), argmax.data_i32(), g);
  cpu_backend().maxpool2d_backward(nullptr, nullptr, gy.cpu.data(), argmax.data_i32(),
                                   gx.cpu.data(), g);
  // cuDNN (no argmax)
  gpu().maxpool2d(x.gpu.data(), y.gpu.data(), nullptr, g);
  gpu().maxpool2d_backward(x.gpu.data(), y.gpu.data(), gy.gpu.data(), nullptr, gx.gpu.data(), g);
  CHECK(y.gpu.to_vector() == y.cpu.to_vector());
  CHECK(gx.gpu.to_vector() == gx.cpu.to_vector());
  // The window kernels (argmax)
  Pair y2(ys, 9.f), gx2(xs, 9.f);
  Tensor gpu_argmax = Tensor::empty(ys, DType::i32, gpu());
  gpu().maxpool2d(x.gpu.data(), y2.gpu.data(), gpu_argmax.data_i32(), g);
  gpu().maxpool2d_backward(nullptr, nullptr, gy.gpu.data(), gpu_argmax.data_i32(),
                           gx2.gpu.data(), g);
  CHECK(y2.gpu.to_vector() == y.cpu.to_vector());
  CHECK(gx2.gpu.to_vector() == gx.cpu.to_vector());
  CHECK(!gpu().maxpool2d_keeps_argmax());
}

TEST_CASE("cuda ops: max pooling routes a tied window's gradient as the CPU does (to its first "
          "maximum)") {
  // After a ReLU many windows hold equal maxima (zeros; here also equal positive values),
  // and cuDNN documents no rule for which one takes the gradient. The CPU gives it to the
  // first in window order; the GPU must too, through cuDNN and through the argmax kernels.
  const Window2d g{2, 3, 8, 9, 2, 2, 2, 0};
  const Shape xs{g.n, g.c, g.h, g.w}, ys{g.n, g.c, g.out_h(), g.out_w()};
  std::vector<float> xv(static_cast<size_t>(numel(xs)));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = (i / 5) % 3 == 0 ? 0.5f : 0.f;
  Pair x(xv, xs), gy(random_values(static_cast<size_t>(numel(ys)), 5), ys);
  Pair gx(xs, 9.f), gx2(xs, 9.f), y(ys, 9.f), y2(ys, 9.f);
  Tensor argmax = Tensor::empty(ys, DType::i32, cpu_backend());
  cpu_backend().maxpool2d(x.cpu.data(), y.cpu.data(), argmax.data_i32(), g);
  cpu_backend().maxpool2d_backward(nullptr, nullptr, gy.cpu.data(), argmax.data_i32(), gx.cpu.data(), g);
  gpu().maxpool2d(x.gpu.data(), y.gpu.data(), nullptr, g);
  gpu().maxpool2d_backward(x.gpu.data(), y.gpu.data(), gy.gpu.data(), nullptr, gx.gpu.data(), g);
  CHECK(y.gpu.to_vector() == y.cpu.to_vector());
  CHECK_MESSAGE(gx.gpu.to_vector() == gx.cpu.to_vector(),
                "cuDNN routed a tied window's gradient elsewhere than the CPU's first maximum");
  Tensor gpu_argmax = Tensor::empty(ys, DType::i32, gpu());
  gpu().maxpool2d(x.gpu.data(), y2.gpu.data(), gpu_argmax.data_i32(), g);
  gpu().maxpool2d_backward(nullptr, nullptr, gy.gpu.data(), gpu_argmax.data_i32(), gx2.gpu.data(), g);
  CHECK(y2.gpu.to_vector() == y.cpu.to_vector());
  CHECK(gx2.gpu.to_vector() == gx.cpu.to_vector());
}

TEST_CASE("cuda ops: the fused causal attention matches the CPU's composition, forward, "
          "log-sum-exp and backward") {
  for (int64_t t : {1, 31, 33, 100})
    for (int64_t d : {8, 64, 128}) {
      CAPTURE(t);
      CAPTURE(d);
      const int64_t bh = 3;
      const Shape s{bh, t, d};
      const float scale = 1.f / std::sqrt(static_cast<float>(d));
      Pair q(random_values(static_cast<size_t>(bh * t * d), 1, -2, 2), s);
      Pair k(random_values(static_cast<size_t>(bh * t * d), 2, -2, 2), s);
      Pair v(random_values(static_cast<size_t>(bh * t * d), 3), s);
      Pair go(random_values(static_cast<size_t>(bh * t * d), 4), s);
      Pair o(s, 9.f), lse({bh, t}, 9.f), gq(s, 9.f), gk(s, 9.f), gv(s, 9.f);
      cpu_backend().causal_attention(q.cpu.data(), k.cpu.data(), v.cpu.data(), o.cpu.data(),
                                     lse.cpu.data(), bh, t, d, scale);
      gpu().causal_attention(q.gpu.data(), k.gpu.data(), v.gpu.data(), o.gpu.data(),
                             lse.gpu.data(), bh, t, d, scale);
      cpu_backend().causal_attention_backward(q.cpu.data(), k.cpu.data(), v.cpu.data(),
                                              o.cpu.data(), lse.cpu.data(), go.cpu.data(),
                                              gq.cpu.data(), gk.cpu.data(), gv.cpu.data(), bh, t,
                                              d, scale);
      gpu().causal_attention_backward(q.gpu.data(), k.gpu.data(), v.gpu.data(), o.gpu.data(),
                                      lse.gpu.data(), go.gpu.data(), gq.gpu.data(),
                                      gk.gpu.data(), gv.gpu.data(), bh, t, d, scale);
      CHECK(o.error() < kTol);
      CHECK(lse.error() < kTol);
      CHECK(gq.error() < kTol);
      CHECK(gk.error() < kTol);
      CHECK(gv.error() < kTol);
    }
}

TEST_CASE("cuda ops: a head larger than the fused kernel takes is composed, matching the CPU") {
  const int64_t d = gpu().attention_max_head() + 3;
  const Shape s{1, 2, 5, d};
  std::vector<Tensor> g(3), c(3);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> vals = random_values(static_cast<size_t>(numel(s)), 20 + i);
    g[i] = Tensor::from_vector(vals, s, gpu());
    c[i] = Tensor::from_vector(vals, s, cpu_backend());
  }
  CHECK(error_vs(causal_attention(g[0], g[1], g[2]), causal_attention(c[0], c[1], c[2])) < kTol);
}

TEST_CASE("cuda ops: the multi-tensor AdamW and SGD updates match the CPU's per-tensor ones") {
  const std::vector<int64_t> sizes{1, 300, 4097, 65536, 7};
  std::vector<Pair> p, g, m, v, b;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t n = static_cast<size_t>(sizes[i]);
    p.emplace_back(random_values(n, 10 + i), Shape{sizes[i]});
    g.emplace_back(random_values(n, 20 + i), Shape{sizes[i]});
    m.emplace_back(random_values(n, 30 + i, -0.1f, 0.1f), Shape{sizes[i]});
    v.emplace_back(random_values(n, 40 + i, 0.f, 0.01f), Shape{sizes[i]});
    b.emplace_back(random_values(n, 50 + i), Shape{sizes[i]});
  }
  auto ptrs = [](std::vector<Pair>& ts) {
    std::vector<float*> out;
    for (Pair& t : ts) out.push_back(t.gpu.data());
    return out;
  };
  const int count = static_cast<int>(sizes.size());
  AdamWArgs a{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.271f, 0.00399f};
  std::vector<float*> pp = ptrs(p), gp = ptrs(g), mp = ptrs(m), vp = ptrs(v), bp = ptrs(b);
  std::vector<const float*> gc(gp.begin(), gp.end());
  gpu().adamw_multi(pp.data(), gc.data(), mp.data(), vp.data(), sizes.data(), count, a);
  for (size_t i = 0; i < sizes.size(); ++i)
    cpu_backend().adamw(p[i].cpu.data(), g[i].cpu.data(), m[i].cpu.data(), v[i].cpu.data(),
                        sizes[i], a);
  SgdArgs s{0.05f, 0.9f, 1e-4f, true, false};
  gpu().sgd_multi(pp.data(), gc.data(), bp.data(), sizes.data(), count, s);
  for (size_t i = 0; i < sizes.size(); ++i)
    cpu_backend().sgd(p[i].cpu.data(), g[i].cpu.data(), b[i].cpu.data(), sizes[i], s);
  for (size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(sizes[i]);
    // One update's few roundings (a square root, a division): far below 1e-5.
    CHECK(p[i].error() < kTol);
    CHECK(m[i].error() < kTol);
    CHECK(v[i].error() < kTol);
    CHECK(b[i].error() < kTol);
  }
}

TEST_CASE("cuda ops: axpy at alpha 1 sums exactly as the CPU does") {
  std::vector<float> y0 = random_values(100000, 61);
  Pair x(random_values(100000, 60), {100000}), y(y0, {100000});
  gpu().axpy(1.f, x.gpu.data(), y.gpu.data(), 100000);
  cpu_backend().axpy(1.f, x.cpu.data(), y.cpu.data(), 100000);
  CHECK(y.gpu.to_vector() == y.cpu.to_vector());
  CHECK(y.cpu.to_vector() != y0);
}

TEST_CASE("cuda memory: host staging on the GPU is pinned host memory, counted apart, that "
          "kernels and copies reach") {
  Allocator& a = gpu().allocator();
  const size_t before = a.staged_bytes(), live = a.live_bytes();
  Tensor t;
  {
    Allocator::HostStaging staging;
    t = Tensor::empty({1000}, DType::f32, gpu(), "staging test");
  }
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, t.data()) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  CHECK(a.staged(t.data()));
  CHECK(a.staged_bytes() >= before + 4000);
  CHECK(a.live_bytes() == live);
  gpu().fill(t.data(), 2.5f, 1000);  // a kernel writes it in place
  std::vector<float> got = t.to_vector();
  CHECK(got == std::vector<float>(1000, 2.5f));
  Tensor d = Tensor::from_vector(random_values(1000, 7), {1000}, gpu());
  gpu().axpy(1.f, t.data(), d.data(), 1000);  // and reads it
  gpu().synchronize();
  t = Tensor();
  CHECK(a.staged_bytes() == before);
}

TEST_CASE("cuda ops: the weighted all-reduce of GPU tensors, staged through pinned host "
          "buffers and summed on the device, gives the CPU's sums exactly") {
  std::vector<Tensor> ga, gb, ca, cb;
  // The last spans the backend's 4 MiB staging chunks.
  for (int64_t n : {int64_t{1}, int64_t{10}, int64_t{3000}, (int64_t{1} << 20) + 7}) {
    std::vector<float> a = random_values(static_cast<size_t>(n), 90);
    std::vector<float> b = random_values(static_cast<size_t>(n), 91);
    ga.push_back(Tensor::from_vector(a, {n}, gpu()));
    gb.push_back(Tensor::from_vector(b, {n}, gpu()));
    ca.push_back(Tensor::from_vector(a, {n}, cpu_backend()));
    cb.push_back(Tensor::from_vector(b, {n}, cpu_backend()));
  }
  const size_t staged = gpu().allocator().staged_bytes();
  pair_allreduce(ga, gb);
  pair_allreduce(ca, cb);
  for (size_t t = 0; t < ga.size(); ++t) {
    CAPTURE(t);
    CHECK(ga[t].to_vector() == ca[t].to_vector());
    CHECK(gb[t].to_vector() == ca[t].to_vector());
  }
  CHECK(gpu().allocator().staged_bytes() == staged);  // every staging buffer returned
}
