// Launcher of the dropout mask: the very stream of ht::counter_uniform (backend.h), so a
// CUDA rank drops the same elements as a CPU rank given the same seed and offset.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

void dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset,
                  cudaStream_t stream);

}  // namespace ht::kernels
