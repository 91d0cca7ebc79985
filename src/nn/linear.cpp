#include "nn/linear.h"

#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace ht::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Init init, Rng& rng)
    : in_(in_features), out_(out_features) {
  HT_CHECK(in_ > 0 && out_ > 0, "Linear: sizes ", in_, " -> ", out_,
           "; expected positive input and output features");
  if (init == Init::gpt) {
    weight_ = normal_parameter({out_, in_}, kGptInitStd, rng);
    if (bias) bias_ = constant_parameter({out_}, 0.f);
  } else {
    float bound = 1.f / std::sqrt(static_cast<float>(in_));
    weight_ = uniform_parameter({out_, in_}, bound, rng);
    if (bias) bias_ = uniform_parameter({out_}, bound, rng);
  }
}

Tensor Linear::forward(const Tensor& x) const {
  HT_CHECK(x.defined() && x.dim() >= 1 && x.shape().back() == in_, "Linear(", in_, " -> ", out_,
           "): input of shape ", x.defined() ? to_string(x.shape()) : "undefined",
           "; expected (..., ", in_, ")");
  // matmul reads the transposed view as a transposed gemm operand: no copy of W.
  Tensor y = matmul(x, transpose(weight_, 0, 1));  // (..., out)
  return bias_.defined() ? add(y, bias_) : y;
}

std::vector<NamedTensor> Linear::named_parameters() const {
  std::vector<NamedTensor> out{{"weight", weight_}};
  if (bias_.defined()) out.emplace_back("bias", bias_);
  return out;
}

}  // namespace ht::nn
