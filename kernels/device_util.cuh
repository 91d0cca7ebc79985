// Device-side helpers shared by the kernel families: launch geometry, strided indexing
// over coalesced dimensions, and deterministic warp, block and column reductions.
// Included by the .cu files only (it holds device code); the launchers' declarations
// are in the family headers and kernels.h.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/error.h"
#include "core/shape.h"

namespace ht::kernels::detail {

constexpr int kThreads = 256;
// Grid-stride loops cover any n; more blocks than this only adds scheduling overhead.
constexpr int64_t kMaxBlocks = 65535;
constexpr int kMaxDims = 8;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, kMaxBlocks));
}

__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The dimensions and per-operand element strides of a strided loop, passed by value
// to the kernel. Operand N-1 is conventionally the output.
template <int N>
struct StridedDims {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};
  int64_t count() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
};

inline bool has_zero_extent(const Shape& shape) {
  for (int64_t d : shape)
    if (d == 0) return true;
  return false;
}

// Drops size-1 dimensions and merges adjacent ones where every operand is dense across
// them (as the CPU backend's loops do), so that most calls become one dimension and
// the per-element index arithmetic stays short. Throws when more than kMaxDims remain.
template <int N>
StridedDims<N> coalesce(const Shape& shape, const std::array<const Strides*, N>& strides,
                        const char* op) {
  StridedDims<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    int last = out.ndim - 1;
    bool merge = out.ndim > 0;
    for (int k = 0; merge && k < N; ++k)
      merge = out.stride[k][last] == (*strides[k])[d] * shape[d];
    if (merge) {
      out.size[last] *= shape[d];
      for (int k = 0; k < N; ++k) out.stride[k][last] = (*strides[k])[d];
      continue;
    }
    HT_CHECK(out.ndim < kMaxDims, op, ": a strided view of ", shape.size(),
             " dimensions keeps more than ", kMaxDims,
             " after merging the dense ones; expected at most ", kMaxDims, " on CUDA");
    out.size[out.ndim] = shape[d];
    for (int k = 0; k < N; ++k) out.stride[k][out.ndim] = (*strides[k])[d];
    ++out.ndim;
  }
  if (out.ndim == 0) {  // a single element
    out.ndim = 1;
    out.size[0] = 1;
    for (int k = 0; k < N; ++k) out.stride[k][0] = 1;
  }
  return out;
}

// Row-major strides of a dense tensor of `shape` (the outputs of binary and where).
inline Strides dense_strides(const Shape& shape) {
  Strides s(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = step;
    step *= shape[d];
  }
  return s;
}

// The element offsets of every operand at linear (row-major) index i.
template <int N>
__device__ __forceinline__ void strided_offsets(const StridedDims<N>& s, int64_t i,
                                                int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    int64_t idx = i % s.size[d];
    i /= s.size[d];
    for (int k = 0; k < N; ++k) off[k] += idx * s.stride[k][d];
  }
}

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

// Threads per row for the row-wise kernels: a warp for short rows, up to a full block.
inline int row_threads(int64_t n) {
  if (n <= 64) return 32;
  if (n <= 512) return 128;
  if (n <= 2048) return 256;
  return 512;
}

// Column sums for (outer, n, inner) layouts: a block of kColX x kColY threads owns
// kColX adjacent columns (i) of one outer index; its kColY rows of threads take every
// kColY-th j and their partial sums are added in a fixed order, so the result is
// deterministic without atomics.
constexpr int kColX = 32, kColY = 8;

inline dim3 column_grid(int64_t outer, int64_t inner) {
  return dim3(static_cast<unsigned>(((inner + kColX - 1) / kColX) * outer));
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
