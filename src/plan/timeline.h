// A timeline: what each rank did when, in one step (or one run). The simulator predicts
// one from a plan's schedules and the executor records one, in this same form, so the two
// can be joined span by span; report/trace.h writes either as a Chrome trace.
#pragma once

#include <string>

namespace ht::plan {

// One activity of one rank. Invariants (checked by report::to_chrome_trace): rank >= 0,
// end_s >= start_s, category is one of "compute", "comm", "idle".
struct Span {
  int rank = 0;
  // The schedule's op name ("Forward", "RecvGrad", ...; op_name): constants only, no free
  // text, so the simulated and measured traces can be joined on (rank, name, mb, stage).
  std::string name;
  std::string category;  // "compute" | "comm" | "idle" (idle: waiting for a peer)
  double start_s = 0, end_s = 0;  // seconds from the start of the step (or of the run)
  int micro_batch = -1;           // -1 for per-step ops
  int stage = -1;
};

}  // namespace ht::plan
