// Stochastic gradient descent with PyTorch's semantics (dampening 0):
//   g = grad + weight_decay * p
//   buf = g on a parameter's first update, else momentum * buf + g   (momentum > 0)
//   g = nesterov ? g + momentum * buf : buf                           (momentum > 0)
//   p -= lr * g
#pragma once

#include "optim/optimizer.h"

namespace ht::optim {

struct SgdOptions {
  float lr = 1e-3f;
  float momentum = 0.f;
  float weight_decay = 0.f;  // coupled: added to the gradient, as PyTorch's SGD
  bool nesterov = false;     // requires momentum > 0
};

// State slot (only when momentum > 0): "momentum_buffer".
class SGD : public Optimizer {
 public:
  SGD(std::vector<nn::NamedTensor> params, const SgdOptions& options);
  const SgdOptions& options() const { return options_; }  // .lr is the initial lr

 protected:
  void update(size_t index, const Tensor& param, const Tensor& grad, int64_t updates) override;
  void update_group(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                    int64_t updates) override;

 private:
  SgdArgs args(int64_t updates) const;
  SgdOptions options_;
};

}  // namespace ht::optim
