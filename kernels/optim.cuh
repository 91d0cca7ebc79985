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

}  // namespace ht::kernels
