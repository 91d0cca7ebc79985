// Chrome trace-event JSON (opens in Perfetto and chrome://tracing): the one timeline format
// shared by the simulator (predicted) and the executor (measured), so a prediction and a
// real run can be laid side by side and the cost model calibrated against the difference.
#pragma once

#include <string>
#include <vector>

#include "plan/timeline.h"

namespace ht::report {

// The spans are the plan's (simulated) or the executor's (measured) timeline.
using plan::Span;

// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"title": title}}.
// Each span becomes one complete event ("ph": "X", ts and dur in microseconds, pid 0,
// tid = rank, args {micro_batch, stage}); each rank that has a span gets a "thread_name"
// metadata event naming its lane "rank N" (and a sort index, so lanes appear in rank order).
// Events keep the order of `spans`; viewers sort by ts themselves.
std::string to_chrome_trace(const std::vector<Span>& spans, const std::string& title);

}  // namespace ht::report
