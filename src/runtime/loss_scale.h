// The dynamic loss scale of fp16 training: fp16's narrow range (smallest normal 2^-14)
// flushes small gradients to zero unless the loss, and with it every gradient, is scaled
// up first. The scale is as large as the gradients allow: it halves whenever a step's
// gradients overflow (that step is skipped) and doubles after `growth_interval` clean
// steps in a row.
//
// Use, once per optimiser step:
//   1. seed the backward pass with scale() instead of 1 (the loss's gradient);
//   2. unscale(grads) before any reduction, clipping, guard or optimiser sees them: it
//      divides every gradient by the scale and says whether all of them are finite;
//   3. update(finite): false means skip the optimiser step (the scale has halved).
//
// The class is device-independent: unscale runs through each gradient's own backend
// (mul_scalar and a sum), and reads one float per gradient back to the host.
//
// Not wired: the executor does not use it, and train.precision "fp16" is refused as not
// built (the CUDA backend's precision_refusal). After an overflow every replica must skip
// the step and halve its scale together, whereas the bad-node guard (runtime/guard.h)
// treats a non-finite gradient as a bad contribution, leaving that replica out and
// counting it towards quarantine; wiring it needs the replicas to agree on the overflow
// before the guard judges.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace ht::runtime {

struct LossScaleConfig {
  // 2^16: large enough that gradients near fp16's smallest normal survive, small enough
  // that a first overflow costs a handful of skipped steps, not dozens (PyTorch's
  // GradScaler starts there too).
  double initial = 65536;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale doubles
  double min_scale = 1;            // the scale never halves below this
  double max_scale = 16777216;     // 2^24: it never doubles above this
};

class DynamicLossScale {
 public:
  // Throws ht::Error naming the field when a setting is out of range (initial and
  // min_scale > 0, min_scale <= initial <= max_scale, growth_interval >= 1).
  explicit DynamicLossScale(const LossScaleConfig& config = {});

  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_; }  // since the last change of the scale
  int64_t skipped_steps() const { return skipped_; }

  // Divides each gradient (float32, any backend, any strides) by scale() in place;
  // returns whether every element of every gradient is finite afterwards.
  bool unscale(const std::vector<Tensor>& grads) const;
  // After unscale: returns whether the optimiser steps. Non-finite: skip, halve the scale
  // (not below min_scale), start counting clean steps afresh. Finite: step, and double
  // the scale (not above max_scale) on the growth_interval-th clean step in a row.
  bool update(bool finite);

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t clean_ = 0, skipped_ = 0;
};

}  // namespace ht::runtime
