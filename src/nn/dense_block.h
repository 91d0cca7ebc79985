// Linear layer with an optional ReLU: the MLP's layers and the CNN's classifier.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/block_shape.h"
#include "nn/linear.h"

namespace ht::nn {

class DenseBlock : public Block {
 public:
  // in_shape: the per-sample input shape; its values are the Linear's input features.
  // With `flatten`, any input (B, ...) with that many values per sample is accepted
  // and flattened (images (B, 1, 28, 28) into a 784-feature layer; the CNN's
  // (B, 64, 7, 7) feature maps); without it the input must be exactly (B, in_shape...).
  DenseBlock(Shape in_shape, int64_t out_features, bool relu, bool flatten, Rng& rng);

  // The figures of such a block, from its hyper-parameters alone (`flatten` changes none).
  static BlockShape describe(const Shape& in_shape, int64_t out_features, bool relu);

  Tensor forward(const Tensor& x) override;  // (B, in_shape...) -> (B, out)

  std::string kind() const override { return shape_.kind; }
  int64_t flops_per_sample() const override { return shape_.flops_per_sample; }
  int64_t activation_bytes_per_sample() const override { return shape_.activation_bytes_per_sample; }
  int64_t workspace_bytes_per_sample() const override { return shape_.workspace_bytes_per_sample; }
  int64_t eval_bytes_per_sample() const override { return shape_.eval_bytes_per_sample; }
  Shape sample_input_shape() const override { return shape_.sample_input_shape; }
  Shape sample_output_shape() const override { return shape_.sample_output_shape; }

  std::vector<NamedTensor> named_parameters() const override;

 private:
  BlockShape shape_;
  bool relu_, flatten_;
  Linear linear_;
};

}  // namespace ht::nn
