// What one rank holds while it runs its stage, and the memory strategies that shrink it:
// activation recomputation, more and smaller micro-batches, and optimiser-state sharding
// across the stage's data-parallel group. The planner sizes every rank with this model
// and the simulator's peak-activation accounting agrees with it (tested).
#pragma once

#include <cstdint>
#include "plan/block_costs.h"
#include "plan/plan.h"

namespace ht::plan {

// Per-sample and per-stage totals over blocks [begin, end).
struct StageFootprint {
  double params = 0;
  double optimizer_bytes_per_param = 0;
  double activation_bytes = 0;  // per sample: every block's saved activations
  // With recomputation (GPipe's re-materialisation at the stage boundary) a stage keeps
  // only its input per in-flight micro-batch and re-runs its forward right before each
  // Backward, so one micro-batch's activations are alive at a time.
  double checkpoint_bytes = 0;  // per sample: the stage's input
  // Per sample: the largest of its blocks' workspaces (BlockCosts::workspace_bytes), alive
  // beside the kept activations while that block runs.
  double workspace_bytes = 0;
  double largest_block_params = 0;
};
StageFootprint stage_footprint(const BlockCosts& costs, int begin, int end);

struct StageMemoryParams {
  int stage = 0, stages = 1;
  int64_t micro_batch_size = 1;  // the largest micro-batch
  int micro_batches = 1;
  bool recompute = false;
  double optimizer_shard = 1;  // fraction of the optimiser state kept
};

// Bytes by kind. Gradients: the stage's, and with more than one micro-batch one block's
// more, since each later backward's weight gradients are made before they are added to
// the accumulated ones. Activations: k = min(S - s, M) micro-batches in flight (1F1B) hold
// k * m * activation_bytes; with recomputation k * m * checkpoint_bytes plus one
// micro-batch rebuilt, m * activation_bytes. So recomputation pays off only with more
// than one micro-batch in flight: on pipeline stages, not in pure data parallelism. Both
// add one micro-batch's workspace, m * workspace_bytes: the transients of the block that
// runs (the activations field holds them).
MemoryUse stage_memory(const StageFootprint& f, const StageMemoryParams& p);

}  // namespace ht::plan
