// The second interpreter of a plan: runs the per-rank schedules of schedule.h against a
// cost model instead of tensors and MPI, and predicts the step time, per-rank busy, comm
// and idle time, the pipeline bubble, peak activation memory and a timeline in the same
// form the executor records (plan/timeline.h).
//
// Communication semantics (check_schedules' lock-step sweep, plan/schedule.h's sweep(),
// with clocks):
//  - A send and its receive complete together. The transfer starts when BOTH ends have
//    reached the pair (rendezvous) and lasts message_seconds(src, dst, bytes); both ranks
//    are busy ("comm") for that time, and a rank that arrives first is idle until the
//    other arrives. This is conservative: an eager (buffered) send would let the sender
//    run on, so real small messages may finish earlier than predicted, never later. It is
//    also the only model under which a schedule that passes check_schedules is guaranteed
//    not to block in MPI, so predicting with it keeps prediction and execution consistent.
//  - ReduceGrads of stage s is a collective over every rank holding a ReduceGrads for s:
//    it starts when the last of them arrives and ends at start + max of their
//    reduce_seconds(rank, s), for all of them. GatherWeights likewise, with gather_seconds.
//  - AlignReplica of replica r is a collective over the ranks holding one for r: it starts
//    when the last arrives and lasts the slowest message_seconds(a, b, kAlignBytes)
//    between two of them (each sends its word to every other at once).
//  - ReduceStart and ShareWeights post messages and take no time: the overlapped
//    reduction is charged whole at ReduceGrads (no credit for the overlap, so a
//    conservative prediction), the hub's word at the AwaitWeights that waits for it, from
//    when it was posted plus message_seconds(hub, rank, 1).
//  - Every other instruction is compute and occupies its rank for compute_seconds.
// Each event's start is the max of its participants' arrival times, so the result does not
// depend on the order in which the simulator happens to visit ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "plan/schedule.h"
#include "plan/timeline.h"

namespace ht::plan {

// The bytes of one rank's word in AlignReplica (runtime/executor's agreement: its step,
// whether it ended, and its stage's loss of the step, as text).
inline constexpr int64_t kAlignBytes = 64;

// Costs in seconds and bytes. An empty function counts as zero, so a test (or a planner
// asking only about time) sets only what it needs. Negative results are an error.
struct CostModel {
  // Forward, Backward, Recompute, LoadMicroBatch, OptimizerStep.
  std::function<double(int rank, const Instruction& in)> compute_seconds;
  // One point-to-point transfer of `bytes` from src to dst.
  std::function<double(int src, int dst, int64_t bytes)> message_seconds;
  // This rank's part of the ReduceGrads collective of `stage`.
  std::function<double(int rank, int stage)> reduce_seconds;
  // This rank's part of the GatherWeights collective of `stage` (a sharded stage).
  std::function<double(int rank, int stage)> gather_seconds;
  // Activations one micro-batch stashes on this rank between its Forward and Backward.
  std::function<int64_t(int rank, int stage)> activation_bytes;
  // What stays stashed instead when the stage recomputes (the schedule holds a Recompute
  // for that micro-batch): typically the stage's input only.
  std::function<int64_t(int rank, int stage)> checkpoint_bytes;
  // What a Forward, Recompute or Backward of one micro-batch holds on this rank while it
  // runs, beyond the stashes (its blocks' transients; plan/stage_memory.h).
  std::function<int64_t(int rank, int stage)> workspace_bytes;
};

struct SimResult {
  double step_seconds = 0;  // when the last rank finishes its last instruction
  // Per rank. Invariant for a rank with a non-empty schedule:
  //   busy + comm + idle == step_seconds (idle includes waits for peers and the tail after
  //   the rank's last instruction). A rank with an empty schedule has all zeros.
  std::vector<double> busy_seconds;  // compute
  std::vector<double> comm_seconds;  // transfers and reductions in progress
  std::vector<double> idle_seconds;
  std::vector<double> utilisation;   // busy / step
  double bubble_fraction = 0;        // 1 - sum busy / (ranks with work * step)
  // Memory model (kept simple on purpose): Forward of (stage, mb) adds activation_bytes,
  // or checkpoint_bytes when that micro-batch is recomputed on this rank; Recompute adds
  // activation_bytes again (the checkpoint is still held while it is rebuilt); Backward
  // releases everything held for (stage, mb); while each of the three runs, workspace_bytes
  // more are held. The peak is over schedule order.
  std::vector<int64_t> peak_activation_bytes;
  // One compute or comm span per instruction (zero-length ones included, so spans match
  // instructions one to one) plus an "idle" span, named after the instruction waited at,
  // for each wait longer than zero.
  std::vector<plan::Span> timeline;

  // A result for `ranks` ranks, every per-rank total at zero.
  static SimResult zeroed(size_t ranks);
};

// Throws ht::Error naming the ranks and instructions involved when a send meets a receive
// of a different micro-batch or size, when communication is unmatched (the peer finished
// without posting it), or when the ranks deadlock.
SimResult simulate(const std::vector<Schedule>& schedules, const CostModel& costs);

// The per-rank totals that follow from step_seconds, busy_seconds and comm_seconds: each
// working rank's idle (the rest of the step, clamped at 0: busy and comm are sums of the
// same intervals, up to rounding) and utilisation, and the bubble over the working ranks.
// Shared by simulate and plan::simulate_local_round.
void summarise_ranks(SimResult& result, const std::vector<char>& working);

}  // namespace ht::plan
