#include "nn/conv2d.h"

#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace ht::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t padding, bool bias, Init init, Rng& rng)
    : in_(in_channels), out_(out_channels), kernel_(kernel), stride_(stride), padding_(padding) {
  HT_CHECK(in_ > 0 && out_ > 0 && kernel_ > 0 && stride_ > 0 && padding_ >= 0,
           "Conv2d: channels ", in_, " -> ", out_, ", kernel ", kernel_, ", stride ", stride_,
           ", padding ", padding_,
           "; expected positive channels, kernel and stride and a non-negative padding");
  Shape w{out_, in_, kernel_, kernel_};
  if (init == Init::gpt) {
    weight_ = normal_parameter(w, kGptInitStd, rng);
    if (bias) bias_ = constant_parameter({out_}, 0.f);
  } else {
    // PyTorch: fan_in counts every weight feeding one output value.
    float bound = 1.f / std::sqrt(static_cast<float>(in_ * kernel_ * kernel_));
    weight_ = uniform_parameter(w, bound, rng);
    if (bias) bias_ = uniform_parameter({out_}, bound, rng);
  }
}

Tensor Conv2d::forward(const Tensor& x) const {
  HT_CHECK(x.defined() && x.dim() == 4 && x.shape()[1] == in_, "Conv2d(", in_, " -> ", out_,
           ", ", kernel_, "x", kernel_, "): input of shape ",
           x.defined() ? to_string(x.shape()) : "undefined", "; expected (N, ", in_, ", H, W)");
  return conv2d(x, weight_, bias_, stride_, padding_);
}

std::vector<NamedTensor> Conv2d::named_parameters() const {
  std::vector<NamedTensor> out{{"weight", weight_}};
  if (bias_.defined()) out.emplace_back("bias", bias_);
  return out;
}

}  // namespace ht::nn
