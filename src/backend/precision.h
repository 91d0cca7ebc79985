// The arithmetic of a backend's products (Backend::set_precision), and bf16 and fp16
// rounding on the host: the references the GPU's reduced products are checked against.
//
//   fp32  every primitive in fp32 (the default, and all the CPU backend computes)
//   bf16  gemm's operands rounded to bfloat16 on tensor cores, products accumulated and
//         stored in fp32; tensors, master weights, gradients and every other primitive
//         stay fp32 (autocast where the FLOPs are)
//   fp16  gemm's operands rounded to IEEE half on tensor cores, fp32 accumulation and C,
//         everything else fp32 as under bf16; the loss is scaled dynamically
//         (runtime/loss_scale.h), since fp16's smallest normal is 2^-14
//
// The names are train.precision's values (config/config.cpp lists the same three).
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/enum_names.h"
#include "core/error.h"

namespace ht {

enum class Precision { fp32, bf16, fp16 };

inline constexpr EnumName<Precision> kPrecisionNames[] = {
    {Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}};

inline const char* precision_name(Precision p) { return enum_name(p, kPrecisionNames); }
inline std::vector<std::string> precision_names() { return enum_names(kPrecisionNames); }
inline std::optional<Precision> try_parse_precision(std::string_view text) {
  return enum_from_name(text, kPrecisionNames);
}
// Throws ht::Error naming the text and the three names.
inline Precision parse_precision(std::string_view text) {
  if (auto p = try_parse_precision(text)) return *p;
  fail("precision \"", text, "\" is not a precision; expected \"fp32\", \"bf16\" or \"fp16\"");
}

// bfloat16 is the upper half of an fp32: sign, the 8 exponent bits, 7 mantissa bits.
// Rounding to nearest, ties to even, keeps a relative error of at most 2^-8 for normal
// values; values above the largest bf16 round to infinity, as in IEEE arithmetic; a NaN
// stays a NaN (quiet, sign kept), which plain rounding could turn into an infinity.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}
inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline float round_to_bf16(float x) { return bf16_to_float(bf16_bits(x)); }

// bf16's unit roundoff under round to nearest: 2^-8 (8 significant bits).
constexpr double kBf16Roundoff = 1.0 / 256;

// IEEE binary16: 10 mantissa bits, exponents -14..15, subnormals down to 2^-24. Rounding
// to nearest, ties to even, keeps a relative error of at most 2^-11 for values in the
// normal range; values from 65520 (halfway past the largest half, 65504) round to
// infinity; below 2^-14 the step is 2^-24 (subnormals, so small values lose relative
// precision and those under 2^-25 become 0: what the loss scale is for); a NaN stays a
// NaN. The result is returned as the float of the same value.
inline float round_to_fp16(float x) {
  if (std::isnan(x)) return x;
  if (std::fabs(x) < 0x1p-14f) return std::nearbyint(x * 0x1p24f) * 0x1p-24f;  // exact scalings; nearest even
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t lsb = (u >> 13) & 1u;  // fp32 keeps 23 mantissa bits, half 10
  u = (u + 0xfffu + lsb) & ~0x1fffu;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return std::fabs(r) > 65504.f ? std::copysign(INFINITY, x) : r;
}

// fp16's unit roundoff under round to nearest: 2^-11 (11 significant bits).
constexpr double kFp16Roundoff = 1.0 / 2048;

}  // namespace ht
