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

bool DynamicLossScale::unscale(const std::vector<Tensor>& grads) const {
  const float inverse = static_cast<float>(1.0 / scale_);
  bool finite = true;
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
    // x * 0 is 0 for every finite x and NaN for an infinity or a NaN, so the sum of
    // x * 0 is NaN exactly when some element is not finite: one float to the host.
    Tensor probe = Tensor::empty(d.shape(), DType::f32, be, "loss scale check");
    be.unary(UnaryOp::mul_scalar, d.data(), probe.data(), d.numel(), 0.f);
    Tensor sum = Tensor::empty({1}, DType::f32, be, "loss scale check");
    be.reduce(ReduceOp::sum, probe.data(), sum.data(), nullptr, 1, d.numel(), 1);
    if (!std::isfinite(sum.item())) finite = false;
  }
  return finite;
}

bool DynamicLossScale::update(bool finite) {
  if (!finite) {
    scale_ = std::max(config_.min_scale, scale_ / 2);
    clean_ = 0;
    ++skipped_;
    return false;
  }
  if (++clean_ >= config_.growth_interval) {
    scale_ = std::min(config_.max_scale, scale_ * 2);
    clean_ = 0;
  }
  return true;
}

}  // namespace ht::runtime
