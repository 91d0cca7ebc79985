#include "optim/adamw.h"

#include <cmath>
#include <limits>

namespace ht::optim {

namespace {
const AdamWOptions& validated(const AdamWOptions& o) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  detail::check_range("AdamW", "beta1", o.beta1, 0.f, 1.f, true);
  detail::check_range("AdamW", "beta2", o.beta2, 0.f, 1.f, true);
  detail::check_range("AdamW", "eps", o.eps, 0.f, inf, true);
  detail::check_range("AdamW", "weight_decay", o.weight_decay, 0.f, inf, true);
  return o;
}
}  // namespace

AdamW::AdamW(std::vector<nn::NamedTensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), validated(options).lr, "AdamW", {"exp_avg", "exp_avg_sq"}),
      options_(options) {}

AdamWArgs AdamW::args(int64_t updates) const {
  AdamWArgs a{};
  a.lr = lr();
  a.beta1 = options_.beta1;
  a.beta2 = options_.beta2;
  a.eps = options_.eps;
  a.weight_decay = options_.weight_decay;
  // In double: beta^t for small 1 - beta loses digits in float long before t is large.
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(double{options_.beta1}, updates));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(double{options_.beta2}, updates));
  return a;
}

void AdamW::update(size_t index, const Tensor& param, const Tensor& grad, int64_t updates) {
  param.backend().adamw(param.data(), grad.data(), slot(index, 0).data(),
                        slot(index, 1).data(), param.numel(), args(updates));
}

void AdamW::update_group(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                         int64_t updates) {
  std::vector<float*> p, m, v;
  std::vector<const float*> g;
  std::vector<int64_t> n;
  for (size_t i : indices) {
    p.push_back(params()[i].second.data());
    g.push_back(grads[i].data());
    m.push_back(slot(i, 0).data());
    v.push_back(slot(i, 1).data());
    n.push_back(params()[i].second.numel());
  }
  params()[indices.front()].second.backend().adamw_multi(
      p.data(), g.data(), m.data(), v.data(), n.data(), static_cast<int>(indices.size()),
      args(updates));
}

}  // namespace ht::optim
