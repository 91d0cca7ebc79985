#include "nn/layernorm.h"

#include "core/error.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace ht::nn {

LayerNorm::LayerNorm(int64_t dim, float eps) : dim_(dim), eps_(eps) {
  HT_CHECK(dim_ > 0, "LayerNorm: dimension ", dim_, "; expected a positive size");
  gamma_ = constant_parameter({dim_}, 1.f);
  beta_ = constant_parameter({dim_}, 0.f);
}

Tensor LayerNorm::forward(const Tensor& x) const { return layernorm(x, gamma_, beta_, eps_); }

std::vector<NamedTensor> LayerNorm::named_parameters() const {
  return {{"weight", gamma_}, {"bias", beta_}};
}

}  // namespace ht::nn
