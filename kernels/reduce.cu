// Reductions over the middle axis of (outer, n, inner). A row (inner == 1) is reduced
// by one block; otherwise a block of kColX x kColY threads owns kColX adjacent columns
// and splits n between its rows of threads. Partial results are combined in a fixed
// order, never with atomics, so every run gives the same bits.
#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

// The running maximum of one thread: NaN is never taken and `at` stays -1 until a value
// above -inf is seen; finish_max then gives the CPU backend's answer (best = x[0], then
// each strictly greater x[j] in order), including its NaN and all -inf cases.
struct MaxAt {
  float best;
  int32_t at;
};

__device__ __forceinline__ void take(MaxAt& m, float v, int32_t j) {
  if (v > m.best) {
    m.best = v;
    m.at = j;
  }
}

// The larger value wins; between equal values, the smaller index.
__device__ __forceinline__ void merge(MaxAt& m, MaxAt o) {
  if (o.at < 0) return;
  if (m.at < 0 || o.best > m.best || (o.best == m.best && o.at < m.at)) m = o;
}

__device__ __forceinline__ MaxAt finish_max(MaxAt m, float first) {
  if (first != first || m.at < 0) return {first, 0};  // x[0] is NaN, or nothing beat -inf
  return m;
}

__global__ void __launch_bounds__(kRowThreads)
    sum_rows_kernel(const float* x, float* y, int64_t n) {
  __shared__ float scratch[32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += row[j];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) y[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kColThreads)
    sum_columns_kernel(const float* x, float* y, int64_t n, int64_t inner) {
  int64_t o, i;
  bool valid;
  float s = column_sum(n, inner, o, i, valid, [&](int64_t oo, int64_t j, int64_t ii) {
    return x[(oo * n + j) * inner + ii];
  });
  if (threadIdx.y == 0 && valid) y[o * inner + i] = s;
}

__global__ void __launch_bounds__(kRowThreads)
    max_rows_kernel(const float* x, float* y, int32_t* argmax, int64_t n) {
  __shared__ MaxAt scratch[32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  MaxAt m{-INFINITY, -1};
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) take(m, row[j], static_cast<int32_t>(j));
  for (int o = 16; o > 0; o >>= 1) {
    MaxAt other{__shfl_xor_sync(0xffffffffu, m.best, o), __shfl_xor_sync(0xffffffffu, m.at, o)};
    merge(m, other);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < warps; ++w) merge(m, scratch[w]);
  m = finish_max(m, row[0]);
  y[blockIdx.x] = m.best;
  if (argmax) argmax[blockIdx.x] = m.at;
}

__global__ void __launch_bounds__(kColThreads)
    max_columns_kernel(const float* x, float* y, int32_t* argmax, int64_t n, int64_t inner) {
  __shared__ MaxAt part[kColY][kColX + 1];
  int64_t col_blocks = (inner + kColX - 1) / kColX;
  int64_t o = blockIdx.x / col_blocks;
  int64_t i = (blockIdx.x % col_blocks) * kColX + threadIdx.x;
  bool valid = i < inner;
  const float* col = x + o * n * inner + i;
  MaxAt m{-INFINITY, -1};
  if (valid)
    for (int64_t j = threadIdx.y; j < n; j += kColY)
      take(m, col[j * inner], static_cast<int32_t>(j));
  part[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y != 0 || !valid) return;
  for (int r = 1; r < kColY; ++r) merge(m, part[r][threadIdx.x]);
  m = finish_max(m, col[0]);
  y[o * inner + i] = m.best;
  if (argmax) argmax[o * inner + i] = m.at;
}

__global__ void max_backward_kernel(const float* gy, const int32_t* argmax, float* gx, int64_t n,
                                    int64_t inner, int64_t total) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t i = k % inner, j = (k / inner) % n, o = k / (inner * n);
    int64_t at = o * inner + i;
    gx[k] = argmax[at] == j ? gy[at] : 0.f;
  }
}

}  // namespace

void reduce(ReduceOp op, const float* x, float* y, int32_t* argmax, int64_t outer, int64_t n,
            int64_t inner, cudaStream_t stream) {
  if (outer * inner == 0) return;
  // An empty sum is 0 (the kernels give that); an empty max has no value to give.
  if (n == 0 && op == ReduceOp::max) return;
  bool rows = inner == 1;
  const unsigned row_blocks = rows ? row_grid(outer, "reduce") : 0;
  int threads = row_threads(n);
  if (op == ReduceOp::sum) {
    if (rows)
      sum_rows_kernel<<<row_blocks, threads, 0, stream>>>(x, y, n);
    else
      sum_columns_kernel<<<column_grid(outer, inner), column_block(), 0, stream>>>(x, y, n, inner);
    return;
  }
  if (rows)
    max_rows_kernel<<<row_blocks, threads, 0, stream>>>(x, y, argmax, n);
  else
    max_columns_kernel<<<column_grid(outer, inner), column_block(), 0, stream>>>(x, y, argmax, n,
                                                                                 inner);
}

void max_backward(const float* gy, const int32_t* argmax, float* gx, int64_t outer, int64_t n,
                  int64_t inner, cudaStream_t stream) {
  int64_t total = outer * n * inner;
  if (total == 0) return;
  max_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(gy, argmax, gx, n, inner, total);
}

}  // namespace ht::kernels
