// Max-pooling over NCHW with a square window. No parameters; a Module only so that
// it composes like the other layers.
#pragma once

#include <cstdint>

#include "nn/module.h"

namespace ht::nn {

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride);

  // (N, C, H, W) -> (N, C, H', W'). Keeps an int32 argmax per output for backward.
  Tensor forward(const Tensor& x) const;

  static constexpr int64_t out_size(int64_t size, int64_t kernel, int64_t stride) {
    return (size - kernel) / stride + 1;
  }
  int64_t out_size(int64_t size) const { return out_size(size, kernel_, stride_); }
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }

  std::vector<NamedTensor> named_parameters() const override { return {}; }

 private:
  int64_t kernel_, stride_;
};

}  // namespace ht::nn
