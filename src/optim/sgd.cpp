#include "optim/sgd.h"

#include <limits>

#include "core/error.h"

namespace ht::optim {

namespace {
const SgdOptions& validated(const SgdOptions& o) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  detail::check_range("SGD", "momentum", o.momentum, 0.f, inf, true);
  detail::check_range("SGD", "weight_decay", o.weight_decay, 0.f, inf, true);
  // Without momentum there is no buffer to look ahead along, so Nesterov would
  // silently be plain SGD; PyTorch rejects it for the same reason.
  HT_CHECK(!o.nesterov || o.momentum > 0.f, "SGD: nesterov needs momentum > 0; got momentum ",
           o.momentum);
  return o;
}

// Plain SGD keeps no buffer, so its checkpoint carries none.
std::vector<std::string> slots_for(const SgdOptions& o) {
  if (o.momentum > 0.f) return {"momentum_buffer"};
  return {};
}
}  // namespace

SGD::SGD(std::vector<nn::NamedTensor> params, const SgdOptions& options)
    : Optimizer(std::move(params), validated(options).lr, "SGD", slots_for(options)),
      options_(options) {}

SgdArgs SGD::args(int64_t updates) const {
  SgdArgs a{};
  a.lr = lr();
  a.momentum = options_.momentum;
  a.weight_decay = options_.weight_decay;
  a.nesterov = options_.nesterov;
  a.first_step = updates == 1;
  return a;
}

void SGD::update(size_t index, const Tensor& param, const Tensor& grad, int64_t updates) {
  float* buf = options_.momentum > 0.f ? slot(index, 0).data() : nullptr;
  param.backend().sgd(param.data(), grad.data(), buf, param.numel(), args(updates));
}

void SGD::update_group(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                       int64_t updates) {
  const bool momentum = options_.momentum > 0.f;
  std::vector<float*> p, b;
  std::vector<const float*> g;
  std::vector<int64_t> n;
  for (size_t i : indices) {
    p.push_back(params()[i].second.data());
    g.push_back(grads[i].data());
    if (momentum) b.push_back(slot(i, 0).data());
    n.push_back(params()[i].second.numel());
  }
  params()[indices.front()].second.backend().sgd_multi(
      p.data(), g.data(), momentum ? b.data() : nullptr, n.data(),
      static_cast<int>(indices.size()), args(updates));
}

}  // namespace ht::optim
