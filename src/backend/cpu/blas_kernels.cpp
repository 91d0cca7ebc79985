#include "backend/cpu/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <array>
#include <cstdlib>

namespace ht {

SimdLevel cpu_simd_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  // libgcc's feature bits count AVX and AVX-512 only where XGETBV says the OS saves
  // their registers, so a level here is one the process can use.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return SimdLevel::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::avx2;
#endif
  return SimdLevel::baseline;
}

SimdLevel blas_core_level(const std::string& core) {
  static constexpr std::array<const char*, 3> avx512{"SkylakeX", "Cooperlake", "SapphireRapids"};
  static constexpr std::array<const char*, 3> avx2{"Haswell", "Zen", "Excavator"};
  for (const char* name : avx512)
    if (core == name) return SimdLevel::avx512;
  for (const char* name : avx2)
    if (core == name) return SimdLevel::avx2;
  return SimdLevel::baseline;
}

std::optional<std::string> blas_core_override(const std::string& core, SimdLevel cpu, bool user_set) {
  if (user_set || blas_core_level(core) != SimdLevel::baseline) return std::nullopt;
  switch (cpu) {
    case SimdLevel::avx512: return "SkylakeX";
    case SimdLevel::avx2: return "Haswell";
    case SimdLevel::baseline: break;
  }
  return std::nullopt;
}

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

void prefer_blas_kernels(char** argv) {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const std::string chosen = blas_core_name();
  const std::optional<std::string> better = blas_core_override(chosen, cpu_simd_level(), user != nullptr && *user);
  if (!better) return;
  ::setenv("OPENBLAS_CORETYPE", better->c_str(), 1);
  ::setenv("HETRAIN_BLAS_FALLBACK", chosen.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // No exec (no /proc): run on OpenBLAS's choice, and say nothing was changed.
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv("HETRAIN_BLAS_FALLBACK");
}

std::string blas_kernels_text() {
  std::string text = "OpenBLAS " + blas_core_name();
  const char* fallback = std::getenv("HETRAIN_BLAS_FALLBACK");
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (fallback != nullptr && *fallback && set != nullptr && blas_core_name() == set)
    text += std::string(" (set by hetrain: OpenBLAS chose ") + fallback +
            ", a kernel without the AVX2 this CPU has; OPENBLAS_CORETYPE overrides)";
  else if (set != nullptr && *set)
    text += std::string(" (OPENBLAS_CORETYPE=") + set + ")";
  return text;
}

}  // namespace ht
