// 2-d convolution over NCHW with a square kernel; weight (O, C, k, k), bias (O).
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "nn/init.h"
#include "nn/module.h"

namespace ht::nn {

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
         int64_t padding, bool bias, Init init, Rng& rng);

  // (N, C, H, W) -> (N, O, H', W'). Keeps its (dense) input for backward.
  Tensor forward(const Tensor& x) const;

  // Output height or width for an input extent of `size`.
  static constexpr int64_t out_size(int64_t size, int64_t kernel, int64_t stride, int64_t padding) {
    return (size + 2 * padding - kernel) / stride + 1;
  }
  int64_t out_size(int64_t size) const { return out_size(size, kernel_, stride_, padding_); }

  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  int64_t kernel() const { return kernel_; }

  std::vector<NamedTensor> named_parameters() const override;

 private:
  int64_t in_, out_, kernel_, stride_, padding_;
  Tensor weight_;  // (O, C, k, k)
  Tensor bias_;    // (O)
};

}  // namespace ht::nn
