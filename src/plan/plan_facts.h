// What a plan records for people, as facts: the memory strategies and the steps that
// fitted each rank, the ranks that do not fit, why a layout was ruled out and the notes
// on the choice. The planner fills them with numbers only; report/plan_text.h turns them
// into the sentences `hetrain plan` and `hetrain train` print, and the plan file stores
// them as objects, so a tool can read a shortfall without parsing English.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ht::plan {

// Bytes one rank holds during a step, by kind.
struct MemoryUse {
  double params = 0, grads = 0, optimizer = 0, activations = 0;
  double total() const { return params + grads + optimizer + activations; }
};

// What a rank keeps in its host's memory beside its device (memory_fit.h's
// host_memory: which ranks keep what).
struct HostUse {
  double other_weights = 0;     // the weights of the blocks outside its stage it keeps
  double checkpoint_state = 0;  // rank 0: the largest block's optimiser state, held while a checkpoint streams
  double outer_state = 0;       // parallel.sync local: outer weights, momentum, anchor and delta
  double device = 0;            // where its device is host memory (a CPU rank, no cap): its use
  double total() const { return other_weights + checkpoint_state + outer_state + device; }
};

// The memory strategies, in the order the planner tries them (memory_fit.h).
enum class MemoryStrategy { recompute, micro_batches, optimizer_sharding };
const char* to_string(MemoryStrategy s);  // "recompute", "micro-batches", "optimizer sharding"
std::vector<std::string> memory_strategy_names();
std::optional<MemoryStrategy> parse_memory_strategy(std::string_view s);

// One step of fitting a rank into its memory, in the order taken. The fields a kind
// does not name stay at their defaults.
enum class MemoryStepKind {
  over_capacity,       // use against capacity, before the step(s) that follow
  recompute,           // activations_before -> activations_after
  micro_batches,       // micro_batches of at most micro_batch_size; activations before -> after
  optimizer_sharding,  // the stage's state_bytes split over group_size ranks; this one keeps kept_fraction
  shard_for_peer,      // keeps kept_fraction of stage's state, sharded so that for_rank fits
  // Recomputation taken back: with the micro-batches the replica ended with (raised for
  // another of its ranks, or further for this one), activations_after fits without it.
  recompute_dropped,   // activations_before (recomputing) -> activations_after (kept)
};
const char* to_string(MemoryStepKind k);  // the plan file's "kind"
std::vector<std::string> memory_step_kind_names();
std::optional<MemoryStepKind> parse_memory_step_kind(std::string_view s);

struct MemoryStep {
  MemoryStepKind kind = MemoryStepKind::over_capacity;
  MemoryUse use;
  double capacity = 0;
  double activations_before = 0, activations_after = 0;
  int micro_batches = 0;
  int64_t micro_batch_size = 0;
  double state_bytes = 0;
  int group_size = 0;
  double kept_fraction = 0;
  int stage = -1, for_rank = -1;
};

// A rank whose share does not fit its memory.
struct Shortfall {
  int rank = 0;
  std::string device;  // DeviceModel::label()
  double capacity = 0;
  int stage = -1, block_begin = 0, block_end = 0;
  int64_t samples = 0;
  MemoryUse need;
  // Set when every memory strategy was tried: the micro-batches it ended with and
  // whether optimiser sharding was open to it (only with more than one replica).
  bool after_strategies = false;
  int micro_batches = 1;
  int64_t micro_batch_size = 0;
  bool sharding_possible = false;
  // Whether its optimiser state was sharded: where sharding was open but the group's
  // free memory could not hold the stage's state, it keeps all of it (need says so).
  bool sharded = false;
  // An idle rank 0, short of room for the whole model's weights, which it holds to
  // evaluate and checkpoint (memory_fit.h's rank_memory).
  bool idle = false;
  // Short of host memory, not of device memory: capacity is then its host's memory,
  // host_need what this rank keeps there, host_others what the other ranks on that host
  // keep (need: its device's use, which fits).
  bool host = false;
  std::string host_name;
  HostUse host_need;
  double host_others = 0;
  // Rank 0, whose training fits, cannot evaluate the whole model in batches of
  // eval_batch (memory_fit.h's fit_evaluation): need holds the evaluation's bytes in
  // activations and no gradients; eval_fits is the largest batch that fits (0: none).
  bool evaluation = false;
  int64_t eval_batch = 0, eval_fits = 0;
};

// Why no contiguous pipeline split fits (stage_partition.h), for the first reason found.
enum class StageSplitProblem {
  block_too_large,      // `block` alone needs `needed` on `stage`, the roomiest that could take it
  stage_too_small,      // `stage` cannot hold even its lightest candidate, `block`
  no_contiguous_split,  // `needed`: all weight state; `capacity`: the stages' total
};
const char* to_string(StageSplitProblem p);
std::vector<std::string> stage_split_problem_names();
std::optional<StageSplitProblem> parse_stage_split_problem(std::string_view s);

struct StageSplitFailure {
  StageSplitProblem problem = StageSplitProblem::no_contiguous_split;
  int blocks = 0, stages = 0;
  int block = -1, stage = -1;
  std::string device;  // the stage's device label
  double device_memory = 0;
  double needed = 0, capacity = 0;
  int whole_model_stage = -1;  // rank 0's stage, which also holds every block's weights
  double all_weights = 0;      // those weights, when whole_model_stage >= 0
  // Rank 0 streams the other blocks' weights from host memory (a GPU rank): its stage
  // holds the largest of them while it evaluates, not all.
  bool whole_model_streamed = false;
};

// Why a layout the planner tried has no plan.
enum class LayoutProblemKind {
  batch_below_replicas,  // global_batch < replicas: every replica needs a sample
  no_stage_split,        // split
  memory,                // shortfall, after every strategy
};
const char* to_string(LayoutProblemKind k);
std::vector<std::string> layout_problem_names();
std::optional<LayoutProblemKind> parse_layout_problem(std::string_view s);

struct LayoutProblem {
  LayoutProblemKind kind = LayoutProblemKind::memory;
  int64_t global_batch = 0;
  int replicas = 0;
  StageSplitFailure split;
  Shortfall shortfall;
};

// Who does how much of the step's forward FLOPs, per device label.
struct DeviceWork {
  std::string device;
  int ranks = 0;
  double fraction = 0;
};

// The notes on the plan's choice; each kind uses the fields its comment names.
enum class NoteKind {
  work_by_device,       // work, largest share first
  hub_reduces,          // ranks: the hub (one per stage); seconds: its ReduceGrads,
                        // other_seconds: with parts by share
  hub_steps_optimizer,  // ranks: the hub; seconds: the plan's step, other_seconds: with
                        // every rank stepping its own optimiser
  idle_ranks,           // ranks: the idle ones; world; seconds: the plan's step,
                        // other_seconds: the best plan over all `world` ranks
  uniform_baseline,     // stages; seconds: DeepSpeed's uniform split's step; problem
                        // (memory) when it does not fit
  shape,                // stages, replicas, ranks_used of world; seconds: the estimate, or
                        // problem when ruled out; other_seconds: the chosen plan's estimate
                        // where this one over fewer ranks is below it (not by kIdleMinGain)
  deadline_leader,      // replicas; seconds: the deadline plan's step, other_seconds: the
                        // same layout's synchronous step
  rank0_host,           // read from plan files from before host_memory: bytes, the weights
                        // of the blocks outside rank 0's stage; other_bytes, their
                        // optimizer state, gathered at a checkpoint
  host_memory,          // ranks: the ranks of the host whose memory is fullest (HostUse,
                        // summed over them); bytes: that sum, other_bytes: that host's
                        // memory (0: the cluster gives none, as a synth: one, so nothing was
                        // checked: then the rank keeping the most, alone)
};
const char* to_string(NoteKind k);
std::vector<std::string> note_kind_names();
std::optional<NoteKind> parse_note_kind(std::string_view s);

struct PlanNote {
  NoteKind kind = NoteKind::shape;
  std::vector<int> ranks;
  std::vector<DeviceWork> work;
  double seconds = 0, other_seconds = 0;
  double bytes = 0, other_bytes = 0;
  int stages = 0, replicas = 0, ranks_used = 0, world = 0;
  std::optional<LayoutProblem> problem;
};

// A layout ruled out, with its shape: what NoPlanFits carries per shape tried.
struct RuledOutShape {
  int stages = 1, replicas = 1, ranks_used = 1;
  LayoutProblem problem;
};

// The planner's answer when the user's cluster and config admit no plan: a neutral
// message and the facts; report::no_plan_text renders them for people.
class NoPlanFits : public Error {
 public:
  NoPlanFits(std::string message, int world, std::string cluster, std::string strategy,
             std::vector<RuledOutShape> shapes)
      : Error(std::move(message)), world(world), cluster(std::move(cluster)),
        strategy(std::move(strategy)), shapes(std::move(shapes)) {}
  int world;
  std::string cluster;   // the cluster's source
  std::string strategy;  // parallel.strategy as asked ("auto", "data", "equal", ...)
  // Every shape tried, one per rank and stage count; `data` and `equal` allow one.
  std::vector<RuledOutShape> shapes;
};

// partition_stages' answer when no split fits.
class StageSplitError : public Error {
 public:
  explicit StageSplitError(StageSplitFailure f)
      : Error("no pipeline split of " + std::to_string(f.blocks) + " blocks over " +
              std::to_string(f.stages) + " devices fits"),
        failure(std::move(f)) {}
  StageSplitFailure failure;
};

}  // namespace ht::plan
