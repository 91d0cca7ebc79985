// GPT output stage: final LayerNorm and an untied, bias-free projection to the vocabulary.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/layernorm.h"
#include "nn/linear.h"

namespace ht::nn {

class LmHeadBlock : public Block {
 public:
  LmHeadBlock(int64_t dim, int64_t vocab, int64_t context, Rng& rng);

  // (B, T, C) with T <= context -> logits (B, T, V). The figures assume T = context.
  Tensor forward(const Tensor& x) override;

  std::string kind() const override { return "lm_head"; }
  int64_t flops_per_sample() const override;
  int64_t activation_bytes_per_sample() const override;
  Shape sample_input_shape() const override { return {context_, ln_.dim()}; }
  Shape sample_output_shape() const override { return {context_, head_.out_features()}; }

  std::vector<NamedTensor> named_parameters() const override;

 private:
  int64_t context_;
  LayerNorm ln_;
  Linear head_;  // C -> V, no bias (GPT-2); its own weight, not the token table
};

}  // namespace ht::nn
