#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ht::optim {

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps)
    return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (type != "cosine") return base_lr;
  int64_t span = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return min_lr + static_cast<float>(0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace ht::optim
