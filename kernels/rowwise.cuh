// Launchers of the row-wise family over contiguous (rows, n): softmax and log_softmax,
// fused cross-entropy and layer norm, forward and backward. One block (a warp for short
// rows) per row, reduced with shuffles in a fixed order.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

void softmax(const float* x, float* y, int64_t rows, int64_t n, bool log, cudaStream_t stream);
void softmax_backward(const float* y, const float* gy, float* gx, int64_t rows, int64_t n, bool log,
                      cudaStream_t stream);
// Sets *error_flag (device memory) to 1 when a label is outside [0, classes); that row's
// loss is then NaN. The flag is never cleared here.
void cross_entropy(const float* logits, const int32_t* labels, float* loss, float* lse,
                   int64_t rows, int64_t classes, int* error_flag, cudaStream_t stream);
// Labels outside [0, classes) (which cross_entropy flagged) subtract nothing.
void cross_entropy_backward(const float* logits, const float* lse, const int32_t* labels,
                            const float* gloss, float* glogits, int64_t rows, int64_t classes,
                            cudaStream_t stream);
void layernorm(const float* x, const float* gamma, const float* beta, float* y, float* mean,
               float* rstd, int64_t rows, int64_t n, float eps, cudaStream_t stream);
// Writes gx, and overwrites ggamma and gbeta with their sums over rows (deterministic).
void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                        const float* gy, float* gx, float* ggamma, float* gbeta, int64_t rows,
                        int64_t n, cudaStream_t stream);

}  // namespace ht::kernels
