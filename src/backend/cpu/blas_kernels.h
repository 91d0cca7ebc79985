// Which OpenBLAS kernels the products run on, and the fix for a CPU that OpenBLAS does
// not know.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: at load time it reads the CPU's model
// number and picks a kernel set ("core"). A model newer than the library (Intel family 6
// model 207, say, on OpenBLAS 0.3.21) falls back to "Prescott", an SSE3 kernel: sgemm
// then runs 4-7x below what the same core reaches with the AVX-512 kernels, and every
// rate hetrain probes and plans with is that much too low. OpenBLAS reads its choice once,
// in a constructor that runs before main(), and takes OPENBLAS_CORETYPE as an override;
// so the binary re-executes itself once with the override set where the choice lacks
// instructions the CPU has (prefer_blas_kernels). A user's own OPENBLAS_CORETYPE is
// always left as it is.
#pragma once

#include <optional>
#include <string>

namespace ht {

// What the CPU can run, as far as choosing between OpenBLAS's x86 kernel sets goes.
enum class SimdLevel { baseline, avx2, avx512 };

// The running CPU's level (AVX2 with FMA; AVX-512 F, CD, BW, DQ and VL), as the OS
// enables it. baseline on a CPU that is not x86-64.
SimdLevel cpu_simd_level();

// The level OpenBLAS's kernel set `core` is written for: avx512 for SkylakeX, Cooperlake
// and SapphireRapids; avx2 for Haswell, Zen, Excavator; baseline for the rest, Prescott
// (the fallback for an unknown model) among them.
SimdLevel blas_core_level(const std::string& core);

// The kernel set to run instead of `core` on a CPU of level `cpu`, or nothing where
// `core` uses what the CPU has (or the user set OPENBLAS_CORETYPE: `user_set`). Only a
// core without AVX2 on a CPU with it is replaced: an AVX2 set OpenBLAS chose on an
// AVX-512 CPU (Zen on Zen 4) was its maintainers' choice, not a fallback.
std::optional<std::string> blas_core_override(const std::string& core, SimdLevel cpu, bool user_set);

// OpenBLAS's kernel set in this process.
std::string blas_core_name();

// Called first in main(): where blas_core_override names a set, re-executes this binary
// (/proc/self/exe, the same argv and pid) with OPENBLAS_CORETYPE set to it and
// HETRAIN_BLAS_FALLBACK set to OpenBLAS's own choice. Returns where nothing is to be done
// or the exec failed (the products then run on OpenBLAS's choice).
void prefer_blas_kernels(char** argv);

// The kernels in words, for `hetrain info` and bench_engine: the set, and where hetrain
// set it, what OpenBLAS had chosen.
std::string blas_kernels_text();

}  // namespace ht
