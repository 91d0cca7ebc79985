#include "nn/token_embedding_block.h"

#include "nn/block_input.h"
#include "nn/cost_model.h"
#include "ops/ops.h"

namespace ht::nn {

TokenEmbeddingBlock::TokenEmbeddingBlock(int64_t vocab, int64_t context, int64_t dim,
                                         float dropout, uint64_t dropout_seed, Rng& rng)
    : context_(context),
      shape_(describe(vocab, context, dim, dropout)),
      tokens_(vocab, dim, rng),
      positions_(context, dim, rng),
      dropout_(dropout, dropout_seed) {}

Tensor TokenEmbeddingBlock::forward(const Tensor& ids) {
  bool ok = ids.defined() && ids.dim() == 2 && ids.shape()[0] >= 1 && ids.shape()[1] >= 1 &&
            ids.shape()[1] <= context_;
  check_block_input(*this, ids, ok,
                    "(B, T) with 1 <= T <= " + std::to_string(context_) + " (the context)");
  int64_t t = ids.shape()[1];
  Tensor tok = tokens_.forward(ids);                 // (B, T, C)
  Tensor pos = slice(positions_.table(), 0, 0, t);   // (T, C), a view; broadcasts over B
  return dropout_.forward(add(tok, pos), training());  // (B, T, C)
}

// FLOPs: T*C for the position add [+ T*C for the dropout multiply]; lookups are copies.
// Kept: the int32 ids (T, kept by the token lookup; the position table is sliced, so
// no position ids exist) [+ the float dropout mask, T*C].
BlockShape TokenEmbeddingBlock::describe(int64_t vocab, int64_t context, int64_t dim,
                                         float dropout) {
  const int64_t tc = context * dim;
  const bool drops = dropout > 0.f;
  BlockShape s;
  s.kind = "token_embedding";
  s.params = cost::embedding_params(vocab, dim) + cost::embedding_params(context, dim);
  s.flops_per_sample = tc + (drops ? tc : 0);
  s.activation_bytes_per_sample = context * cost::kIntBytes + (drops ? tc * cost::kFloatBytes : 0);
  // Backward: the output's gradient (TC) [and the dropout's input gradient, TC].
  s.workspace_bytes_per_sample = (drops ? 2 : 1) * tc * cost::kFloatBytes;
  // Evaluation: the token lookup's output beside the position add's (dropout passes it on).
  s.eval_bytes_per_sample = 2 * tc * cost::kFloatBytes;
  s.eval_fused_bytes_per_sample = s.eval_bytes_per_sample;
  s.sample_input_shape = {context};
  s.sample_output_shape = {context, dim};
  s.input_dtype = DType::i32;
  return s;
}

std::vector<NamedTensor> TokenEmbeddingBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "tokens", tokens_.named_parameters());
  append(out, "positions", positions_.named_parameters());
  return out;
}

}  // namespace ht::nn
