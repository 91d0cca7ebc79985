// Causal multi-head self-attention: one fused qkv projection (C -> 3C), heads split
// as views of that one buffer, ht::causal_attention, heads merged, output projection.
#pragma once

#include <cstdint>

#include "nn/linear.h"

namespace ht::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads, Init init, Rng& rng);

  // (B, T, C) -> (B, T, C).
  Tensor forward(const Tensor& x) const;

  int64_t dim() const { return dim_; }
  int64_t heads() const { return heads_; }
  std::vector<NamedTensor> named_parameters() const override;

 private:
  int64_t dim_, heads_;
  Linear qkv_;   // C -> 3C, laid out [q | k | v], each head-major (H, D)
  Linear proj_;  // C -> C
};

}  // namespace ht::nn
