// Adam with decoupled weight decay (Loshchilov & Hutter), PyTorch's AdamW:
//   p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// where t counts this parameter's updates (1 on its first).
#pragma once

#include "optim/optimizer.h"

namespace ht::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

// State slots: "exp_avg" (m) and "exp_avg_sq" (v).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<nn::NamedTensor> params, const AdamWOptions& options = {});
  const AdamWOptions& options() const { return options_; }  // .lr is the initial lr

 protected:
  bool slot_nonnegative(size_t k) const override { return k == 1; }  // exp_avg_sq
  void update(size_t index, const Tensor& param, const Tensor& grad, int64_t updates) override;
  void update_group(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                    int64_t updates) override;

 private:
  AdamWArgs args(int64_t updates) const;
  AdamWOptions options_;
};

}  // namespace ht::optim
