#include "nn/maxpool2d.h"

#include "core/error.h"
#include "ops/ops.h"

namespace ht::nn {

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride) : kernel_(kernel), stride_(stride) {
  HT_CHECK(kernel_ > 0 && stride_ > 0, "MaxPool2d: kernel ", kernel_, ", stride ", stride_,
           "; expected both positive");
}

Tensor MaxPool2d::forward(const Tensor& x) const { return maxpool2d(x, kernel_, stride_); }

}  // namespace ht::nn
