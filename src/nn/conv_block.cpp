#include "nn/conv_block.h"

#include "core/error.h"
#include "nn/block_input.h"
#include "nn/cost_model.h"
#include "ops/ops.h"

namespace ht::nn {

namespace {
// Conv 3x3, stride 1, padding 1 (the image keeps its size); 2x2 pooling, stride 2.
constexpr int64_t kKernel = 3, kStride = 1, kPadding = 1, kPool = 2;
}  // namespace

ConvBlock::ConvBlock(int64_t in_channels, int64_t out_channels, int64_t height, int64_t width,
                     Rng& rng)
    : shape_(describe(in_channels, out_channels, height, width)),
      conv_(in_channels, out_channels, kKernel, kStride, kPadding, true, Init::torch_default, rng),
      pool_(kPool, kPool) {}

Tensor ConvBlock::forward(const Tensor& x) {
  check_block_input(*this, x);
  return pool_.forward(relu(conv_.forward(x)));
}

// FLOPs, with O output channels over the conv's H x W output and the pooled H' x W':
// 2 * O*H*W * C*3*3 (multiply-adds) + O*H*W (bias) + O*H*W (ReLU) + 3 * O*H'*W'
// (2x2 pooling: 3 comparisons per output).
// Kept: conv2d's input (C*H*W floats, the block input), the ReLU output (O*H*W
// floats, which is also what the pooling reads) and the pooling's int32 argmax
// (O*H'*W'). The conv output is not kept: ReLU keeps its output, not its input.
BlockShape ConvBlock::describe(int64_t in_channels, int64_t out_channels, int64_t height,
                               int64_t width) {
  HT_CHECK(height >= kPool && width >= kPool, "ConvBlock: image ", height, "x", width,
           "; expected at least ", kPool, "x", kPool, " for the ", kPool, "x", kPool, " pooling");
  const int64_t c = in_channels, o = out_channels;
  const int64_t conv_h = Conv2d::out_size(height, kKernel, kStride, kPadding);
  const int64_t conv_w = Conv2d::out_size(width, kKernel, kStride, kPadding);
  const int64_t hw = conv_h * conv_w;
  BlockShape s;
  s.kind = "conv_relu_pool";
  s.params = cost::conv2d_params(c, o, kKernel, true);
  s.sample_input_shape = {c, height, width};
  s.sample_output_shape = {o, MaxPool2d::out_size(conv_h, kPool, kPool),
                           MaxPool2d::out_size(conv_w, kPool, kPool)};
  const int64_t pooled = numel(s.sample_output_shape);
  s.flops_per_sample = 2 * o * hw * c * kKernel * kKernel + o * hw + o * hw + (kPool * kPool - 1) * pooled;
  s.activation_bytes_per_sample =
      (numel(s.sample_input_shape) + o * hw) * cost::kFloatBytes + pooled * cost::kIntBytes;
  // Backward: the pooled output's gradient (O*H'*W'), the pooling's input gradient and
  // ReLU's (O*H*W each), the convolution's input gradient (C*H*W).
  s.workspace_bytes_per_sample = (pooled + 2 * o * hw + numel(s.sample_input_shape)) * cost::kFloatBytes;
  // Evaluation, while pooling: the conv output (a temporary until the block returns),
  // ReLU's, the pooled output and its int32 argmax. The convolution's unfolded columns
  // (at most 512 KiB or one sample's, backend/cpu/cpu_window.cpp) are not per sample.
  s.eval_bytes_per_sample = 2 * o * hw * cost::kFloatBytes + pooled * (cost::kFloatBytes + cost::kIntBytes);
  s.eval_fused_bytes_per_sample = s.eval_bytes_per_sample;
  return s;
}

std::vector<NamedTensor> ConvBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "conv", conv_.named_parameters());
  return out;
}

}  // namespace ht::nn
