// The CPU backend's composed primitives (attention, convolution, pooling without argmax,
// the multi-tensor updates, axpy) against what they compose, the allocator's host staging
// hook, and the weighted all-reduce's sums through axpy on two in-process ranks. The
// harness (test_op_consistency) checks the ops built on them against double-precision
// references and finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "backend/allocator.h"
#include "backend/backend.h"
#include "ops/ops.h"
#include "tests/harness/pair_comm.h"

using namespace ht;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The composition ops/attention_ops.cpp ran before the backend had an attention
// primitive: the CPU primitive must give exactly its results, forward and backward.
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t t = q.shape()[2], d = q.shape()[3];
  std::vector<float> keep(t * t);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) keep[i * t + j] = j <= i ? 1.f : 0.f;
  Tensor mask = Tensor::from_vector(keep, {t, t}, q.backend());
  Tensor minus_inf = Tensor::full({}, -std::numeric_limits<float>::infinity(), q.backend());
  Tensor scores = mul(matmul(q, transpose(k, -1, -2)), 1.f / std::sqrt(static_cast<float>(d)));
  return matmul(softmax(where(mask, scores, minus_inf), -1), v);
}

}  // namespace

TEST_CASE(
    "backend: the CPU's causal attention is the composition, bit for bit, with its "
    "row log-sum-exps") {
  Backend& be = cpu_backend();
  const Shape shape{2, 3, 7, 5};
  const size_t n = 2 * 3 * 7 * 5;
  std::vector<Tensor> fused(3), comp(3);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> values = random_values(n, 11 + i, -2.f, 2.f);
    fused[i] = Tensor::from_vector(values, shape, be).set_requires_grad();
    comp[i] = Tensor::from_vector(values, shape, be).set_requires_grad();
  }
  Tensor w = Tensor::from_vector(random_values(n, 99), shape, be);
  Tensor of = causal_attention(fused[0], fused[1], fused[2]);
  Tensor oc = composed(comp[0], comp[1], comp[2]);
  CHECK(of.to_vector() == oc.to_vector());
  sum(mul(of, w)).backward();
  sum(mul(oc, w)).backward();
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(fused[i].grad().to_vector() == comp[i].grad().to_vector());
  }

  // lse against double precision from the same inputs.
  const int64_t bh = 6, t = 7, d = 5;
  const float scale = 1.f / std::sqrt(5.f);
  std::vector<float> q = fused[0].to_vector(), k = fused[1].to_vector(), v = fused[2].to_vector();
  Tensor o = Tensor::empty(shape, DType::f32, be), lse = Tensor::empty({bh, t}, DType::f32, be);
  be.causal_attention(fused[0].data(), fused[1].data(), fused[2].data(), o.data(), lse.data(), bh,
                      t, d, scale);
  std::vector<float> got = lse.to_vector();
  for (int64_t h = 0; h < bh; ++h)
    for (int64_t i = 0; i < t; ++i) {
      double m = -1e300, s = 0;
      std::vector<double> row;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e)
          dot += double{q[(h * t + i) * d + e]} * k[(h * t + j) * d + e];
        row.push_back(dot * scale);
        m = std::max(m, row.back());
      }
      for (double r : row) s += std::exp(r - m);
      CHECK(got[h * t + i] == doctest::Approx(m + std::log(s)).epsilon(1e-5));
    }
}

TEST_CASE(
    "backend: CPU max pooling without argmax gives the argmax path's output and "
    "gradient exactly, ties going to the first maximum") {
  Backend& be = cpu_backend();
  const Window2d g{2, 3, 7, 6, 3, 3, 2, 0};  // overlapping 3x3 windows, stride 2
  const int64_t in = 2 * 3 * 7 * 6, out = 2 * 3 * g.out_h() * g.out_w();
  std::vector<float> xv = random_values(static_cast<size_t>(in), 5);
  for (size_t i = 0; i < xv.size(); i += 4) xv[i] = 0.f;  // ties, as after a relu
  Tensor x = Tensor::from_vector(xv, {2, 3, 7, 6}, be);
  Tensor gy = Tensor::from_vector(random_values(static_cast<size_t>(out), 6), {out}, be);
  Tensor y1 = Tensor::empty({out}, DType::f32, be), y2 = Tensor::empty({out}, DType::f32, be);
  Tensor argmax = Tensor::empty({out}, DType::i32, be);
  be.maxpool2d(x.data(), y1.data(), argmax.data_i32(), g);
  be.maxpool2d(x.data(), y2.data(), nullptr, g);
  CHECK(y1.to_vector() == y2.to_vector());
  Tensor g1 = Tensor::empty({in}, DType::f32, be), g2 = Tensor::empty({in}, DType::f32, be);
  be.maxpool2d_backward(nullptr, nullptr, gy.data(), argmax.data_i32(), g1.data(), g);
  be.maxpool2d_backward(x.data(), y2.data(), gy.data(), nullptr, g2.data(), g);
  CHECK(g1.to_vector() == g2.to_vector());

  // A window of equal values routes its gradient to its first pixel, both ways.
  const Window2d flat{1, 1, 4, 4, 2, 2, 2, 0};
  Tensor zeros = Tensor::zeros({16}, be), gy4 = Tensor::from_vector({1, 2, 3, 4}, {4}, be);
  Tensor y4 = Tensor::empty({4}, DType::f32, be), a4 = Tensor::empty({4}, DType::i32, be);
  be.maxpool2d(zeros.data(), y4.data(), a4.data_i32(), flat);
  CHECK(a4.to_ints() == std::vector<int32_t>{0, 2, 8, 10});
  const std::vector<float> first{1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0};
  Tensor gx4 = Tensor::empty({16}, DType::f32, be);
  be.maxpool2d_backward(zeros.data(), y4.data(), gy4.data(), nullptr, gx4.data(), flat);
  CHECK(gx4.to_vector() == first);
}

TEST_CASE("backend: the CPU's convolution primitives match a direct convolution") {
  Backend& be = cpu_backend();
  const Window2d g{3, 2, 6, 5, 3, 2, 2, 1};
  const int64_t oc = 4, oh = g.out_h(), ow = g.out_w();
  std::vector<float> x = random_values(3 * 2 * 6 * 5, 1), w = random_values(oc * 2 * 3 * 2, 2);
  std::vector<float> gy = random_values(static_cast<size_t>(3 * oc * oh * ow), 3);
  Tensor tx = Tensor::from_vector(x, {3, 2, 6, 5}, be),
         tw = Tensor::from_vector(w, {oc, 2, 3, 2}, be);
  Tensor tgy = Tensor::from_vector(gy, {3, oc, oh, ow}, be);
  Tensor y = Tensor::empty({3, oc, oh, ow}, DType::f32, be);
  Tensor gx = Tensor::full({3, 2, 6, 5}, 7.f, be), gw = Tensor::full({oc, 2, 3, 2}, 7.f, be);
  be.conv2d(tx.data(), tw.data(), y.data(), g, oc);
  be.conv2d_backward_data(tgy.data(), tw.data(), gx.data(), g, oc);  // overwrites the 7s
  be.conv2d_backward_filter(tx.data(), tgy.data(), gw.data(), g, oc);
  std::vector<double> ry(y.numel()), rgx(gx.numel()), rgw(gw.numel());
  auto xi = [&](int64_t n, int64_t c, int64_t i, int64_t j) {
    return ((n * 2 + c) * 6 + i) * 5 + j;
  };
  auto wi = [&](int64_t o, int64_t c, int64_t a, int64_t b) {
    return ((o * 2 + c) * 3 + a) * 2 + b;
  };
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo) {
          const int64_t yi = ((n * oc + o) * oh + yo) * ow + xo;
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t a = 0; a < 3; ++a)
              for (int64_t b = 0; b < 2; ++b) {
                const int64_t i = yo * 2 - 1 + a, j = xo * 2 - 1 + b;
                if (i < 0 || i >= 6 || j < 0 || j >= 5) continue;
                ry[yi] += double{x[xi(n, c, i, j)]} * w[wi(o, c, a, b)];
                rgx[xi(n, c, i, j)] += double{gy[yi]} * w[wi(o, c, a, b)];
                rgw[wi(o, c, a, b)] += double{gy[yi]} * x[xi(n, c, i, j)];
              }
        }
  auto close = [](const std::vector<float>& got, const std::vector<double>& want) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    return worst;
  };
  // Sums of at most 3 * 2 * 3 * 2 products of values below 1: float rounding stays near 1e-6.
  CHECK(close(y.to_vector(), ry) < 1e-5);
  CHECK(close(gx.to_vector(), rgx) < 1e-5);
  CHECK(close(gw.to_vector(), rgw) < 1e-5);
}

TEST_CASE("backend: the default multi-tensor updates are the per-tensor updates, exactly") {
  Backend& be = cpu_backend();
  const std::vector<int64_t> sizes{5, 17, 1};
  auto make = [&](uint32_t seed) {
    std::vector<Tensor> out;
    for (size_t i = 0; i < sizes.size(); ++i)
      out.push_back(Tensor::from_vector(random_values(static_cast<size_t>(sizes[i]), seed + i),
                                        {sizes[i]}, be));
    return out;
  };
  auto ptrs = [](std::vector<Tensor>& ts) {
    std::vector<float*> p;
    for (Tensor& t : ts) p.push_back(t.data());
    return p;
  };
  AdamWArgs a{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.19f, 0.002f};
  std::vector<Tensor> p1 = make(1), p2 = make(1), g = make(2), m1 = make(3), m2 = make(3);
  std::vector<Tensor> v1 = make(4), v2 = make(4);
  for (auto* vs : {&v1, &v2})  // second moments are squares
    for (Tensor& t : *vs) t = mul(t, t);
  std::vector<float*> pp = ptrs(p2), gp = ptrs(g), mp = ptrs(m2), vp = ptrs(v2);
  std::vector<const float*> gc(gp.begin(), gp.end());
  be.adamw_multi(pp.data(), gc.data(), mp.data(), vp.data(), sizes.data(), 3, a);
  for (size_t i = 0; i < sizes.size(); ++i) {
    be.adamw(p1[i].data(), g[i].data(), m1[i].data(), v1[i].data(), sizes[i], a);
    CHECK(p1[i].to_vector() == p2[i].to_vector());
    CHECK(m1[i].to_vector() == m2[i].to_vector());
    CHECK(v1[i].to_vector() == v2[i].to_vector());
  }
  SgdArgs s{0.1f, 0.9f, 0.01f, true, false};
  std::vector<Tensor> b1 = make(5), b2 = make(5);
  std::vector<float*> bp = ptrs(b2);
  be.sgd_multi(pp.data(), gc.data(), bp.data(), sizes.data(), 3, s);
  for (size_t i = 0; i < sizes.size(); ++i) {
    be.sgd(p1[i].data(), g[i].data(), b1[i].data(), sizes[i], s);
    CHECK(p1[i].to_vector() == p2[i].to_vector());
    CHECK(b1[i].to_vector() == b2[i].to_vector());
  }
}

TEST_CASE("backend: axpy adds exactly x + y at alpha 1, and alpha * x otherwise") {
  Backend& be = cpu_backend();
  std::vector<float> x = random_values(1000, 8), y = random_values(1000, 9);
  Tensor tx = Tensor::from_vector(x, {1000}, be), ty = Tensor::from_vector(y, {1000}, be);
  be.axpy(1.f, tx.data(), ty.data(), 1000);
  std::vector<float> got = ty.to_vector();
  for (size_t i = 0; i < x.size(); ++i) CHECK(got[i] == y[i] + x[i]);
  be.axpy(-0.5f, tx.data(), ty.data(), 1000);
  std::vector<float> got2 = ty.to_vector();
  for (size_t i = 0; i < x.size(); ++i) CHECK(got2[i] == doctest::Approx(got[i] - 0.5f * x[i]));
}

namespace {
// Host staging hooks over malloc that count their calls (and, with `reuses`, a reuse step).
void counting_staging(Allocator& a, int& allocs, int& frees, int* reuses = nullptr) {
  std::function<void()> reuse;
  if (reuses) reuse = [reuses] { ++*reuses; };
  a.set_host_staging(
      [&allocs](size_t n) {
        ++allocs;
        return std::malloc(n);
      },
      [&frees](void* p) {
        ++frees;
        std::free(p);
      },
      std::move(reuse));
}
}  // namespace

TEST_CASE("allocator: host staging blocks come from the hook, counted apart from the cap") {
  int hook_allocs = 0, hook_frees = 0, raw_allocs = 0;
  Allocator a(
      "test",
      [&](size_t n) {
        ++raw_allocs;
        return std::malloc(n);
      },
      [](void* p) { std::free(p); });
  counting_staging(a, hook_allocs, hook_frees);
  a.set_cap(1024);
  void* dev = a.allocate(512, "device");
  void* host = nullptr;
  {
    Allocator::HostStaging staging;
    host = a.allocate(4096, "staging");  // above the cap: staging is outside it
  }
  CHECK(raw_allocs == 1);
  CHECK(hook_allocs == 1);
  CHECK(a.staged(host));
  CHECK(!a.staged(dev));
  CHECK(a.live_bytes() == 512);
  CHECK(a.staged_bytes() == 4096);
  a.deallocate(host, 4096);
  CHECK(hook_frees == 1);
  CHECK(a.staged_bytes() == 0);
  CHECK(a.staged_peak_bytes() == 4096);
  a.deallocate(dev, 512);
  CHECK(hook_frees == 1);  // a device block goes to the cache, not to the hook
}

TEST_CASE("allocator: with a reuse step, freed staging blocks are cached and reused after it") {
  int hook_allocs = 0, hook_frees = 0, reuses = 0;
  {
    Allocator a("test", [](size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); });
    counting_staging(a, hook_allocs, hook_frees, &reuses);
    Allocator::HostStaging staging;
    void* first = a.allocate(4096, "staging");
    a.deallocate(first, 4096);
    CHECK(hook_frees == 0);  // cached
    CHECK(a.staged_bytes() == 0);
    void* again = a.allocate(3500, "staging");  // within a quarter of the block: reused
    CHECK(again == first);
    CHECK(hook_allocs == 1);
    CHECK(reuses == 1);
    CHECK(a.staged(again));
    CHECK(a.staged_bytes() == 4096);  // the whole block
    void* small = a.allocate(1024, "staging");  // too small for the block: a new one
    CHECK(hook_allocs == 2);
    CHECK(reuses == 1);
    a.deallocate(again, 3500);
    // The cache holds at most the most staging bytes live at once (4096 + 1024).
    a.deallocate(small, 1024);
    CHECK(hook_frees == 0);
    void* big = a.allocate(8192, "staging");
    CHECK(hook_allocs == 3);
    a.deallocate(big, 8192);  // 5120 cached + 8192 > the peak of 8192 live: freed
    CHECK(hook_frees == 1);
  }
  CHECK(hook_frees == 3);  // the cached blocks go back with the allocator
}

TEST_CASE("weighted all-reduce: two ranks end with the exact sums through the CPU's axpy") {
  Backend& be = cpu_backend();
  std::vector<Tensor> a, b;
  std::vector<std::vector<float>> va, vb;
  for (int64_t n : {1, 10, 1000}) {
    va.push_back(random_values(static_cast<size_t>(n), 70 + static_cast<uint32_t>(n)));
    vb.push_back(random_values(static_cast<size_t>(n), 80 + static_cast<uint32_t>(n)));
    a.push_back(Tensor::from_vector(va.back(), {n}, be));
    b.push_back(Tensor::from_vector(vb.back(), {n}, be));
  }
  harness::pair_allreduce(a, b);
  for (size_t t = 0; t < a.size(); ++t) {
    CAPTURE(t);
    std::vector<float> want(va[t].size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = va[t][i] + vb[t][i];
    CHECK(a[t].to_vector() == want);
    CHECK(b[t].to_vector() == want);
  }
}
