#include "optim/make_optimizer.h"

#include "optim/adamw.h"
#include "optim/sgd.h"

namespace ht::optim {

std::unique_ptr<Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                          std::vector<nn::NamedTensor> params) {
  if (c.type == "sgd")
    return std::make_unique<SGD>(std::move(params),
                                 SgdOptions{c.lr, c.momentum, c.weight_decay, c.nesterov});
  return std::make_unique<AdamW>(std::move(params),
                                 AdamWOptions{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay});
}

}  // namespace ht::optim
