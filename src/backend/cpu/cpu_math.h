// Vectorisable float math for the CPU kernels. glibc's tanhf is a scalar call (and
// goes through expm1f); inside `omp simd` loops these inline to plain arithmetic.
#pragma once

#include <algorithm>

namespace ht::cpu {

// tanh as a rational function, odd numerator of degree 13 over even denominator of
// degree 6, on |x| <= 7.905 (beyond which tanh rounds to +-1 in float); accurate to a
// few ulp, the form Eigen uses for float. Tiny |x| return x, where tanh(x) == x in float.
inline float tanh_approx(float x) {
  constexpr float kClamp = 7.90531110763549805f;
  constexpr float a1 = 4.89352455891786e-03f, a3 = 6.37261928875436e-04f,
                  a5 = 1.48572235717979e-05f, a7 = 5.12229709037114e-08f,
                  a9 = -8.60467152213735e-11f, a11 = 2.00018790482477e-13f,
                  a13 = -2.76076847742355e-16f;
  constexpr float b0 = 4.89352518554385e-03f, b2 = 2.26843463243900e-03f,
                  b4 = 1.18534705686654e-04f, b6 = 1.19825839466702e-06f;
  float c = std::clamp(x, -kClamp, kClamp);
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

}  // namespace ht::cpu
