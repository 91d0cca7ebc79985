// The terminal view of a plan: what `hetrain plan` prints.
#pragma once

#include <string>

#include "plan/plan.h"

namespace ht::report {

// A header (config, cluster, strategy, layout), one row per rank (device, replica/stage,
// layers, share and micro-batches, memory by kind against capacity, memory strategy,
// predicted busy fraction), the prediction, the baseline and the speed-up, the memory
// strategies' reasons and the plan's notes. Consecutive ranks whose rows are identical
// but for the rank number, and the replica number where it counts up within one stage,
// share one row ("4-7", "r4-7/s0"), so a 1,024-rank plan stays readable.
std::string format_plan(const plan::Plan& plan);

}  // namespace ht::report
