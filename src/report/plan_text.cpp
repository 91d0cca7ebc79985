#include "report/plan_text.h"

#include <cmath>
#include <map>

#include "core/units.h"
#include "plan/plan_notes.h"
#include "plan/planner.h"

namespace ht::report {

namespace {

// Whole bytes beside the rounded ones: they can be grepped for and compared exactly.
std::string whole(double bytes) { return std::to_string(std::llround(bytes)); }

// A need against a capacity, each in GiB or the like; where the two print alike (a few
// bytes apart), each with its exact byte count, so that the shortfall shows.
std::pair<std::string, std::string> need_and_room(double needed, double capacity) {
  std::string a = format_bytes(needed), b = format_bytes(capacity);
  if (a == b) {
    a += " (" + whole(needed) + " bytes)";
    b += " (" + whole(capacity) + " bytes)";
  }
  return {a, b};
}

std::string breakdown(const plan::MemoryUse& m) {
  return "params " + format_bytes(m.params) + ", grads " + format_bytes(m.grads) +
         ", optimizer " + format_bytes(m.optimizer) + ", activations " + format_bytes(m.activations);
}

std::string blocks_text(int begin, int end) {
  return "blocks " + std::to_string(begin) + "-" + std::to_string(end - 1);
}

std::string percent1(double fraction) { return number("%.1f%%", 100 * fraction); }

std::string activations_change(const plan::MemoryStep& s) {
  return "activations " + format_bytes(s.activations_before) + " -> " + format_bytes(s.activations_after);
}

// "with the other blocks' weights" when the stage is rank 0's.
std::string rank0_clause(const plan::StageSplitFailure& f) {
  if (f.stage != f.whole_model_stage) return "";
  return f.whole_model_streamed ? " (with the largest other block's weights, which rank 0 streams through its device to "
                                  "evaluate)"
                                : " (with the other blocks' weights, which rank 0 holds)";
}

}  // namespace

std::string memory_strategies_text(const std::vector<plan::MemoryStrategy>& strategies) {
  if (strategies.empty()) return "none";
  std::string out;
  for (plan::MemoryStrategy s : strategies) out += (out.empty() ? "" : " + ") + std::string(plan::to_string(s));
  return out;
}

std::string memory_step_text(const plan::MemoryStep& s) {
  using K = plan::MemoryStepKind;
  switch (s.kind) {
    case K::over_capacity:
      return "needs " + format_bytes(s.use.total()) + " of " + format_bytes(s.capacity) + " (" +
             breakdown(s.use) + ")";
    case K::recompute:
      return "recompute: " + activations_change(s);
    case K::recompute_dropped:
      return "recomputation dropped: with the replica's final micro-batches the activations fit without it, " +
             activations_change(s);
    case K::micro_batches:
      return "micro-batches: " + std::to_string(s.micro_batches) + " of at most " +
             std::to_string(s.micro_batch_size) + " samples, " + activations_change(s);
    case K::optimizer_sharding:
      return "optimizer sharding: the stage's " + format_bytes(s.state_bytes) +
             " of optimizer state split over its " + std::to_string(s.group_size) +
             " data-parallel ranks by free memory, keeping " + percent1(s.kept_fraction);
    case K::shard_for_peer:
      return "optimizer sharding: keeps " + percent1(s.kept_fraction) + " of stage " +
             std::to_string(s.stage) + "'s optimizer state, sharded for rank " + std::to_string(s.for_rank);
  }
  return "?";
}

std::string memory_reason_text(const plan::RankPlan& r) {
  if (r.memory_strategies.empty()) return "";
  std::string steps;
  for (const plan::MemoryStep& s : r.memory_steps) steps += (steps.empty() ? "" : "; ") + memory_step_text(s);
  // The layout may then run more micro-batches than memory asked for (a pipeline's, to
  // shorten its bubble): say so, or the table's count contradicts the step's.
  for (auto it = r.memory_steps.rbegin(); it != r.memory_steps.rend(); ++it)
    if (it->kind == plan::MemoryStepKind::micro_batches) {
      if (it->micro_batches != r.micro_batches)
        steps += "; the layout then runs " + std::to_string(r.micro_batches) + " micro-batches of at most " +
                 std::to_string(r.micro_batch_size) + (r.micro_batch_size == 1 ? " sample" : " samples") +
                 (r.micro_batch_size <= it->micro_batch_size ? ", within that bound" : "");
      break;
    }
  const std::string name = memory_strategies_text(r.memory_strategies);
  // Steps that open with the strategy's own name (a rank sharded for another) say it.
  if (steps.rfind(name + ":", 0) == 0) return steps;
  return name + ": " + steps;
}

std::string slow_link_text(const plan::RankPlan& r) {
  if (!r.slow_link) return "";
  const int factor = r.cluster_link_seconds > 0 ? static_cast<int>(r.link_seconds / r.cluster_link_seconds) : 0;
  return "a " + number("%g MiB", plan::kSlowLinkProbeBytes / (1 << 20)) + " message to its typical peer takes " +
         format_seconds(r.link_seconds) + ", " + std::to_string(factor) + "x the cluster's typical " +
         format_seconds(r.cluster_link_seconds);
}

std::string host_use_text(const plan::HostUse& h) {
  std::vector<std::string> parts;
  if (h.device > 0) parts.push_back(format_bytes(h.device) + " of its device's use (its device is that memory)");
  if (h.other_weights > 0) parts.push_back(format_bytes(h.other_weights) + " of weights of blocks outside its stage");
  if (h.checkpoint_state > 0) parts.push_back(format_bytes(h.checkpoint_state) + " of one block's optimizer state as a checkpoint streams");
  if (h.outer_state > 0) parts.push_back(format_bytes(h.outer_state) + " of outer state (local)");
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return out;
}

std::string shortfall_text(const plan::Shortfall& s) {
  if (s.host)
    return "rank " + std::to_string(s.rank) + " (" + s.device + ") fits its device, but its host " +
           (s.host_name.empty() ? std::string("?") : s.host_name) + "'s memory, " + format_bytes(s.capacity) +
           ", cannot hold the " + format_bytes(s.host_need.total()) + " it keeps there: " + host_use_text(s.host_need) +
           (s.host_others > 0 ? ", beside " + format_bytes(s.host_others) + " for the host's other ranks" : std::string()) +
           "; " + format_bytes(s.host_need.total() + s.host_others - s.capacity) + " short";
  const std::string who = "rank " + std::to_string(s.rank) + " (" + s.device + ", " + format_bytes(s.capacity) + ")";
  if (s.evaluation)  // memory_fit.h's fit_evaluation
    return who + " trains in its memory but cannot evaluate the whole model in batches of " +
           std::to_string(s.eval_batch) + " (train.eval_batch_size, at most eval_max_samples): " +
           format_bytes(s.need.total()) + " (params " + format_bytes(s.need.params) + ", optimizer " +
           format_bytes(s.need.optimizer) + ", evaluation " + format_bytes(s.need.activations) + "), " +
           format_bytes(s.need.total() - s.capacity) + " short; " +
           (s.eval_fits >= 1 ? "set train.eval_batch_size to at most " + std::to_string(s.eval_fits) + " in this layout"
                             : std::string("even one sample does not fit: rank 0 needs more memory"));
  const std::string need = format_bytes(s.need.total()) + " (" + breakdown(s.need) + "), " +
                           format_bytes(s.need.total() - s.capacity) + " short";
  if (s.idle)  // rank 0 (memory_fit.h's rank_memory)
    return who + ", idle in this layout, still evaluates and checkpoints the whole model, which needs " +
           format_bytes(s.need.total()) + " of its memory for weights, " + format_bytes(s.need.total() - s.capacity) +
           " short; a rank with room for them must be rank 0";
  if (!s.after_strategies)
    return who + ": " + std::to_string(s.samples) + " samples on " + blocks_text(s.block_begin, s.block_end) +
           " need " + need;
  return who + " cannot hold stage " + std::to_string(s.stage) + " (" + blocks_text(s.block_begin, s.block_end) +
         ", " + std::to_string(s.samples) + " samples) even with recomputation, " +
         std::to_string(s.micro_batches) + (s.micro_batches == 1 ? " micro-batch of " : " micro-batches of ") +
         std::to_string(s.micro_batch_size) +
         (!s.sharding_possible ? " (no optimizer sharding: one replica, or parallel.sync deadline)"
          : s.sharded         ? " and optimizer sharding"
                              : " (optimizer sharding tried: the stage's replicas have too little free memory for its "
                                "optimizer state, so it keeps all of it)") +
         ": needs " + need;
}

std::vector<std::pair<std::string, std::vector<int>>> ranks_by_text(const std::vector<std::pair<int, std::string>>& items) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  std::map<std::string, size_t> index;
  for (const auto& [rank, text] : items) {
    const auto [it, fresh] = index.try_emplace(text, out.size());
    if (fresh) out.push_back({text, {}});
    out[it->second].second.push_back(rank);
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + join_ranks(ranks);
}

std::vector<std::string> shortfall_lines(const std::vector<plan::Shortfall>& shortfalls) {
  // The text with the rank left out: "rank " + its number opens every form of it.
  std::vector<std::pair<int, std::string>> items;
  for (const plan::Shortfall& s : shortfalls)
    items.emplace_back(s.rank, shortfall_text(s).substr(("rank " + std::to_string(s.rank)).size()));
  std::vector<std::string> out;
  for (const auto& [rest, ranks] : ranks_by_text(items)) out.push_back(ranks_text(ranks) + rest);
  return out;
}

std::string stage_split_text(const plan::StageSplitFailure& f) {
  using P = plan::StageSplitProblem;
  const std::string head = "no pipeline split of " + std::to_string(f.blocks) + " blocks over " +
                           std::to_string(f.stages) + " devices fits: ";
  const std::string stage = "stage " + std::to_string(f.stage) + " (" + f.device + ", " +
                            format_bytes(f.device_memory) + ")";
  const auto [need, room] = need_and_room(f.needed, f.capacity);
  switch (f.problem) {
    case P::block_too_large:
      return head + "block " + std::to_string(f.block) + " alone needs " + need + " on " + stage +
             ", the roomiest stage that could take it; capacity " + room + rank0_clause(f) +
             ". Use devices with more memory, fewer in-flight micro-batches or a smaller micro-batch";
    case P::stage_too_small:
      return head + stage + " cannot hold any block it could be given: the lightest, block " +
             std::to_string(f.block) + ", needs " + need + " vs capacity " + room + rank0_clause(f);
    case P::no_contiguous_split:
      // Where the weights alone outgrow every stage together, the split's contiguity is
      // not what stands in the way.
      return head + "every block fits some stage alone, but " +
             (f.needed > f.capacity ? "not all of them together" : "no contiguous split does") +
             "; the weight state alone totals " + need + " against " + room + " of total capacity, before "
             "in-flight activations" +
             (f.whole_model_stage < 0
                  ? std::string()
                  : f.whole_model_streamed
                  ? "; and stage " + std::to_string(f.whole_model_stage) + " is rank 0's, which also holds the " +
                        "largest other block's weights while it evaluates (streamed from host memory)"
                  : "; and stage " + std::to_string(f.whole_model_stage) + " is rank 0's, which also holds " +
                        "every other stage's weights (it evaluates and checkpoints the whole model: " +
                        format_bytes(f.all_weights) + " of weights in all)");
  }
  return "?";
}

std::string layout_problem_text(const plan::LayoutProblem& p) {
  using K = plan::LayoutProblemKind;
  switch (p.kind) {
    case K::batch_below_replicas:
      return "global batch " + std::to_string(p.global_batch) + " is smaller than its " +
             std::to_string(p.replicas) + " data-parallel replicas (every replica needs a sample)";
    case K::no_stage_split:
      return stage_split_text(p.split);
    case K::memory:
      return shortfall_text(p.shortfall);
  }
  return "?";
}

std::string shape_name(int stages, int replicas) {
  if (stages == 1 && replicas == 1) return "one rank";
  if (stages == 1) return "data (" + std::to_string(replicas) + " replicas)";
  if (replicas == 1) return "pipeline (" + std::to_string(stages) + " stages)";
  return "hybrid (" + std::to_string(replicas) + " replicas x " + std::to_string(stages) + " stages)";
}

std::string baseline_name(int stages) {
  return stages <= 1 ? "equal batches, whole model per rank (DDP)"
                     : "equal batches, uniform layers over " + std::to_string(stages) + " stages (DeepSpeed)";
}

std::string note_text(const plan::PlanNote& n) {
  using K = plan::NoteKind;
  const bool one = n.ranks.size() == 1;
  const std::string hub = (one ? "rank " : "ranks ") + join_ranks(n.ranks);
  switch (n.kind) {
    case K::work_by_device: {
      std::string out = "work per step by device:";
      for (size_t i = 0; i < n.work.size(); ++i) {
        const plan::DeviceWork& w = n.work[i];
        out += (i ? ", " : " ") + w.device + " (" + std::to_string(w.ranks) + " rank" + (w.ranks == 1 ? "" : "s") +
               ") " + percent1(w.fraction);
      }
      return out;
    }
    case K::hub_reduces:
      return "gradients are summed on " + hub + (one ? "" : " (one per stage)") + " alone: predicted ReduceGrads " +
             format_seconds(n.seconds) + " against " + format_seconds(n.other_seconds) +
             " with parts by share (every owner must wake to sum its part)";
    case K::hub_steps_optimizer:
      return "the optimizer steps on " + hub + (one ? " alone, which holds" : " alone, which hold") +
             " the summed gradients; the other ranks keep no optimizer state and receive the updated weights: "
             "predicted step " + format_seconds(n.seconds) + " against " + format_seconds(n.other_seconds) +
             " with every rank stepping its own";
    case K::idle_ranks:
      return (one ? "rank " : "ranks ") + join_ranks(n.ranks) + " left idle: the best plan over all " +
             std::to_string(n.world) + " ranks is predicted at " + format_seconds(n.other_seconds) +
             " a step against " + format_seconds(n.seconds) +
             " without " + (one ? "it (what it adds" : "them (what they add") +
             ", in communication or in the layouts all " + std::to_string(n.world) +
             " ranks divide into, costs more than " + (one ? "its" : "their") + " compute gives)";
    case K::uniform_baseline:
      return baseline_name(n.stages) + ": predicted step " + format_seconds(n.seconds) + ", " +
             (n.problem ? "does not fit (" + layout_problem_text(*n.problem) + ")" : std::string("fits"));
    case K::deadline_leader:
      return "deadline: every replica's gradient goes to one leader and the sum back to each of the " +
             std::to_string(n.replicas) + " replicas, " + std::to_string(2 * (n.replicas - 1)) +
             " gradients over the leader's link a step: predicted step " + format_seconds(n.seconds) + " against " +
             format_seconds(n.other_seconds) +
             " for this layout under sync; parallel.sync sync or local trains faster here";
    case K::rank0_host:
      return "rank 0 keeps the weights of the blocks outside its stage in its host's memory to evaluate and "
             "checkpoint the whole model, " + format_bytes(n.bytes) + ", and gathers their optimizer state there at "
             "each checkpoint: " + format_bytes(n.bytes + n.other_bytes) +
             " of host memory then, beside its own process";
    case K::host_memory:
      return "host memory (what devices do not hold: rank 0's other blocks' weights, and one block's optimizer "
             "state as a checkpoint streams through it; in a one-stage plan every rank's weights; under local the outer "
             "state; a CPU rank's own use): " +
             (n.other_bytes > 0 ? format_bytes(n.bytes) + " for " + ranks_text(n.ranks) + " on the fullest host, against its " +
                                      format_bytes(n.other_bytes)
                                : "at most " + format_bytes(n.bytes) + ", on " + ranks_text(n.ranks) +
                                      "; the cluster gives no host memory (a synth: cluster), so it was not checked");
    case K::shape:
      return shape_name(n.stages, n.replicas) +
             (n.ranks_used < n.world ? " over the fastest " + std::to_string(n.ranks_used) : "") + ": " +
             (n.problem ? "ruled out: " + layout_problem_text(*n.problem)
                        : "estimated step " + format_seconds(n.seconds)) +
             (n.other_seconds > 0 ? ", below the chosen plan's estimate of " + format_seconds(n.other_seconds) +
                                        " by less than the " + number("%.0f%%", 100 * plan::kIdleMinGain) +
                                        " that leaving ranks idle must gain"
                                  : "");
  }
  return "?";
}

std::string no_plan_text(const plan::NoPlanFits& e) {
  // Strategies data and equal allow one layout: its problem, and what would lift it.
  const bool one_layout = e.strategy == "data" || e.strategy == "equal";
  if (one_layout && e.shapes.size() == 1) {
    const plan::LayoutProblem& p = e.shapes[0].problem;
    if (p.kind == plan::LayoutProblemKind::batch_below_replicas)
      return "planner: global batch " + std::to_string(p.global_batch) + " is smaller than the " +
             std::to_string(p.replicas) + " data-parallel replicas of strategy '" + e.strategy +
             "' (every replica needs a sample); raise train.batch_size to at least " +
             std::to_string(p.replicas) + " or use strategy auto or pipeline";
    if (e.strategy == "equal")
      return "planner: the equal split does not fit: " + layout_problem_text(p) +
             "; strategy auto plans uneven shares and memory strategies";
  }
  std::string out = "planner: no plan fits the cluster (" + std::to_string(e.world) + " ranks, " + e.cluster +
                    ") with any layout, recomputation, micro-batching or optimizer sharding:";
  for (const plan::RuledOutShape& s : e.shapes)
    out += "\n  " + shape_name(s.stages, s.replicas) + ": " + layout_problem_text(s.problem);
  return out;
}

}  // namespace ht::report
