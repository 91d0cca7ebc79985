// Layer normalisation over the last axis with learned gain (1) and shift (0).
#pragma once

#include <cstdint>

#include "nn/module.h"

namespace ht::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);

  // (..., dim) -> (..., dim). Keeps its input and a mean and 1/std per row.
  Tensor forward(const Tensor& x) const;

  int64_t dim() const { return dim_; }
  std::vector<NamedTensor> named_parameters() const override;

 private:
  int64_t dim_;
  float eps_;
  Tensor gamma_;  // (dim)
  Tensor beta_;   // (dim)
};

}  // namespace ht::nn
