// Launchers of the embedding family: row lookups and their scatter-add gradient.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

// Sets *error_flag (device memory) to 1 when an id is outside [0, vocab); that
// position's output row is then zeros. The flag is never cleared here.
void embedding(const float* table, const int32_t* ids, float* out, int64_t count, int64_t vocab,
               int64_t dim, int* error_flag, cudaStream_t stream);
// gtable[ids[i]] += gout[i] with atomicAdd: positions that share an id are added in no
// fixed order, so the sums may differ in their last bits from run to run. Ids outside
// [0, vocab) set *error_flag to 1 and add nothing.
void embedding_backward(const int32_t* ids, const float* gout, float* gtable, int64_t count,
                        int64_t vocab, int64_t dim, int* error_flag, cudaStream_t stream);

}  // namespace ht::kernels
