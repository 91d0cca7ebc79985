#include "nn/lm_head_block.h"

#include "nn/block_input.h"
#include "nn/cost_model.h"

namespace ht::nn {

LmHeadBlock::LmHeadBlock(int64_t dim, int64_t vocab, int64_t context, Rng& rng)
    : context_(context), shape_(describe(dim, vocab, context)), ln_(dim), head_(dim, vocab, false, Init::gpt, rng) {}

Tensor LmHeadBlock::forward(const Tensor& x) {
  int64_t c = ln_.dim();
  bool ok = x.defined() && x.dim() == 3 && x.shape()[0] >= 1 && x.shape()[1] >= 1 &&
            x.shape()[1] <= context_ && x.shape()[2] == c;
  check_block_input(*this, x, ok,
                    "(B, T, " + std::to_string(c) + ") with 1 <= T <= " + std::to_string(context_));
  return head_.forward(ln_.forward(x));  // (B, T, V)
}

// FLOPs: 7TC (layernorm) + 2*T*C*V (projection, no bias).
// Kept: the layernorm's input (TC) + mean, 1/std (2T), and its output as the
// projection's input (TC). The logits are not kept here; a loss that keeps them
// (cross_entropy does) accounts for them itself.
BlockShape LmHeadBlock::describe(int64_t dim, int64_t vocab, int64_t context) {
  const int64_t t = context, c = dim;
  BlockShape s;
  s.kind = "lm_head";
  s.params = cost::layernorm_params(c) + cost::linear_params(c, vocab, false);
  s.flops_per_sample = cost::kLayerNormFlopsPerValue * t * c + cost::linear_flops(t, c, vocab, false);
  s.activation_bytes_per_sample = cost::layernorm_saved_bytes(t, c) + t * c * cost::kFloatBytes;
  // Backward: the logits' gradient (TV), the projection's input gradient and the
  // layernorm's (TC each).
  s.workspace_bytes_per_sample = (t * vocab + 2 * t * c) * cost::kFloatBytes;
  // Evaluation: the layernorm's output (TC) beside the logits (TV).
  s.eval_bytes_per_sample = (t * c + t * vocab) * cost::kFloatBytes;
  s.eval_fused_bytes_per_sample = s.eval_bytes_per_sample;
  s.sample_input_shape = {t, c};
  s.sample_output_shape = {t, vocab};
  return s;
}

std::vector<NamedTensor> LmHeadBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "ln", ln_.named_parameters());
  append(out, "head", head_.named_parameters());
  return out;
}

}  // namespace ht::nn
