// The transformer's feed-forward part: Linear(dim -> hidden), GELU, Linear(hidden -> dim).
#pragma once

#include <cstdint>

#include "nn/linear.h"

namespace ht::nn {

class Mlp : public Module {
 public:
  Mlp(int64_t dim, int64_t hidden, Init init, Rng& rng);

  // (..., dim) -> (..., dim). Keeps fc1's input, the GELU input and the GELU output
  // (fc2's input).
  Tensor forward(const Tensor& x) const;

  int64_t dim() const { return fc1_.in_features(); }
  int64_t hidden() const { return fc1_.out_features(); }
  std::vector<NamedTensor> named_parameters() const override;

 private:
  Linear fc1_;  // dim -> hidden
  Linear fc2_;  // hidden -> dim
};

}  // namespace ht::nn
