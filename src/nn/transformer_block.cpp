#include "nn/transformer_block.h"

#include <algorithm>

#include "core/error.h"
#include "nn/block_input.h"
#include "nn/cost_model.h"
#include "ops/ops.h"

namespace ht::nn {

namespace {
constexpr int64_t kMlpWidth = 4;  // the MLP's hidden width, in multiples of dim (GPT-2)
}  // namespace

TransformerBlock::TransformerBlock(int64_t dim, int64_t heads, int64_t context, float dropout,
                                   uint64_t dropout_seed, Rng& rng)
    : dim_(dim),
      context_(context),
      shape_(describe(dim, heads, context, dropout)),
      ln1_(dim),
      attn_(dim, heads, Init::gpt, rng),
      ln2_(dim),
      mlp_(dim, kMlpWidth * dim, Init::gpt, rng),
      dropout_(dropout, dropout_seed) {}

Tensor TransformerBlock::forward(const Tensor& x) {
  bool ok = x.defined() && x.dim() == 3 && x.shape()[0] >= 1 && x.shape()[1] >= 1 &&
            x.shape()[1] <= context_ && x.shape()[2] == dim_;
  check_block_input(*this, x, ok,
                    "(B, T, " + std::to_string(dim_) + ") with 1 <= T <= " +
                        std::to_string(context_));
  Tensor h = add(x, dropout_.forward(attn_.forward(ln1_.forward(x)), training()));  // (B, T, C)
  return add(h, dropout_.forward(mlp_.forward(ln2_.forward(h)), training()));      // (B, T, C)
}

// FLOPs per sample (T = context, C = dim, H = heads):
//   ln1, ln2            2 * 7TC
//   qkv                 2*T*C*3C + 3TC (bias)
//   q @ k^T, att @ v    2 * 2*T*T*C (all heads, full T x T)
//   scale, mask         2 * H*T*T
//   softmax             5 * H*T*T
//   proj                2*T*C*C + TC (bias)
//   fc1, GELU, fc2      2*T*C*4C + 4TC (bias) + 4TC (GELU) + 2*T*4C*C + TC (bias)
//   residual adds       2 * TC      [dropout multiplies: 2 * TC when p > 0]
// = 24TC^2 + 4T^2C + 7HT^2 + 29TC [+ 2TC].
// Kept per sample, in floats (T = context, C = dim, H = heads):
//   ln1: its input x (TC) + mean, 1/std (2T)
//   qkv matmul: ln1's output (TC)
//   attention (one backend primitive, ops/attention_ops.cpp): dense copies of q, k
//     and v (3TC; they are strided views of the qkv buffer, which is not kept), its
//     output (TC) and each row's log-sum-exp (HT); the T x T scores are recomputed in
//     the backward pass, not kept
//   proj matmul: the merged heads (TC, a copy)
//   ln2: its input, the first residual sum (TC) + mean, 1/std (2T)
//   fc1 matmul: ln2's output (TC); GELU: its input (4TC); fc2 matmul: GELU's output (4TC)
//   [dropout: two masks, 2TC, when p > 0 and training]
// = 17TC + 4T + HT [+ 2TC]. The residual branches' outputs are not kept.
BlockShape TransformerBlock::describe(int64_t dim, int64_t heads, int64_t context, float dropout) {
  HT_CHECK(heads > 0 && dim % heads == 0, "TransformerBlock: ", heads, " heads for model width ",
           dim, "; expected a positive divisor of ", dim);
  const int64_t t = context, c = dim, h = heads, tc = t * c, hidden = kMlpWidth * c;
  const bool drops = dropout > 0.f;
  BlockShape s;
  s.kind = "transformer";
  s.params = 2 * cost::layernorm_params(c) + cost::linear_params(c, 3 * c, true) +
             cost::linear_params(c, c, true) + cost::linear_params(c, hidden, true) +
             cost::linear_params(hidden, c, true);
  s.sample_input_shape = {t, c};
  s.sample_output_shape = {t, c};

  const int64_t ln_flops = 2 * cost::kLayerNormFlopsPerValue * tc;
  const int64_t qkv_flops = cost::linear_flops(t, c, 3 * c, true);
  const int64_t attention_flops =
      2 * 2 * t * t * c + 2 * h * t * t + cost::kSoftmaxFlopsPerValue * h * t * t;
  const int64_t proj_flops = cost::linear_flops(t, c, c, true);
  const int64_t mlp_flops =
      cost::linear_flops(t, c, hidden, true) + hidden * t + cost::linear_flops(t, hidden, c, true);
  const int64_t residual_flops = 2 * tc + (drops ? 2 * tc : 0);
  s.flops_per_sample = ln_flops + qkv_flops + attention_flops + proj_flops + mlp_flops + residual_flops;

  const int64_t ln = cost::layernorm_saved_bytes(t, c);  // input, mean, 1/std
  const int64_t attention = tc        // qkv's input (ln1's output)
                            + 3 * tc  // dense q, k, v
                            + tc      // the attention's output
                            + h * t   // its rows' log-sum-exps
                            + tc;     // merged heads (proj's input)
  const int64_t mlp = tc + hidden * t + hidden * t;  // fc1's input, GELU input, GELU output
  const int64_t masks = drops ? 2 * tc : 0;
  s.activation_bytes_per_sample = 2 * ln + (attention + mlp + masks) * cost::kFloatBytes;
  // Backward, the MLP branch: the block output's gradient (TC), held for the residual,
  // fc2's input gradient and GELU's (4TC each) and fc1's (TC); the attention branch's
  // q, k, v gradients and the qkv gradient they make (3TC each) beside the output's and
  // the merged heads' (TC each) come to the same 10TC.
  s.workspace_bytes_per_sample = 10 * tc * cost::kFloatBytes;
  // Evaluation, the fuller of two moments. Inside the attention: ln1's output (TC), the
  // qkv buffer (3TC), its dense q, k, v (3TC), the output (TC), the rows' log-sum-exps
  // (HT) and, as the CPU computes it, each head's T x T scores and probabilities (2HT^2;
  // a GPU's fused kernel stores neither, for heads of up to kAttentionMaxHead = 128
  // values, kernels/attention.cuh). In the MLP: the first residual sum and ln2's output
  // (TC each), fc1's product and its bias add's output (4TC each).
  s.eval_bytes_per_sample = std::max(8 * tc + h * t + 2 * h * t * t, 10 * tc) * cost::kFloatBytes;
  // Wider heads take the attention composed from ops on a GPU too (ops/attention_ops.cpp),
  // which holds the scores, their masked copy and the probabilities at once: 3HT^2.
  s.eval_fused_bytes_per_sample =
      (c / h <= 128 ? std::max(8 * tc + h * t, 10 * tc) : std::max(8 * tc + h * t + 3 * h * t * t, 10 * tc)) *
      cost::kFloatBytes;
  return s;
}

std::vector<NamedTensor> TransformerBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "ln1", ln1_.named_parameters());
  append(out, "attn", attn_.named_parameters());
  append(out, "ln2", ln2_.named_parameters());
  append(out, "mlp", mlp_.named_parameters());
  return out;
}

}  // namespace ht::nn
