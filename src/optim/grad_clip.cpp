#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ht::optim {

double clip_grad_norm(const std::vector<nn::NamedTensor>& params, float max_norm,
                      const std::function<double(double)>& global_sum) {
  HT_CHECK(max_norm > 0.f && std::isfinite(max_norm), "clip_grad_norm: max_norm ", max_norm,
           " is out of range; expected a finite max_norm > 0");
  NoGradGuard no_grad;
  // Each tensor's sum of squares runs on its device, and the floats cross to the host
  // together, in one copy: a GPU waits for its queue once a step, not once per tensor.
  // The total is kept in double there, so that many small contributions are not lost
  // next to a large one.
  std::vector<Tensor> sums;
  for (const auto& [name, p] : params) {
    HT_CHECK(p.defined(), "clip_grad_norm: parameter '", name, "' is an undefined tensor");
    Tensor g = p.grad();
    if (!g.defined()) continue;
    HT_CHECK(g.dtype() == DType::f32, "clip_grad_norm: the gradient of '", name, "' is ",
             dtype_name(g.dtype()), "; expected float32");
    sums.push_back(reshape(sum(mul(g, g)), {1}));
  }
  const bool one_device = std::all_of(sums.begin(), sums.end(),
                                      [&](const Tensor& t) { return &t.backend() == &sums.front().backend(); });
  std::vector<float> host;
  if (sums.size() > 1 && one_device) {
    host = concat(sums, 0).to_vector();
  } else {  // one tensor, or gradients on several devices: a copy each
    for (const Tensor& t : sums) host.push_back(t.item());
  }
  double total = 0.0;
  for (float x : host) total += static_cast<double>(x);
  if (global_sum) total = global_sum(total);
  double norm = std::sqrt(total);
  double scale = static_cast<double>(max_norm) / (norm + 1e-6);
  if (!(scale < 1.0)) return norm;
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // A gradient set from a strided view cannot be scaled through its buffer; give
    // the parameter a dense copy instead.
    if (!g.is_contiguous()) {
      g = clone(g);
      p.set_grad(g);
    }
    g.backend().unary(UnaryOp::mul_scalar, g.data(), g.data(), g.numel(),
                      static_cast<float>(scale));
  }
  return norm;
}

}  // namespace ht::optim
