// GPT output stage: final LayerNorm and an untied, bias-free projection to the vocabulary.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/block_shape.h"
#include "nn/layernorm.h"
#include "nn/linear.h"

namespace ht::nn {

class LmHeadBlock : public Block {
 public:
  LmHeadBlock(int64_t dim, int64_t vocab, int64_t context, Rng& rng);

  // The figures of such a block, from its hyper-parameters alone.
  static BlockShape describe(int64_t dim, int64_t vocab, int64_t context);

  // (B, T, C) with T <= context -> logits (B, T, V). The figures assume T = context.
  Tensor forward(const Tensor& x) override;

  std::string kind() const override { return shape_.kind; }
  int64_t flops_per_sample() const override { return shape_.flops_per_sample; }
  int64_t activation_bytes_per_sample() const override { return shape_.activation_bytes_per_sample; }
  int64_t workspace_bytes_per_sample() const override { return shape_.workspace_bytes_per_sample; }
  int64_t eval_bytes_per_sample() const override { return shape_.eval_bytes_per_sample; }
  Shape sample_input_shape() const override { return shape_.sample_input_shape; }
  Shape sample_output_shape() const override { return shape_.sample_output_shape; }

  std::vector<NamedTensor> named_parameters() const override;

 private:
  int64_t context_;
  BlockShape shape_;
  LayerNorm ln_;
  Linear head_;  // C -> V, no bias (GPT-2); its own weight, not the token table
};

}  // namespace ht::nn
