// The what-if picture `hetrain plan --what-if ... --svg FILE` draws: the job as each sync
// policy played it (plan/what_if.h), one band per policy (one lane for sync and deadline,
// one per group for local), on one time axis, with every event marked across the bands:
// a stall as its span, a slow rank from its time on, a failure (its restart and the work
// lost show in the bands), a link change and a join at their times; and a legend.
//
// Its size follows what happened, not the world: the timeline's spans are merged per lane
// (PolicyOutcome::timeline), so 4,096 ranks x 1,000 steps draw as few elements as 4.
#pragma once

#include <string>
#include <vector>

#include "plan/what_if.h"

namespace ht::report {

// The time axis runs from 0 to what_if_svg_end(result, events) over x from
// kWhatIfPlotLeft to kWhatIfPlotLeft + kWhatIfPlotWidth (px).
inline constexpr double kWhatIfPlotLeft = 190, kWhatIfPlotWidth = 760;

// The axis' end: the longest played job, or an event's time (a stall's end) beyond it.
double what_if_svg_end(const plan::WhatIfResult& result, const std::vector<plan::WhatIfEvent>& events);

// A standalone SVG document; deterministic. An event's mark is a line with
// class="event-mark KIND" and data-event="its index in events" at its time's x.
std::string what_if_to_svg(const plan::WhatIfResult& result, const std::vector<plan::WhatIfEvent>& events,
                           const std::string& title);

}  // namespace ht::report
