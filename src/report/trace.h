// Chrome trace-event JSON (opens in Perfetto and chrome://tracing): the one timeline format
// shared by the simulator (predicted) and the executor (measured), so a prediction and a
// real run can be laid side by side and the cost model calibrated against the difference.
#pragma once

#include <string>
#include <vector>

namespace ht::report {

// One activity of one rank. Invariants (checked by to_chrome_trace): rank >= 0,
// end_s >= start_s, category is one of "compute", "comm", "idle".
struct Span {
  int rank = 0;
  // The schedule's op name ("Forward", "RecvGrad", ...; plan::op_name): constants only, no
  // free text, so the simulated and measured traces can be joined on (rank, name, mb, stage).
  std::string name;
  std::string category;  // "compute" | "comm" | "idle" (idle: waiting for a peer)
  double start_s = 0, end_s = 0;  // seconds from the start of the step (or of the run)
  int micro_batch = -1;           // -1 for per-step ops
  int stage = -1;
};

// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"title": title}}.
// Each span becomes one complete event ("ph": "X", ts and dur in microseconds, pid 0,
// tid = rank, args {micro_batch, stage}); each rank that has a span gets a "thread_name"
// metadata event naming its lane "rank N" (and a sort index, so lanes appear in rank order).
// Events keep the order of `spans`; viewers sort by ts themselves.
std::string to_chrome_trace(const std::vector<Span>& spans, const std::string& title);

}  // namespace ht::report
