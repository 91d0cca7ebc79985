// Launch geometry shared by the kernel families: block sizes and grid-stride loops.
// Device code: included by the .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace ht::kernels::detail {

constexpr int kThreads = 256;
// Grid-stride loops cover any n; more blocks than this only adds scheduling overhead.
constexpr int64_t kMaxBlocks = 65535;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, kMaxBlocks));
}

__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// A grid of one block per row (or per tile of rows): gridDim.x holds at most 2^31 - 1,
// and a count past it would launch an error, or past 2^32 silently fewer blocks (the
// cast wraps), leaving rows unwritten. Reached only with 16 GiB or more of degenerate
// shapes; refused by name rather than computed wrong.
inline unsigned row_grid(int64_t blocks, const char* op) {
  HT_CHECK(blocks >= 0 && blocks <= INT32_MAX, op, ": ", blocks,
           " rows (blocks) in one launch; expected at most 2^31 - 1 (the CUDA grid's x limit)");
  return static_cast<unsigned>(blocks);
}

// Threads per row for the row-wise kernels (and reduce over rows): a warp for short
// rows, up to kRowThreads for long ones, where one block reads the whole row. The kernels
// declare __launch_bounds__(kRowThreads) so that every choice can launch.
constexpr int kRowThreads = 1024;
inline int row_threads(int64_t n) {
  if (n <= 64) return 32;
  if (n <= 512) return 128;
  if (n <= 2048) return 256;
  if (n <= 8192) return 512;
  return kRowThreads;
}

}  // namespace ht::kernels::detail
