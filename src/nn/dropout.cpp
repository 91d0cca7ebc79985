#include "nn/dropout.h"

#include "core/error.h"
#include "ops/ops.h"

namespace ht::nn {

Dropout::Dropout(float p, uint64_t seed) : p_(p), seed_(seed) {
  HT_CHECK(p_ >= 0.f && p_ < 1.f, "Dropout: probability ", p_, "; expected 0 <= p < 1");
}

Tensor Dropout::forward(const Tensor& x, bool training) {
  if (!active(training)) return x;
  Tensor y = dropout(x, p_, seed_, offset_);
  offset_ += static_cast<uint64_t>(x.numel());
  return y;
}

}  // namespace ht::nn
