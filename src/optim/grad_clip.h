// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_: when the
// norm over all gradients exceeds max_norm, every gradient is scaled in place by
// max_norm / (norm + 1e-6). Parameters without a gradient are skipped.
#pragma once

#include <vector>

#include "nn/module.h"

namespace ht::optim {

// Returns the norm before clipping. Check it for inf/NaN to skip a step: an infinite
// norm scales every gradient by 0 (inf entries become NaN); a NaN norm scales nothing.
double clip_grad_norm(const std::vector<nn::NamedTensor>& params, float max_norm);
double clip_grad_norm(const std::vector<Tensor>& params, float max_norm);

}  // namespace ht::optim
