// Device float math that should round as the CPU backend's does. tanh (and so GELU) is
// core/host_device.h's rational approximation, the CPU backend's too, so the two backends
// agree to within a few ulps (each compiler may fuse a multiply-add the other does not)
// rather than by tanhf's accuracy.
#pragma once

#include <cuda_runtime.h>

#include "core/host_device.h"

namespace ht::kernels::detail {

using ht::tanh_approx;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK = 0.044715f;

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.f + tanh_approx(kGeluC * (v + kGeluK * v * v * v)));
}
__device__ __forceinline__ float gelu_backward(float v, float g) {
  float t = tanh_approx(kGeluC * (v + kGeluK * v * v * v));
  float dt = (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluK * v * v);
  return g * (0.5f * (1.f + t) + 0.5f * v * dt);
}

}  // namespace ht::kernels::detail
