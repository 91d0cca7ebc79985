// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_: when the
// norm over all gradients exceeds max_norm, every gradient is scaled in place by
// max_norm / (norm + 1e-6). Parameters without a gradient are skipped.
#pragma once

#include <functional>
#include <vector>

#include "nn/module.h"

namespace ht::optim {

// Returns the norm before clipping. Check it for inf/NaN to skip a step: an infinite
// norm scales every gradient by 0 (inf entries become NaN); a NaN norm scales nothing.
// When the model is split over ranks (pipeline stages), `global_sum` turns this rank's
// sum of squares into the whole model's (a sum over the stages), so every stage clips by
// the same global norm.
double clip_grad_norm(const std::vector<nn::NamedTensor>& params, float max_norm,
                      const std::function<double(double)>& global_sum = {});

}  // namespace ht::optim
