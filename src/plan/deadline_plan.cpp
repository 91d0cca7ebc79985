#include "plan/deadline_plan.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "plan/planner.h"

namespace ht::plan {

namespace {

// Rank 0's replica becomes replica 0 (a data-parallel plan's replicas are in no required
// order): rank 0 evaluates and checkpoints from its own weights, which under deadline
// must need no message from a rank that may be stalled.
void first_replica_rank_0(Plan& plan) {
  const auto k = static_cast<size_t>(plan.ranks[0].replica);
  if (k == 0) return;
  PipelineLayout& l = plan.layout;
  auto swap = [k](auto& v) {
    if (v.size() > k) std::swap(v[0], v[k]);
  };
  swap(l.replicas);
  swap(l.samples);
  swap(l.micro_batches);
  swap(l.recompute);
  swap(l.forward_seconds);
  swap(l.backward_seconds);
  swap(l.alternate_micro_batches);
  if (l.reduce_owner == 0 || l.reduce_owner == static_cast<int>(k)) l.reduce_owner = l.reduce_owner == 0 ? static_cast<int>(k) : 0;
  for (size_t r = 0; r < l.replicas.size(); ++r)
    for (int rank : l.replicas[r]) plan.ranks[static_cast<size_t>(rank)].replica = static_cast<int>(r);
}

}  // namespace

void check_deadline_ranks(const Plan& plan) {
  if (plan.layout.replicas.size() < 2) return;  // a pure pipeline runs as under sync, idle ranks and all
  std::vector<int> idle;
  for (const RankPlan& r : plan.ranks)
    if (r.replica < 0) idle.push_back(r.rank);
  // A plan file made for another policy is what this refuses; the planner's own deadline
  // plans use every rank.
  HT_CHECK(idle.empty(), "parallel.sync deadline: the plan leaves rank", idle.size() > 1 ? "s " : " ", join_ranks(idle),
           " idle; under deadline every rank trains (an idle rank has no step to keep it with the job until "
           "its end), and a plan made for it uses every rank the global batch has a sample for: give fewer ranks "
           "or a larger batch");
}

void apply_deadline_sync(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster) {
  const size_t stages = plan.stage_ranges.size(), replicas = plan.layout.replicas.size();
  for (size_t s = 0; s < stages; ++s) {
    const std::vector<double> shards = optimizer_shards(plan, s);
    HT_CHECK(shards.empty() || hub_steps_optimizer(plan), "parallel.sync deadline: the plan shards stage ", s,
             "'s optimizer state over its ", shards.size(),
             " replicas, and a stalled rank's shard has no stand-in; deadline supports every rank keeping the "
             "whole optimizer state: give the ranks that memory, or set parallel.sync to sync");
  }
  if (replicas > 1) {
    for (const RankPlan& r : plan.ranks) {
      if (r.replica < 0) continue;
      const double bytes = r.memory.params + r.memory.optimizer;
      HT_CHECK(bytes <= kDeadlineCatchUpMaxBytes, "parallel.sync deadline: stage ", r.stage, " (blocks ", r.block_begin,
               "..", r.block_end - 1, ") holds ", static_cast<int64_t>(bytes),
               " bytes of parameters and optimizer state, which a catch-up sends as one message; expected at most ",
               static_cast<int64_t>(kDeadlineCatchUpMaxBytes),
               " (an MPI message's 2^31 - 1 bytes, less room for its step records): more pipeline stages, or "
               "parallel.sync sync");
    }
    check_deadline_ranks(plan);  // rank 0 among them: it evaluates and checkpoints from its own weights
    first_replica_rank_0(plan);
    if (hub_steps_optimizer(plan)) set_hub_steps_optimizer(plan, false);
    plan.layout.reduce_owner = 0;
  }
  // The same layout's synchronous step, as make_plan predicted it: what the leader's
  // reduction is weighed against in the note below.
  const double sync_step = plan.sync_policy == SyncPolicy::synchronous ? plan.predicted.step_seconds : 0;
  plan.sync_policy = SyncPolicy::deadline;
  predict_plan(plan, costs, cluster);
  // Every replica's gradient goes to one leader and the sum back to each replica
  // (comm/deadline_reduce.h), so the leader's link carries 2 x (replicas - 1) gradients a
  // step: past a few replicas that, not the compute, sets the pace, and the user should
  // see why the speed-up collapsed before choosing the policy.
  if (replicas > 1 && sync_step > 0 && plan.predicted.step_seconds > kDeadlineNoteRatio * sync_step) {
    PlanNote n;
    n.kind = NoteKind::deadline_leader;
    n.replicas = static_cast<int>(replicas);
    n.seconds = plan.predicted.step_seconds;
    n.other_seconds = sync_step;
    plan.notes.push_back(n);
  }
}

void add_deadline_sync(std::vector<Schedule>& schedules, const PipelineLayout& layout) {
  const bool hybrid = layout.replicas.size() > 1 && layout.replicas[0].size() > 1;
  for (size_t r = 0; r < layout.replicas.size(); ++r)
    for (int rank : layout.replicas[r]) {
      HT_CHECK(rank >= 0 && static_cast<size_t>(rank) < schedules.size(), "add_deadline_sync: rank ", rank,
               " of replica ", r, " has no list among the ", schedules.size());
      Schedule& s = schedules[static_cast<size_t>(rank)];
      const auto reduce = std::find_if(s.begin(), s.end(), [](const Instruction& in) { return in.op == Op::reduce_grads; });
      if (reduce == s.end()) continue;
      const int stage = reduce->stage;
      std::erase_if(s, [](const Instruction& in) { return in.op == Op::reduce_start; });
      for (Instruction& in : s)
        if (in.op == Op::reduce_grads) in.op = Op::reduce_grads_deadline;
      s.insert(s.begin(), Instruction{Op::catch_up, -1, stage});
      if (!hybrid) continue;
      const auto step = std::find_if(s.begin(), s.end(), [](const Instruction& in) { return in.op == Op::optimizer_step; });
      Instruction align{Op::align_replica};
      align.replica = static_cast<int>(r);
      s.insert(step == s.end() ? s.end() : step + 1, align);
    }
}

}  // namespace ht::plan
