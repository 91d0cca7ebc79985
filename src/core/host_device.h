// Arithmetic that the CPU and the CUDA backends must compute to the bit: plain inline
// functions for g++, host-and-device ones for nvcc (kernels/ includes this header), so
// the two backends share one definition instead of two that could drift apart.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HT_HOST_DEVICE __host__ __device__
#else
#define HT_HOST_DEVICE
#endif

namespace ht {

// tanh as a rational function, odd numerator of degree 13 over even denominator of
// degree 6, on |x| <= 7.905 (beyond which tanh rounds to +-1 in float); accurate to a
// few ulp, the form Eigen uses for float. Tiny |x| return x, where tanh(x) == x in float.
// Inline arithmetic, so it vectorises in the CPU's `omp simd` loops (glibc's tanhf is a
// scalar call); the clamp is written with comparisons, which keep a NaN a NaN on both
// sides (CUDA's fmaxf would turn it into the bound).
HT_HOST_DEVICE inline float tanh_approx(float x) {
  constexpr float kClamp = 7.90531110763549805f;
  constexpr float a1 = 4.89352455891786e-03f, a3 = 6.37261928875436e-04f,
                  a5 = 1.48572235717979e-05f, a7 = 5.12229709037114e-08f,
                  a9 = -8.60467152213735e-11f, a11 = 2.00018790482477e-13f,
                  a13 = -2.76076847742355e-16f;
  constexpr float b0 = 4.89352518554385e-03f, b2 = 2.26843463243900e-03f,
                  b4 = 1.18534705686654e-04f, b6 = 1.19825839466702e-06f;
  const float c = x < -kClamp ? -kClamp : (x > kClamp ? kClamp : x);
  const float x2 = c * c;
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
  const float r = p / q;
  return (x > -4e-4f && x < 4e-4f) ? x : r;
}

// The uniform counter-based generator behind dropout (splitmix64 of seed and index), in
// [0, 1): every backend and the references produce the very same stream.
HT_HOST_DEVICE inline float counter_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ht
