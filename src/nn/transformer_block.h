// Pre-LN GPT block: x + attn(ln1(x)), then h + mlp(ln2(h)), with optional dropout on
// both residual branches.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/block_shape.h"
#include "nn/causal_self_attention.h"
#include "nn/dropout.h"
#include "nn/layernorm.h"
#include "nn/mlp.h"

namespace ht::nn {

class TransformerBlock : public Block {
 public:
  // GPT initialisation (weights normal(0, 0.02), biases 0); MLP width 4 * dim.
  TransformerBlock(int64_t dim, int64_t heads, int64_t context, float dropout,
                   uint64_t dropout_seed, Rng& rng);

  // The figures of such a block, from its hyper-parameters alone (dropout counts when
  // p > 0: the figures assume training). Throws ht::Error when heads does not divide dim.
  static BlockShape describe(int64_t dim, int64_t heads, int64_t context, float dropout);

  // (B, T, C) with T <= context -> (B, T, C). The figures assume T = context.
  Tensor forward(const Tensor& x) override;

  std::string kind() const override { return shape_.kind; }
  int64_t flops_per_sample() const override { return shape_.flops_per_sample; }
  int64_t activation_bytes_per_sample() const override { return shape_.activation_bytes_per_sample; }
  int64_t workspace_bytes_per_sample() const override { return shape_.workspace_bytes_per_sample; }
  int64_t eval_bytes_per_sample() const override { return shape_.eval_bytes_per_sample; }
  int64_t eval_fused_bytes_per_sample() const override { return shape_.eval_fused_bytes_per_sample; }
  Shape sample_input_shape() const override { return shape_.sample_input_shape; }
  Shape sample_output_shape() const override { return shape_.sample_output_shape; }

  std::vector<NamedTensor> named_parameters() const override;
  uint64_t random_offset() const override { return dropout_.offset(); }
  void set_random_offset(uint64_t offset) override { dropout_.set_offset(offset); }

 private:
  int64_t dim_, context_;
  BlockShape shape_;
  LayerNorm ln1_;
  CausalSelfAttention attn_;
  LayerNorm ln2_;
  Mlp mlp_;
  Dropout dropout_;  // one stream for both residual branches
};

}  // namespace ht::nn
