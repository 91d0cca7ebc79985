// Fully connected layer, PyTorch layout: weight (out, in), bias (out).
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "nn/init.h"
#include "nn/module.h"

namespace ht::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Init init, Rng& rng);

  // (..., in) -> (..., out). Keeps x for backward (the weight needs its gradient).
  Tensor forward(const Tensor& x) const;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const Tensor& weight() const { return weight_; }  // (out, in)
  const Tensor& bias() const { return bias_; }      // (out) or undefined

  std::vector<NamedTensor> named_parameters() const override;

 private:
  int64_t in_, out_;
  Tensor weight_;  // (out, in)
  Tensor bias_;    // (out)
};

}  // namespace ht::nn
