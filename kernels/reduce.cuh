// Launchers of the reduction family: sum and max (with the first index of the maximum)
// over the middle axis of a contiguous (outer, n, inner) view, and max's gradient.
// Deterministic: every sum is taken in an order fixed by the launch geometry.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

void reduce(ReduceOp op, const float* x, float* y, int32_t* argmax, int64_t outer, int64_t n,
            int64_t inner, cudaStream_t stream);
void max_backward(const float* gy, const int32_t* argmax, float* gx, int64_t outer, int64_t n,
                  int64_t inner, cudaStream_t stream);

}  // namespace ht::kernels
