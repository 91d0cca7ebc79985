// The optimiser a config names, over the given parameters: what the trainer steps with
// and what the probe times.
#pragma once

#include <memory>
#include <vector>

#include "config/config.h"
#include "optim/optimizer.h"

namespace ht::optim {

std::unique_ptr<Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                          std::vector<nn::NamedTensor> params);

}  // namespace ht::optim
