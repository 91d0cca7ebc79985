// Conv 3x3 (padding 1, stride 1) + ReLU + 2x2 max-pool: the CNN's feature stages.
#pragma once

#include <cstdint>

#include "nn/block.h"
#include "nn/block_shape.h"
#include "nn/conv2d.h"
#include "nn/maxpool2d.h"

namespace ht::nn {

class ConvBlock : public Block {
 public:
  // Input images (in_channels, height, width); output (out_channels, height/2, width/2).
  ConvBlock(int64_t in_channels, int64_t out_channels, int64_t height, int64_t width, Rng& rng);

  // The figures of such a block, from its hyper-parameters alone. Throws ht::Error for
  // an image smaller than the pooling window.
  static BlockShape describe(int64_t in_channels, int64_t out_channels, int64_t height,
                             int64_t width);

  Tensor forward(const Tensor& x) override;  // (B, C, H, W) -> (B, O, H/2, W/2)

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
  Conv2d conv_;
  MaxPool2d pool_;
};

}  // namespace ht::nn
