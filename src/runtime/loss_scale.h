// The dynamic loss scale (train.loss_scale; implied by train.precision fp16): fp16's
// narrow range (smallest normal 2^-14) flushes small gradients to zero unless the loss,
// and with it every gradient, is scaled up first. The scale is as large as the gradients
// allow: it halves after a step in which some replica's gradients overflowed and
// doubles after `growth_interval` clean steps in a row.
//
// How the executor uses it (runtime/executor_sync.cpp), once per step:
//   1. the backward pass is seeded with scale() x the loss's usual 1 / (global batch);
//   2. the bad-node guard judges each replica's scaled contribution before it leaves
//      the rank (its norm divided by the scale, so the history holds true norms); a
//      non-finite one is an overflow while the scale is above its least: left out of the
//      step like any bad contribution, but no offence towards quarantine. At the least
//      scale an overflow is no longer curable by scaling, and counts as the guard's
//      non-finite gradient;
//   3. after the reduction every member of the stage group holds every member's verdict,
//      so each calls update(overflowed) with the same value and all keep one scale,
//      without another message;
//   4. unscale_gradients divides the reduced gradients by the step's scale before
//      clipping and the optimiser.
// A step whose every contribution overflowed (the only replica's, say) is skipped, as
// any step with nothing kept. Under parallel.sync local each group keeps its own scale.
// Under deadline a contribution is unscaled before it leaves the rank (a stale one was
// computed under an older scale), the verdicts of step 3 come in the step's record, and
// a catch-up carries the scale.
//
// The scales are powers of two (config.cpp checks the settings), so scaling and
// unscaling change no bit of a gradient in fp32 while nothing overflows or underflows.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "tensor/tensor.h"

namespace ht::runtime {

struct LossScaleConfig {
  // 2^16: large enough that gradients near fp16's smallest normal survive, small enough
  // that the first overflows halve it into the gradients' range within a handful of
  // steps, not dozens (PyTorch's GradScaler starts there too).
  double initial = 65536;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale doubles
  double min_scale = 1;            // the scale never halves below this
  double max_scale = 16777216;     // 2^24: it never doubles above this
};

LossScaleConfig loss_scale_config(const config::LossScaleSettings& s);

// Divides each gradient (float32, any backend, any strides) by `scale` in place.
void unscale_gradients(const std::vector<Tensor>& grads, double scale);

class DynamicLossScale {
 public:
  // Throws ht::Error naming the field when a setting is out of range (initial and
  // min_scale > 0, min_scale <= initial <= max_scale, growth_interval >= 1).
  explicit DynamicLossScale(const LossScaleConfig& config = {});

  double scale() const { return scale_; }
  double min_scale() const { return config_.min_scale; }
  double max_scale() const { return config_.max_scale; }
  int64_t clean_steps() const { return clean_; }        // since the last change of the scale
  int64_t overflow_steps() const { return overflows_; }  // steps that halved the scale
  // The scale's exponent: scale() is 2^log2_scale() (the settings are powers of two).
  int log2_scale() const { return std::ilogb(scale_); }
  // After a step: an overflow halves the scale (not below min_scale) and starts counting
  // clean steps afresh; a clean step doubles it (not above max_scale) when it is the
  // growth_interval-th in a row.
  void update(bool overflowed);
  // A checkpoint's state (scale and clean steps), on resume. Throws ht::Error naming the
  // value when the scale is outside [min_scale, max_scale] or clean is negative.
  void restore(double scale, int64_t clean);

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t clean_ = 0, overflows_ = 0;
};

}  // namespace ht::runtime
