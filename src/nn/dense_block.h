// Linear layer with an optional ReLU: the MLP's layers and the CNN's classifier.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/linear.h"

namespace ht::nn {

class DenseBlock : public Block {
 public:
  // in_shape: the per-sample input shape; its values are the Linear's input features.
  // With `flatten`, any input (B, ...) with that many values per sample is accepted
  // and flattened (images (B, 1, 28, 28) into a 784-feature layer; the CNN's
  // (B, 64, 7, 7) feature maps); without it the input must be exactly (B, in_shape...).
  DenseBlock(Shape in_shape, int64_t out_features, bool relu, bool flatten, Rng& rng);

  Tensor forward(const Tensor& x) override;  // (B, in_shape...) -> (B, out)

  std::string kind() const override { return relu_ ? "dense_relu" : "dense"; }
  int64_t flops_per_sample() const override;
  int64_t activation_bytes_per_sample() const override;
  Shape sample_input_shape() const override { return in_shape_; }
  Shape sample_output_shape() const override { return {linear_.out_features()}; }

  std::vector<NamedTensor> named_parameters() const override;

 private:
  Shape in_shape_;
  bool relu_, flatten_;
  Linear linear_;
};

}  // namespace ht::nn
