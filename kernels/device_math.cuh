// Device float math that must round as the CPU backend's does. tanh (and so GELU) uses
// the same rational approximation as src/backend/cpu/cpu_math.h, which is host-only,
// so the two backends agree to the ulp rather than by tanhf's accuracy.
#pragma once

#include <cuda_runtime.h>

namespace ht::kernels::detail {

__device__ __forceinline__ float tanh_approx(float x) {
  constexpr float kClamp = 7.90531110763549805f;
  constexpr float a1 = 4.89352455891786e-03f, a3 = 6.37261928875436e-04f,
                  a5 = 1.48572235717979e-05f, a7 = 5.12229709037114e-08f,
                  a9 = -8.60467152213735e-11f, a11 = 2.00018790482477e-13f,
                  a13 = -2.76076847742355e-16f;
  constexpr float b0 = 4.89352518554385e-03f, b2 = 2.26843463243900e-03f,
                  b4 = 1.18534705686654e-04f, b6 = 1.19825839466702e-06f;
  float c = fminf(fmaxf(x, -kClamp), kClamp);
  float x2 = c * c;
  float p = a13;
  p = p * x2 + a11;
  p = p * x2 + a9;
  p = p * x2 + a7;
  p = p * x2 + a5;
  p = p * x2 + a3;
  p = p * x2 + a1;
  p = p * c;
  float q = b6;
  q = q * x2 + b4;
  q = q * x2 + b2;
  q = q * x2 + b0;
  float r = p / q;
  return (x > -4e-4f && x < 4e-4f) ? x : r;
}

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
