// Fused optimiser updates, one thread per element. The per-call scalars are formed on
// the host exactly as the CPU backend forms them, so both round them alike.
#include <cmath>

#include "kernels/device_util.cuh"
#include "kernels/optim.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

struct AdamWScalars {
  float beta1, beta2, eps, decay, step, inv_sqrt_bc2;
};

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             AdamWScalars s) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    float g = grad[i];
    float mi = s.beta1 * m[i] + (1.f - s.beta1) * g;
    float vi = s.beta2 * v[i] + (1.f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) * s.inv_sqrt_bc2 + s.eps;
    param[i] = param[i] * s.decay - s.step * mi / denom;
  }
}

__global__ void sgd_kernel(float* param, const float* grad, float* buf, int64_t n, SgdArgs a) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    float g = grad[i] + a.weight_decay * param[i];
    if (a.momentum != 0.f) {
      float b = a.first_step ? g : a.momentum * buf[i] + g;
      buf[i] = b;
      g = a.nesterov ? g + a.momentum * b : b;
    }
    param[i] -= a.lr * g;
  }
}

}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& a,
           cudaStream_t stream) {
  if (n <= 0) return;
  AdamWScalars s{a.beta1, a.beta2, a.eps, 1.f - a.lr * a.weight_decay, a.lr / a.bias_correction1,
                 1.f / std::sqrt(a.bias_correction2)};
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, m, v, n, s);
}

void sgd(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdArgs& a,
         cudaStream_t stream) {
  if (n <= 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, momentum_buf, n, a);
}

}  // namespace ht::kernels
