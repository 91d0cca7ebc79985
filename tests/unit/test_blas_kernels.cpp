// The choice of OpenBLAS kernel sets (backend/cpu/blas_kernels.h): a fallback without
// AVX2 is replaced on a CPU with it, by the set of the CPU's level; a set OpenBLAS chose
// with AVX2, or a user's OPENBLAS_CORETYPE, is kept. That the binary acts on it is
// checked by the e2e-cli suite (`hetrain info --json`).
#include <doctest/doctest.h>

#include "backend/cpu/blas_kernels.h"

using ht::SimdLevel;

TEST_CASE("blas kernels: a fallback without AVX2 is replaced by the CPU's level, nothing else") {
  CHECK(ht::blas_core_level("Prescott") == SimdLevel::baseline);
  CHECK(ht::blas_core_level("Sandybridge") == SimdLevel::baseline);
  CHECK(ht::blas_core_level("Haswell") == SimdLevel::avx2);
  CHECK(ht::blas_core_level("Zen") == SimdLevel::avx2);
  CHECK(ht::blas_core_level("SkylakeX") == SimdLevel::avx512);
  CHECK(ht::blas_core_level("SapphireRapids") == SimdLevel::avx512);

  CHECK(ht::blas_core_override("Prescott", SimdLevel::avx512, false) == "SkylakeX");
  CHECK(ht::blas_core_override("Prescott", SimdLevel::avx2, false) == "Haswell");
  CHECK(ht::blas_core_override("Nehalem", SimdLevel::avx2, false) == "Haswell");
  CHECK_FALSE(ht::blas_core_override("Prescott", SimdLevel::baseline, false));  // an old CPU: its own set
  CHECK_FALSE(ht::blas_core_override("Prescott", SimdLevel::avx512, true));     // the user's OPENBLAS_CORETYPE
  CHECK_FALSE(ht::blas_core_override("Haswell", SimdLevel::avx512, false));     // OpenBLAS's AVX2 choice stands
  CHECK_FALSE(ht::blas_core_override("Zen", SimdLevel::avx512, false));
  CHECK_FALSE(ht::blas_core_override("SkylakeX", SimdLevel::avx512, false));
}

TEST_CASE("blas kernels: this process names its set, first in the text info prints") {
  CHECK_FALSE(ht::blas_core_name().empty());
  CHECK(ht::blas_kernels_text().rfind("OpenBLAS " + ht::blas_core_name(), 0) == 0);
}
