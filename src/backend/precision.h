// The arithmetic of a backend's products (Backend::set_precision), and bf16 rounding on
// the host: the reference the GPU's bf16 products are checked against.
//
//   fp32  every primitive in fp32 (the default, and all the CPU backend computes)
//   bf16  gemm's operands rounded to bfloat16 on tensor cores, products accumulated and
//         stored in fp32; tensors, master weights, gradients and every other primitive
//         stay fp32 (autocast where the FLOPs are)
//   fp16  fp16 products with a dynamic loss scale (runtime/loss_scale.h); not built
//
// The names are train.precision's values (config/config.cpp lists the same three).
#pragma once

#include <cstdint>
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

}  // namespace ht
