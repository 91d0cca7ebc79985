// The Plan: what the planner decides and everything `hetrain plan` shows, `--json` writes
// and `hetrain train --plan` reads back. It holds the layout (which ranks form which
// stages of which data-parallel replicas, shares, micro-batches, recomputation) from
// which plan_schedules() derives every rank's instruction list: one plan, two
// interpreters (the simulator here, the executor in training).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "plan/cluster_model.h"
#include "plan/plan_facts.h"
#include "plan/schedule.h"

namespace ht::plan {

// The shape a plan chose: data (one stage, several replicas), pipeline (one replica of
// several stages), hybrid (both), or equal (the DDP baseline itself). Plan files and
// summaries spell it as to_string does.
enum class Strategy { data, pipeline, hybrid, equal };
const char* to_string(Strategy s);  // "data", "pipeline", "hybrid", "equal"
std::vector<std::string> strategy_names();
std::optional<Strategy> parse_strategy(std::string_view s);

// How the plan's replicas agree each step (config parallel.sync): every contribution,
// a deadline-bounded reduction, or local groups with an outer step.
enum class SyncPolicy { synchronous, deadline, local };
const char* to_string(SyncPolicy s);  // "synchronous", "deadline", "local"
std::vector<std::string> sync_policy_names();
std::optional<SyncPolicy> parse_sync_policy(std::string_view s);

// The most micro-batches a replica's step may run. The schedules hold instructions per
// micro-batch, so a plan is built, simulated and read from a file only up to this many:
// no real step comes near it (a rank that needs more is one the batch does not fit).
inline constexpr int kMaxMicroBatches = 1 << 16;

struct RankPlan {
  int rank = 0;
  DeviceModel device;
  int replica = -1, stage = -1;  // -1: the rank is left idle
  int block_begin = 0, block_end = 0;  // [begin, end) of the model's blocks
  int64_t samples = 0;       // of every global batch (its replica's share)
  int micro_batches = 1;     // its replica's M
  int64_t micro_batch_size = 0;  // the largest micro-batch, ceil(samples / M)
  bool recompute = false;
  double optimizer_shard = 1;  // fraction of its stage's optimizer state this rank keeps
  // Strategies applied for this rank in the order taken (none: it fits as is), and why:
  // the bytes it needed against its capacity and what each strategy saved.
  std::vector<MemoryStrategy> memory_strategies;
  std::vector<MemoryStep> memory_steps;
  MemoryUse memory;
  HostUse host;              // what it keeps in its host's memory (memory_fit.h's host_memory)
  double busy_fraction = 0;  // predicted compute / step
  bool slow_link = false;    // a note for people (plan_notes.h); nothing acts on it
  // When slow_link: its typical 1 MiB transfer against the cluster's typical one.
  double link_seconds = 0, cluster_link_seconds = 0;
};

struct Prediction {
  double step_seconds = 0;
  double samples_per_s = 0;
  double bubble_fraction = 0;
};

// What DDP does on the same cluster: equal shares, the whole model on every rank, no
// memory strategy. When the global batch is smaller than the world (DDP cannot run), the
// DeepSpeed pipeline default of the plan's shape instead: equal shares per replica,
// uniform layer ranges, ranks placed in rank order.
// Its kind is its stage count: one stage is DDP, more is DeepSpeed's uniform split.
struct Baseline {
  PipelineLayout layout;
  std::vector<std::pair<int, int>> stage_ranges;
  Prediction predicted;  // as if it fitted, so the speed-up is shown either way
  bool fits = true;
  std::vector<Shortfall> shortfalls;  // every rank that does not fit
};

// parallel.sync local (plan/local_plan.h): the replicas fall into groups, each a
// synchronous data-parallel sub-plan on its own communicator. A round is inner_steps (H)
// job steps, the H global batches' samples of the sample stream; group g takes a run of
// round_samples[g] (n_g) of them in group_steps[g] (H_g) inner steps of near-equal size,
// n_g in proportion to the group's speed so that the groups end a round together (the
// n_g sum to H x global batch, the H_g to H; layout.samples hold each group's nominal
// step of one global batch, split over its replicas). Then the groups' parameter deltas
// meet in an outer step (Nesterov), exchanged while the next round runs.
struct LocalSync {
  std::vector<std::vector<int>> groups;  // replica indices of layout.replicas, per group
  int inner_steps = 1;                   // H: job steps (global batches) per round
  std::vector<int> group_steps;          // H_g: inner steps per round, per group; sum H
  std::vector<int64_t> round_samples;    // n_g: samples per round, per group; sum H x global batch
  // D: the job steps into the next round after which a round's exchange is finished and
  // its outer step taken, 1..H (H: at the next round's end, before that round's exchange
  // starts; parallel.outer_delay asks for less, plan/local_plan.h's apply_outer_delay).
  int outer_delay = 0;
  // The job steps between the run's evaluations and checkpoints that H divides, so that
  // each lands at a round's end (plan/local_plan.h); 0: none asked, or none in reach.
  int64_t round_align = 0;
  double outer_exchange_seconds = 0;     // predicted all-reduce of the deltas, per round
  double sync_step_seconds = 0;          // the best synchronous plan's predicted step
  double gain = 0;                       // predicted samples/s over that plan's
};

struct Plan {
  std::string config_name;     // stem of the config it was made for
  std::string config_hash;     // config::plan_hash of the config; train --plan compares it
  std::string cluster_source;  // "probe FILE" or "synth:..."
  int world_size = 0;
  int blocks = 0;
  int64_t global_batch = 0;
  Strategy strategy = Strategy::data;
  SyncPolicy sync_policy = SyncPolicy::synchronous;  // `local` set exactly under local
  std::optional<LocalSync> local;
  PipelineLayout layout;
  std::vector<std::pair<int, int>> stage_ranges;  // [begin, end) blocks per stage
  std::vector<RankPlan> ranks;                    // one per world rank, in rank order
  Prediction predicted;
  Baseline baseline;
  double speedup = 0;              // baseline step / plan step
  std::vector<PlanNote> notes;  // for people: who takes how much work, what was ruled out
  int candidates = 0;              // layouts the search evaluated
};

// Every rank's instruction list for one step: build_1f1b over the plan's layout (with
// `trial`, over trial_layout(): a micro-batch trial's alternate steps), then
// add_weight_sync: GatherWeights on sharded stages, or ShareWeights/AwaitWeights on those
// where `shared_weights[stage]` says the replicas compute with the hub's weights in place
// (a fact of the running job, runtime/executor.h; empty: none do).
std::vector<Schedule> plan_schedules(const Plan& plan, bool trial = false,
                                     const std::vector<bool>& shared_weights = {});

// Whether the plan leaves any rank idle (in no replica).
bool has_idle_ranks(const Plan& plan);

// The optimiser shards of stage s's ranks, in replica order; empty when the stage is not
// sharded (every rank keeps its whole state).
std::vector<double> optimizer_shards(const Plan& plan, size_t stage);

// One stage over the whole model on every active rank, no optimiser sharding: a plan a
// running job can move to or from another such plan (runtime/stage_gather.h's relayout).
bool replicates_whole_model(const Plan& plan);

// Whether the hub (layout.reduce_owner) also steps the optimiser: in every stage the
// hub's rank keeps the whole optimiser state and the other replicas' ranks keep none.
bool hub_steps_optimizer(const Plan& plan);

// Makes the hub step the optimiser (`on`) or every rank step its own (every shard 1).
// The plan must have a hub when `on`. Memory figures are the caller's to update.
void set_hub_steps_optimizer(Plan& plan, bool on);

// The parts of stage s's ReduceGrads, one per replica: its optimiser shards when sharded
// (each rank sums and updates the weights of its part; round 2 carries the weights), else
// reduce_parts(layout).
std::vector<double> stage_reduce_parts(const Plan& plan, const PipelineLayout& layout, size_t stage);

}  // namespace ht::plan
