// Deterministic reductions: warp shuffles, whole blocks and column sums. The order of
// every sum is fixed by the thread layout, so each run gives the same bits.
// Device code: included by the .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launch.cuh"

namespace ht::kernels::detail {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over a 1-d block of blockDim.x threads, a multiple of 32 up to 1024;
// every thread gets the result. The order is fixed by the thread layout, so the result
// is the same on every run. `scratch` holds 32 floats; the call ends with a barrier so
// the scratch can be reused straight away.
template <bool Max>
__device__ float block_reduce(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = Max ? warp_max(v) : warp_sum(v);
  if (warps == 1) return v;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : (Max ? -INFINITY : 0.f);
  r = Max ? warp_max(r) : warp_sum(r);
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce<false>(v, scratch);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce<true>(v, scratch);
}

// Column sums for (outer, n, inner) layouts: a block of kColX x kColY threads owns
// kColX adjacent columns (i) of one outer index; its kColY rows of threads take every
// kColY-th j and their partial sums are added in a fixed order, so the result is
// deterministic without atomics.
constexpr int kColX = 32, kColY = 16, kColThreads = kColX * kColY;

inline dim3 column_grid(int64_t outer, int64_t inner) {
  return dim3(row_grid(((inner + kColX - 1) / kColX) * outer, "column sums"));
}
inline dim3 column_block() { return dim3(kColX, kColY); }

// Calls value(o, j, i) for this thread's share of column (o, i) and returns the column's
// sum in threads with threadIdx.y == 0 (valid is false for columns past inner).
template <class Value>
__device__ float column_sum(int64_t n, int64_t inner, int64_t& o, int64_t& i, bool& valid,
                            Value value) {
  __shared__ float part[kColY][kColX + 1];
  int64_t col_blocks = (inner + kColX - 1) / kColX;
  o = blockIdx.x / col_blocks;
  i = (blockIdx.x % col_blocks) * kColX + threadIdx.x;
  valid = i < inner;
  float s = 0.f;
  if (valid)
    for (int64_t j = threadIdx.y; j < n; j += kColY) s += value(o, j, i);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0) {
    s = part[0][threadIdx.x];
    for (int y = 1; y < kColY; ++y) s += part[y][threadIdx.x];
  }
  return s;
}

}  // namespace ht::kernels::detail
