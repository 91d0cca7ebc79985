// Launchers of fused causal self-attention (flash-style): the T x T scores are never
// stored; each query row keeps a running max and sum (online softmax) over key tiles.
// The CUDA backend's causal_attention and causal_attention_backward call these. Layouts: q, k, v, o, gq, gk, gv are contiguous (bh, t, d), one (batch, head)
// pair per leading index; lse and delta are (bh, t).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

// The largest head size the kernels hold in registers (d <= 128; larger throws ht::Error).
inline constexpr int64_t kAttentionMaxHead = 128;

// o[i] = sum_{j <= i} softmax_j(scale * q[i] . k[j]) v[j]; lse[i] = the natural-log
// sum of exp of row i's scaled scores, kept for the backward pass.
void causal_attention(const float* q, const float* k, const float* v, float* o, float* lse,
                      int64_t bh, int64_t t, int64_t d, float scale, cudaStream_t stream);
// Overwrites gq, gk and gv from the output gradient go. delta is caller-provided scratch
// of bh * t floats (it receives rowsum(go * o)). Deterministic: each gradient row is
// summed by one warp in a fixed order, without atomics (the keys' pass recomputes the
// scores instead).
void causal_attention_backward(const float* q, const float* k, const float* v, const float* o,
                               const float* lse, const float* go, float* delta, float* gq,
                               float* gk, float* gv, int64_t bh, int64_t t, int64_t d, float scale,
                               cudaStream_t stream);

}  // namespace ht::kernels
