#include "runtime/loss_scale.h"

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "core/error.h"

namespace ht::runtime {

DynamicLossScale::DynamicLossScale(const LossScaleConfig& c) : config_(c), scale_(c.initial) {
  HT_CHECK(c.min_scale > 0 && std::isfinite(c.min_scale), "loss scale: min_scale ", c.min_scale,
           " is out of range; expected a finite number > 0");
  HT_CHECK(std::isfinite(c.max_scale) && c.max_scale >= c.min_scale, "loss scale: max_scale ",
           c.max_scale, " is out of range; expected a finite number >= min_scale ", c.min_scale);
  HT_CHECK(c.initial >= c.min_scale && c.initial <= c.max_scale, "loss scale: initial ",
           c.initial, " is out of range; expected a number in [", c.min_scale, ", ", c.max_scale, "]");
  HT_CHECK(c.growth_interval >= 1, "loss scale: growth_interval ", c.growth_interval,
           " is out of range; expected at least 1 step");
}

LossScaleConfig loss_scale_config(const config::LossScaleSettings& s) {
  return {.initial = s.initial, .growth_interval = s.growth_interval, .min_scale = s.min, .max_scale = s.max};
}

void unscale_gradients(const std::vector<Tensor>& grads, double scale) {
  const float inverse = static_cast<float>(1.0 / scale);
  for (const Tensor& g : grads) {
    HT_CHECK(g.dtype() == DType::f32, "loss scale: a gradient of dtype ", dtype_name(g.dtype()),
             "; expected float32");
    if (g.numel() == 0) continue;
    // Dense, so that one unary call covers it; written back where it was a view.
    const bool view = !g.is_contiguous();
    Tensor d = view ? g.dense_copy() : g;
    Backend& be = d.backend();
    be.unary(UnaryOp::mul_scalar, d.data(), d.data(), d.numel(), inverse);
    if (view) be.copy(d.data(), d.strides(), g.data(), g.strides(), g.shape());
  }
}

void DynamicLossScale::update(bool overflowed) {
  if (overflowed) {
    scale_ = std::max(config_.min_scale, scale_ / 2);
    clean_ = 0;
    ++overflows_;
    return;
  }
  if (++clean_ >= config_.growth_interval) {
    scale_ = std::min(config_.max_scale, scale_ * 2);
    clean_ = 0;
  }
}

void DynamicLossScale::restore(double scale, int64_t clean) {
  HT_CHECK(std::isfinite(scale) && scale >= config_.min_scale && scale <= config_.max_scale, "loss scale: ", scale,
           " is outside [", config_.min_scale, ", ", config_.max_scale, "]; expected a scale within train.loss_scale's min and max");
  HT_CHECK(clean >= 0, "loss scale: ", clean, " clean steps; expected at least 0");
  scale_ = scale;
  clean_ = std::min(clean, config_.growth_interval - 1);
}

}  // namespace ht::runtime
