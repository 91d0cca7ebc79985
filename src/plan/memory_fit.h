// Fitting every rank of a plan into its memory: the per-rank strategies of the planner,
// tried in order of cost until the rank fits (plan_facts.h's MemoryStrategy):
//  1. recomputation: keep only the stage's input per in-flight micro-batch and re-run its
//     forward before each Backward (costs one more forward; helps only with more than
//     one micro-batch in flight, i.e. on pipeline stages);
//  2. more, smaller micro-batches for the rank's replica: the least M that fits (costs a
//     fixed overhead per micro-batch and block, and smaller, less efficient kernels),
//     taken here only when it makes the rank fit by itself;
//  3. optimiser-state sharding over the stage's data-parallel group, each member keeping a
//     part in proportion to its free memory (possible only with more than one replica; no
//     compute and no more traffic: round 2 of the gradient all-reduce carries the updated
//     weights instead, runtime/executor.h, but it waits for the optimiser step);
//  4. then, if still short, the least M that fits with the sharding.
#pragma once

#include <optional>

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"

namespace ht::plan {

// Copies each replica's share and micro-batch count from the layout into its ranks
// (samples, micro_batches, micro_batch_size).
void sync_rank_shares(Plan& plan);

// The steps a rank's memory_steps record: what it needed against its capacity, and what
// a strategy did to its activations. add_strategy records a strategy (once) and its step.
MemoryStep over_capacity_step(const MemoryUse& use, double capacity);
MemoryStep activations_step(MemoryStepKind kind, double before, double after);
void add_strategy(RankPlan& rp, MemoryStrategy strategy, const MemoryStep& step);

// What `rank` holds under the plan's current decisions. Rank 0 evaluates and checkpoints
// the whole model, in a pipeline and when idle too (runtime/trainer.cpp): beside its
// stage it holds the other blocks' weights, all of them on a CPU rank (host memory is
// its device), the largest on a GPU rank (which streams them from host memory to
// evaluate). Another idle rank holds nothing.
MemoryUse rank_memory(const Plan& plan, const BlockCosts& costs, const RankPlan& rank);

// What `rank` keeps in its host's memory, outside its device. Every rank builds the whole
// model in host memory from one seed (runtime/trainer.cpp) and moves only its stage's
// blocks onto its device. Rank 0 keeps the other blocks' weights there (it evaluates and
// checkpoints the whole model), and so does every rank of a one-stage plan (an idle one
// all of them: a relayout may bring it in); in a plan of several stages the other ranks
// release them as they are made. At each checkpoint rank 0 streams the model's optimiser
// state into the file a tensor at a time (runtime/stage_gather.h): counted as the largest
// block's. Under parallel.sync local every member of the outer exchange keeps the outer weights, momentum,
// anchor and delta there (runtime/local_sync.h), four copies of the model's weights.
// Where the device is that memory (a CPU rank without a cap) its device use counts too.
// Not counted: the data set, the process itself, the checkpoint reader's and writer's
// buffers (a few MiB), and the one tensor a resume holds while loading it (each rank
// reads the weights and optimiser state it loads from the verified file one at a time:
// runtime/checkpoint.h, runtime/stage_gather.cpp's load_stage).
HostUse host_memory(const Plan& plan, const BlockCosts& costs, const RankPlan& rank);

// What a member of a local plan's outer exchange keeps in host memory for it: the outer
// weights, momentum, anchor and delta, four copies of the model's weights
// (runtime/local_sync.h).
double outer_state_bytes(const BlockCosts& costs);

// Sets every rank's host use (rank.host) and returns the first host whose memory
// (DeviceModel::host_memory_bytes, where the cluster gives one) cannot hold its ranks'
// host use, as a shortfall of the rank there that keeps the most. No memory strategy
// lowers it: the layout does not fit.
std::optional<Shortfall> fit_host_memory(Plan& plan, const BlockCosts& costs);

// Replaces the plan's host_memory note with one for its ranks' host use as it stands
// (rank.host): the host whose memory is fullest, or where the cluster gives none the rank
// keeping the most. None where no rank keeps anything beside its device's use.
void note_host_memory(Plan& plan);

// Rank 0 evaluates the whole model between steps (runtime/trainer_evaluation.cpp), in
// batches of costs.eval_batch, holding its weights and optimiser state (gradients and
// activations are freed by then) and costs.eval_bytes_per_sample a sample. Returns rank
// 0's shortfall (`evaluation` set, the largest batch that fits in eval_fits) where that
// exceeds its device's memory; nothing where it fits or eval_batch is 0.
std::optional<Shortfall> fit_evaluation(const Plan& plan, const BlockCosts& costs);

// What `rank` lacks under rank.memory (report::shortfall_text spells it).
Shortfall shortfall_of(const RankPlan& rank);

// Applies the strategies where needed, recording per rank what was chosen and why, and
// fills every rank's memory and host use. Returns nothing when everything fits, else the
// first rank that cannot fit even with every strategy, with its numbers (or, once every
// device fits, the first whose host cannot hold its host use: fit_host_memory). Without `may_shard` the
// optimiser state is never sharded (parallel.sync deadline: a stalled rank's shard would
// have no stand-in). With `micro_batches_first`, more micro-batches are tried before
// recomputation where they alone make a rank fit (recomputation costs a forward each
// step, many small micro-batches their calls' fixed costs: the planner prices both).
std::optional<Shortfall> fit_memory(Plan& plan, const BlockCosts& costs, bool may_shard = true,
                                    bool micro_batches_first = false);

}  // namespace ht::plan
