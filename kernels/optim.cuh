// Launchers of the fused optimiser updates, in place, one pass over parameter,
// gradient and state.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& a,
           cudaStream_t stream);
void sgd(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdArgs& a,
         cudaStream_t stream);

// The same updates over `count` tensors at once (multi-tensor fusion: a few launches for
// all parameters instead of one per tensor). The pointer arrays and sizes are host
// memory, read before the call returns; the tensors they point to are device memory.
// Each element gets exactly the arithmetic of adamw / sgd on its own tensor.
// momentum_bufs may be null (or hold nulls) when a.momentum is 0.
void adamw_multi(float* const* params, const float* const* grads, float* const* ms,
                 float* const* vs, const int64_t* sizes, int count, const AdamWArgs& a,
                 cudaStream_t stream);
void sgd_multi(float* const* params, const float* const* grads, float* const* momentum_bufs,
               const int64_t* sizes, int count, const SgdArgs& a, cudaStream_t stream);

}  // namespace ht::kernels
