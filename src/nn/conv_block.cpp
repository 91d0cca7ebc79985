#include "nn/conv_block.h"

#include "core/error.h"
#include "nn/block_input.h"
#include "nn/cost_model.h"
#include "ops/ops.h"

namespace ht::nn {

ConvBlock::ConvBlock(int64_t in_channels, int64_t out_channels, int64_t height, int64_t width,
                     Rng& rng)
    : height_(height),
      width_(width),
      conv_(in_channels, out_channels, 3, 1, 1, true, Init::torch_default, rng),
      pool_(2, 2) {
  HT_CHECK(height_ >= 2 && width_ >= 2, "ConvBlock: image ", height_, "x", width_,
           "; expected at least 2x2 for the 2x2 pooling");
}

Shape ConvBlock::sample_input_shape() const { return {conv_.in_channels(), height_, width_}; }

Shape ConvBlock::sample_output_shape() const {
  return {conv_.out_channels(), pool_.out_size(conv_.out_size(height_)),
          pool_.out_size(conv_.out_size(width_))};
}

Tensor ConvBlock::forward(const Tensor& x) {
  check_block_input(*this, x);
  return pool_.forward(relu(conv_.forward(x)));
}

// FLOPs, with O output channels over the conv's H x W output and the pooled H' x W':
// 2 * O*H*W * C*3*3 (multiply-adds) + O*H*W (bias) + O*H*W (ReLU) + 3 * O*H'*W'
// (2x2 pooling: 3 comparisons per output).
int64_t ConvBlock::flops_per_sample() const {
  int64_t c = conv_.in_channels(), o = conv_.out_channels(), k = conv_.kernel();
  int64_t hw = conv_.out_size(height_) * conv_.out_size(width_);
  Shape out = sample_output_shape();
  int64_t pooled = out[0] * out[1] * out[2];
  return 2 * o * hw * c * k * k + o * hw + o * hw + (pool_.kernel() * pool_.kernel() - 1) * pooled;
}

// Kept: conv2d's input (C*H*W floats, the block input), the ReLU output (O*H*W
// floats, which is also what the pooling reads) and the pooling's int32 argmax
// (O*H'*W'). The conv output is not kept: ReLU keeps its output, not its input.
int64_t ConvBlock::activation_bytes_per_sample() const {
  int64_t in = numel(sample_input_shape());
  int64_t conv_out = conv_.out_channels() * conv_.out_size(height_) * conv_.out_size(width_);
  int64_t pooled = numel(sample_output_shape());
  return (in + conv_out) * cost::kFloatBytes + pooled * cost::kIntBytes;
}

std::vector<NamedTensor> ConvBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "conv", conv_.named_parameters());
  return out;
}

}  // namespace ht::nn
