// GPT input stage: token embedding plus learned position embedding, then dropout.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/block_shape.h"
#include "nn/dropout.h"
#include "nn/embedding.h"

namespace ht::nn {

class TokenEmbeddingBlock : public Block {
 public:
  TokenEmbeddingBlock(int64_t vocab, int64_t context, int64_t dim, float dropout,
                      uint64_t dropout_seed, Rng& rng);

  // The figures of such a block, from its hyper-parameters alone (the dropout mask
  // counts when p > 0: the figures assume training).
  static BlockShape describe(int64_t vocab, int64_t context, int64_t dim, float dropout);

  // ids int32 (B, T) with T <= context -> (B, T, C). The figures assume T = context.
  Tensor forward(const Tensor& ids) override;

  std::string kind() const override { return shape_.kind; }
  int64_t flops_per_sample() const override { return shape_.flops_per_sample; }
  int64_t activation_bytes_per_sample() const override { return shape_.activation_bytes_per_sample; }
  int64_t workspace_bytes_per_sample() const override { return shape_.workspace_bytes_per_sample; }
  int64_t eval_bytes_per_sample() const override { return shape_.eval_bytes_per_sample; }
  Shape sample_input_shape() const override { return shape_.sample_input_shape; }
  Shape sample_output_shape() const override { return shape_.sample_output_shape; }
  DType input_dtype() const override { return shape_.input_dtype; }

  std::vector<NamedTensor> named_parameters() const override;
  uint64_t random_offset() const override { return dropout_.offset(); }
  void set_random_offset(uint64_t offset) override { dropout_.set_offset(offset); }

 private:
  int64_t context_;
  BlockShape shape_;
  Embedding tokens_;     // (vocab, C)
  Embedding positions_;  // (context, C)
  Dropout dropout_;
};

}  // namespace ht::nn
