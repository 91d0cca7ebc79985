// The plan as one picture: the predicted per-rank timeline of one step (compute, comm and
// idle in distinct colours) and, beneath it, each rank's memory bar against its capacity.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"
#include "report/trace.h"

namespace ht::report {

// A standalone SVG document. `timeline` is the simulator's (SimResult::timeline) for the
// plan; spans of zero length are not drawn. Deterministic: the same input gives the same
// bytes.
std::string plan_to_svg(const plan::Plan& plan, const std::vector<Span>& timeline);

}  // namespace ht::report
