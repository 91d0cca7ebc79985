// Row-wise kernels: blockIdx.x is the row, the block's threads stride along it and
// meet in block_sum / block_max. Each mirrors the CPU backend's arithmetic step for step
// (the same shifts, the same reciprocal multiplies); only the order of the sums differs.
#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"
#include "kernels/rowwise.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

__device__ __forceinline__ float row_max(const float* xr, int64_t n, float* scratch) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, xr[i]);
  return block_max(m, scratch);
}

__device__ __forceinline__ float row_exp_sum(const float* xr, int64_t n, float shift,
                                             float* scratch) {
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += expf(xr[i] - shift);
  return block_sum(s, scratch);
}

__global__ void __launch_bounds__(kRowThreads)
    softmax_kernel(const float* x, float* y, int64_t n, bool log) {
  __shared__ float scratch[32];
  int64_t off = static_cast<int64_t>(blockIdx.x) * n;
  const float* xr = x + off;
  float* yr = y + off;
  float m = row_max(xr, n, scratch);
  float s = row_exp_sum(xr, n, m, scratch);
  if (log) {
    float lse = m + logf(s);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] - lse;
  } else {
    float inv = 1.f / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    softmax_backward_kernel(const float* y, const float* gy, float* gx, int64_t n, bool log) {
  __shared__ float scratch[32];
  int64_t off = static_cast<int64_t>(blockIdx.x) * n;
  const float* yr = y + off;
  const float* gr = gy + off;
  float* out = gx + off;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += log ? gr[i] : gr[i] * yr[i];
  s = block_sum(s, scratch);
  if (log) {  // gx = gy - softmax * sum(gy)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = gr[i] - expf(yr[i]) * s;
  } else {  // gx = y * (gy - sum(gy * y))
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = yr[i] * (gr[i] - s);
  }
}

__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_kernel(const float* logits, const int32_t* labels, float* loss, float* lse,
                         int64_t classes, int* error_flag) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const float* xr = logits + r * classes;
  float m = row_max(xr, classes, scratch);
  float s = row_exp_sum(xr, classes, m, scratch);
  if (threadIdx.x != 0) return;
  float l = m + logf(s);
  lse[r] = l;
  int32_t label = labels[r];
  if (label < 0 || label >= classes) {
    *error_flag = 1;
    loss[r] = NAN;
    return;
  }
  loss[r] = l - xr[label];
}

__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_backward_kernel(const float* logits, const float* lse, const int32_t* labels,
                                  const float* gloss, float* glogits, int64_t classes) {
  int64_t r = blockIdx.x;
  const float* xr = logits + r * classes;
  float* gr = glogits + r * classes;
  float g = gloss[r], l = lse[r];
  int32_t label = labels[r];
  for (int64_t i = threadIdx.x; i < classes; i += blockDim.x) {
    float v = g * expf(xr[i] - l);
    gr[i] = i == label ? v - g : v;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    layernorm_kernel(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int64_t n, float eps) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const float* xr = x + r * n;
  float* yr = y + r * n;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  float mu = block_sum(s, scratch) / static_cast<float>(n);
  float var = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) var += (xr[i] - mu) * (xr[i] - mu);
  var = block_sum(var, scratch);
  float rs = 1.f / sqrtf(var / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    yr[i] = (xr[i] - mu) * rs * gamma[i] + beta[i];
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    layernorm_backward_kernel(const float* x, const float* gamma, const float* mean,
                              const float* rstd, const float* gy, float* gx, int64_t n) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const float* xr = x + r * n;
  const float* gr = gy + r * n;
  float* out = gx + r * n;
  float mu = mean[r], rs = rstd[r];
  float sum_d = 0.f, sum_dx = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float d = gr[i] * gamma[i];
    sum_d += d;
    sum_dx += d * ((xr[i] - mu) * rs);
  }
  sum_d = block_sum(sum_d, scratch);
  sum_dx = block_sum(sum_dx, scratch);
  float inv_n = 1.f / static_cast<float>(n);
  float md = sum_d * inv_n, mdx = sum_dx * inv_n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float xhat = (xr[i] - mu) * rs;
    out[i] = rs * (gr[i] * gamma[i] - md - xhat * mdx);
  }
}

// ggamma[i] = sum_r gy[r][i] * xhat[r][i] and gbeta[i] = sum_r gy[r][i]: the column sums
// of a (1, rows, n) layout.
__global__ void __launch_bounds__(kColThreads)
    layernorm_params_kernel(const float* x, const float* mean, const float* rstd, const float* gy,
                            float* ggamma, float* gbeta, int64_t rows, int64_t n) {
  int64_t o, i;
  bool valid;
  float sg = column_sum(rows, n, o, i, valid, [&](int64_t, int64_t r, int64_t c) {
    return gy[r * n + c] * ((x[r * n + c] - mean[r]) * rstd[r]);
  });
  __syncthreads();  // column_sum's shared partials are reused by the second sum
  float sb = column_sum(rows, n, o, i, valid,
                        [&](int64_t, int64_t r, int64_t c) { return gy[r * n + c]; });
  if (threadIdx.y == 0 && valid) {
    ggamma[i] = sg;
    gbeta[i] = sb;
  }
}

}  // namespace

void softmax(const float* x, float* y, int64_t rows, int64_t n, bool log, cudaStream_t stream) {
  if (rows * n == 0) return;
  softmax_kernel<<<row_grid(rows, "softmax"), row_threads(n), 0, stream>>>(x, y, n, log);
}

void softmax_backward(const float* y, const float* gy, float* gx, int64_t rows, int64_t n, bool log,
                      cudaStream_t stream) {
  if (rows * n == 0) return;
  softmax_backward_kernel<<<row_grid(rows, "softmax_backward"), row_threads(n), 0, stream>>>(y, gy, gx, n,
                                                                                      log);
}

void cross_entropy(const float* logits, const int32_t* labels, float* loss, float* lse,
                   int64_t rows, int64_t classes, int* error_flag, cudaStream_t stream) {
  if (rows == 0) return;
  cross_entropy_kernel<<<row_grid(rows, "cross_entropy"), row_threads(classes), 0, stream>>>(
      logits, labels, loss, lse, classes, error_flag);
}

void cross_entropy_backward(const float* logits, const float* lse, const int32_t* labels,
                            const float* gloss, float* glogits, int64_t rows, int64_t classes,
                            cudaStream_t stream) {
  if (rows * classes == 0) return;
  cross_entropy_backward_kernel<<<row_grid(rows, "cross_entropy_backward"), row_threads(classes), 0, stream>>>(
      logits, lse, labels, gloss, glogits, classes);
}

void layernorm(const float* x, const float* gamma, const float* beta, float* y, float* mean,
               float* rstd, int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  if (rows * n == 0) return;
  layernorm_kernel<<<row_grid(rows, "layernorm"), row_threads(n), 0, stream>>>(x, gamma, beta, y,
                                                                               mean, rstd, n, eps);
}

void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                        const float* gy, float* gx, float* ggamma, float* gbeta, int64_t rows,
                        int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (rows > 0)
    layernorm_backward_kernel<<<row_grid(rows, "layernorm_backward"), row_threads(n), 0, stream>>>(
        x, gamma, mean, rstd, gy, gx, n);
  layernorm_params_kernel<<<column_grid(1, n), column_block(), 0, stream>>>(x, mean, rstd, gy,
                                                                            ggamma, gbeta, rows, n);
}

}  // namespace ht::kernels
