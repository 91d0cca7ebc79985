// Inverted dropout driven by a counter-based mask stream: a block owns one stream
// (its seed) and each call draws the next `numel` positions of it (the offset), so
// successive calls get fresh masks while (seed, offset) still pins each mask down
// for replay on recomputation or another backend.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace ht::nn {

class Dropout {
 public:
  Dropout(float p, uint64_t seed);

  // x itself when inactive (p == 0 or not training); otherwise x * mask, which keeps
  // the float mask (x's shape) alive for backward.
  Tensor forward(const Tensor& x, bool training);

  bool active(bool training) const { return training && p_ > 0.f; }
  float p() const { return p_; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }  // rewind for a replay

 private:
  float p_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

}  // namespace ht::nn
