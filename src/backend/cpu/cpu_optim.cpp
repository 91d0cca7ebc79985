// Fused optimiser updates: one pass over parameter, gradient and state.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/strided_loop.h"

namespace ht {

void CpuBackend::adamw(float* param, const float* grad, float* m, float* v, int64_t n,
                       const AdamWArgs& a) {
  float decay = 1.f - a.lr * a.weight_decay;
  float step = a.lr / a.bias_correction1;
  float inv_sqrt_bc2 = 1.f / std::sqrt(a.bias_correction2);
  cpu::parallel_range(n, 8, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      float g = grad[i];
      m[i] = a.beta1 * m[i] + (1.f - a.beta1) * g;
      v[i] = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
      float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + a.eps;
      param[i] = param[i] * decay - step * m[i] / denom;
    }
  });
}

void CpuBackend::sgd(float* param, const float* grad, float* buf, int64_t n, const SgdArgs& a) {
  cpu::parallel_range(n, 4, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      float g = grad[i] + a.weight_decay * param[i];
      if (a.momentum != 0.f) {
        buf[i] = a.first_step ? g : a.momentum * buf[i] + g;
        g = a.nesterov ? g + a.momentum * buf[i] : buf[i];
      }
      param[i] -= a.lr * g;
    }
  });
}

}  // namespace ht
