#include "nn/mlp.h"

#include "ops/ops.h"

namespace ht::nn {

Mlp::Mlp(int64_t dim, int64_t hidden, Init init, Rng& rng)
    : fc1_(dim, hidden, true, init, rng), fc2_(hidden, dim, true, init, rng) {}

Tensor Mlp::forward(const Tensor& x) const {
  Tensor h = gelu(fc1_.forward(x));  // (..., hidden)
  return fc2_.forward(h);            // (..., dim)
}

std::vector<NamedTensor> Mlp::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "fc1", fc1_.named_parameters());
  append(out, "fc2", fc2_.named_parameters());
  return out;
}

}  // namespace ht::nn
