// Learning-rate schedules: constant, or cosine decay to a floor; both with an optional
// linear warmup. A pure function of the step, so a resumed run needs no schedule state.
#pragma once

#include <cstdint>
#include <string>

namespace ht::optim {

struct LrSchedule {
  std::string type = "constant";  // "constant" | "cosine"
  float base_lr = 1e-3f;
  int64_t warmup_steps = 0;  // lr rises linearly to base_lr over these steps
  float min_lr = 0.f;        // cosine floor, reached at the last step
  int64_t total_steps = 1;

  // Learning rate for 0-based `step`.
  float at(int64_t step) const;
};

}  // namespace ht::optim
