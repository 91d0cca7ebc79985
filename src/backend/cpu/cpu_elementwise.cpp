// Elementwise kernels. The op is chosen once per call (a switch outside the loop);
// the loops themselves are plain, dense and free of calls so the compiler vectorises
// them.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/strided_loop.h"

namespace ht {

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK = 0.044715f;

template <class F>
void map1(const float* x, float* y, int64_t n, F f) {
  cpu::parallel_range(n, 4, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
}

template <class F>
void map2(const float* a, const float* b, float* y, int64_t n, F f) {
  cpu::parallel_range(n, 4, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = f(a[i], b[i]);
  });
}

template <class F>
void binary_loop(F f, const float* a, const Strides& sa, const float* b, const Strides& sb,
                 float* out, const Shape& shape) {
  Strides so = contiguous_strides(shape);
  auto s = cpu::coalesce<3>(shape, {&sa, &sb, &so});
  cpu::for_each_row(s, [&](auto offs, int64_t n, auto st) {
    const float* pa = a + offs[0];
    const float* pb = b + offs[1];
    float* po = out + offs[2];
    if (st[0] == 1 && st[1] == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    } else if (st[0] == 1 && st[1] == 0) {
      float vb = *pb;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], vb);
    } else if (st[0] == 0 && st[1] == 1) {
      float va = *pa;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) po[i] = f(va, pb[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i * st[0]], pb[i * st[1]]);
    }
  });
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha) {
  switch (op) {
    case UnaryOp::neg: return map1(x, y, n, [](float v) { return -v; });
    case UnaryOp::exp: return map1(x, y, n, [](float v) { return std::exp(v); });
    case UnaryOp::log: return map1(x, y, n, [](float v) { return std::log(v); });
    case UnaryOp::sqrt: return map1(x, y, n, [](float v) { return std::sqrt(v); });
    case UnaryOp::tanh: return map1(x, y, n, [](float v) { return cpu::tanh_approx(v); });
    case UnaryOp::relu: return map1(x, y, n, [](float v) { return v > 0.f ? v : 0.f; });
    case UnaryOp::gelu:
      return map1(x, y, n, [](float v) {
        return 0.5f * v * (1.f + cpu::tanh_approx(kGeluC * (v + kGeluK * v * v * v)));
      });
    case UnaryOp::add_scalar: return map1(x, y, n, [alpha](float v) { return v + alpha; });
    case UnaryOp::mul_scalar: return map1(x, y, n, [alpha](float v) { return v * alpha; });
    case UnaryOp::pow_scalar:
      if (alpha == 2.f) return map1(x, y, n, [](float v) { return v * v; });
      return map1(x, y, n, [alpha](float v) { return std::pow(v, alpha); });
  }
}

void CpuBackend::unary_backward(UnaryOp op, const float* x, const float* y, const float* gy,
                                float* gx, int64_t n, float alpha) {
  switch (op) {
    case UnaryOp::neg: return map1(gy, gx, n, [](float g) { return -g; });
    case UnaryOp::add_scalar: return map1(gy, gx, n, [](float g) { return g; });
    case UnaryOp::mul_scalar: return map1(gy, gx, n, [alpha](float g) { return g * alpha; });
    case UnaryOp::exp: return map2(y, gy, gx, n, [](float v, float g) { return g * v; });
    case UnaryOp::log: return map2(x, gy, gx, n, [](float v, float g) { return g / v; });
    case UnaryOp::sqrt: return map2(y, gy, gx, n, [](float v, float g) { return 0.5f * g / v; });
    case UnaryOp::tanh:
      return map2(y, gy, gx, n, [](float v, float g) { return g * (1.f - v * v); });
    case UnaryOp::relu:
      return map2(y, gy, gx, n, [](float v, float g) { return v > 0.f ? g : 0.f; });
    case UnaryOp::gelu:
      return map2(x, gy, gx, n, [](float v, float g) {
        float t = cpu::tanh_approx(kGeluC * (v + kGeluK * v * v * v));
        float dt = (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluK * v * v);
        return g * (0.5f * (1.f + t) + 0.5f * v * dt);
      });
    case UnaryOp::pow_scalar:
      return map2(x, gy, gx, n, [alpha](float v, float g) {
        return g * alpha * std::pow(v, alpha - 1.f);
      });
  }
}

void CpuBackend::binary(BinaryOp op, const float* a, const Strides& sa, const float* b,
                        const Strides& sb, float* out, const Shape& shape) {
  if (numel(shape) == 0) return;
  switch (op) {
    case BinaryOp::add:
      return binary_loop([](float x, float y) { return x + y; }, a, sa, b, sb, out, shape);
    case BinaryOp::sub:
      return binary_loop([](float x, float y) { return x - y; }, a, sa, b, sb, out, shape);
    case BinaryOp::mul:
      return binary_loop([](float x, float y) { return x * y; }, a, sa, b, sb, out, shape);
    case BinaryOp::div:
      return binary_loop([](float x, float y) { return x / y; }, a, sa, b, sb, out, shape);
  }
}

void CpuBackend::where(const float* cond, const Strides& sc, const float* a, const Strides& sa,
                       const float* b, const Strides& sb, float* out, const Shape& shape) {
  if (numel(shape) == 0) return;
  Strides so = contiguous_strides(shape);
  auto s = cpu::coalesce<4>(shape, {&sc, &sa, &sb, &so});
  cpu::for_each_row(s, [&](auto offs, int64_t n, auto st) {
    const float* pc = cond + offs[0];
    const float* pa = a + offs[1];
    const float* pb = b + offs[2];
    float* po = out + offs[3];
    for (int64_t i = 0; i < n; ++i)
      po[i] = pc[i * st[0]] != 0.f ? pa[i * st[1]] : pb[i * st[2]];
  });
}

void CpuBackend::dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset) {
  float keep_scale = 1.f / (1.f - p);
  cpu::parallel_range(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      mask[i] = counter_uniform(seed, offset + static_cast<uint64_t>(i)) >= p ? keep_scale : 0.f;
  });
}

void CpuBackend::axpy(float alpha, const float* x, float* y, int64_t n) {
  cpu::parallel_range(n, 1, [&](int64_t b, int64_t e) {
    if (alpha == 1.f) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) y[i] += x[i];
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) y[i] += alpha * x[i];
    }
  });
}

}  // namespace ht
