// parallel.sync local: which ranks form the groups and which are left idle, and
// whether auto takes local (plan/local_plan.h); predict_local (local_plan.cpp) then
// sets H, the H_g and the prediction.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "plan/batch_split.h"
#include "plan/local_plan.h"
#include "plan/memory_fit.h"
#include "plan/plan_costs.h"
#include "plan/planner.h"

namespace ht::plan {

namespace {

std::vector<int64_t> shares_by_speed(int64_t samples, const std::vector<double>& speeds) {
  std::vector<ReplicaCapacity> caps;
  for (double s : speeds) caps.push_back({s, -1, 0});
  return split_batch(samples, caps);
}

// A data-parallel plan over `ranks` (world ranks of `data`) alone, renumbered, taking
// `samples` split by the ranks' speeds; each rank keeps its replica's micro-batches
// and recomputation from `data`.
Plan sub_plan(const Plan& data, const BlockCosts& sub_costs, const std::vector<int>& ranks,
              const std::vector<int64_t>& shares) {
  Plan p;
  p.config_name = data.config_name;
  p.config_hash = data.config_hash;
  p.cluster_source = data.cluster_source;
  p.world_size = static_cast<int>(ranks.size());
  p.blocks = data.blocks;
  p.global_batch = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  p.strategy = Strategy::data;
  p.stage_ranges = data.stage_ranges;
  const bool recompute = !data.layout.recompute.empty();
  for (size_t i = 0; i < ranks.size(); ++i) {
    RankPlan rp = data.ranks[static_cast<size_t>(ranks[i])];
    const auto r = static_cast<size_t>(rp.replica);
    p.layout.replicas.push_back({static_cast<int>(i)});
    p.layout.samples.push_back(shares[i]);
    p.layout.micro_batches.push_back(static_cast<int>(std::min<int64_t>(data.layout.micro_batches[r], shares[i])));
    if (recompute) p.layout.recompute.push_back(data.layout.recompute[r]);
    rp.rank = static_cast<int>(i);
    rp.replica = static_cast<int>(i);
    rp.stage = 0;
    rp.optimizer_shard = 1;
    p.ranks.push_back(rp);
  }
  sync_rank_shares(p);
  for (RankPlan& rp : p.ranks) rp.memory = rank_memory(p, sub_costs, rp);
  return p;
}

std::vector<double> speeds_of(const BlockCosts& costs, const std::vector<int>& ranks) {
  std::vector<double> s;
  for (int r : ranks) s.push_back(replica_samples_per_s(costs, r));
  return s;
}

// Predicted samples/s of `ranks` as one synchronous group taking `samples` a step.
double group_throughput(const LocalPlanInput& in, const std::vector<int>& ranks, int64_t samples) {
  if (samples < static_cast<int64_t>(ranks.size())) return 0;
  const BlockCosts costs = costs_of(in.costs, ranks);
  const ClusterModel cluster = cluster_of(in.cluster, ranks);
  std::vector<int> local(ranks.size());
  std::iota(local.begin(), local.end(), 0);
  Plan p = sub_plan(in.data_plan, costs, ranks, shares_by_speed(samples, speeds_of(costs, local)));
  predict_plan(p, costs, cluster);
  return p.predicted.samples_per_s;
}

int64_t nominal_share(const LocalPlanInput& in, const std::vector<int>& ranks, double total_speed) {
  double s = 0;
  for (int r : ranks) s += replica_samples_per_s(in.costs, r);
  return std::max<int64_t>(static_cast<int64_t>(ranks.size()),
                           std::llround(static_cast<double>(in.data_plan.global_batch) * s / total_speed));
}


// The local plan over the fastest `used` ranks (`order`: every rank, fastest first), the
// others idle.
LocalPlanResult local_plan_over(const LocalPlanInput& in, std::vector<int> order) {
  LocalPlanResult out;
  const Plan& data = in.data_plan;
  if (data.stage_ranges.size() != 1 || data.world_size != static_cast<int>(in.cluster.ranks.size()) ||
      has_idle_ranks(data)) {
    out.problem = "local needs a data-parallel plan over every rank";
    return out;
  }
  for (const RankPlan& rp : data.ranks)
    if (rp.optimizer_shard < 1) {
      out.problem = "rank " + std::to_string(rp.rank) + " (" + rp.device.label() +
                    ") holds the whole model only with optimizer sharding, which a group of its own cannot share";
      return out;
    }
  const int world = static_cast<int>(order.size());
  if (data.global_batch < world) {  // before the group search, which is the costly part
    out.problem = "global batch " + std::to_string(data.global_batch) + " is smaller than the " +
                  std::to_string(world) + " ranks";
    return out;
  }
  double total_speed = 0;
  for (int r : order) total_speed += replica_samples_per_s(in.costs, r);
  std::vector<std::vector<int>> groups;
  std::vector<double> throughput;  // per group, at its nominal share
  for (int r : order) {
    const double alone = group_throughput(in, {r}, nominal_share(in, {r}, total_speed));
    int best = -1;
    double best_tput = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<int> joined = groups[g];
      joined.push_back(r);
      const double t = group_throughput(in, joined, nominal_share(in, joined, total_speed));
      if (t >= kGroupEfficiency * (throughput[g] + alone) && t > best_tput) {
        best = static_cast<int>(g);
        best_tput = t;
      }
    }
    if (best >= 0) {
      groups[static_cast<size_t>(best)].push_back(r);
      throughput[static_cast<size_t>(best)] = best_tput;
    } else {
      groups.push_back({r});
      throughput.push_back(alone);
    }
  }
  Plan p = data;
  p.sync_policy = SyncPolicy::local;
  p.strategy = Strategy::data;
  p.layout = PipelineLayout{};
  p.layout.reduce_owner = -1;
  for (RankPlan& rp : p.ranks) {  // idle unless a group takes it
    rp.replica = rp.stage = -1;
    rp.samples = 0;
    rp.memory = {};
    rp.busy_fraction = 0;
  }
  LocalSync l;
  int replica = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    // Every group's inner step is one whole global batch, split over its ranks by speed.
    const std::vector<int64_t> shares = shares_by_speed(data.global_batch, speeds_of(in.costs, groups[g]));
    std::vector<int> members;
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int rank = groups[g][i];
      const auto old = static_cast<size_t>(data.ranks[static_cast<size_t>(rank)].replica);
      p.layout.replicas.push_back({rank});
      p.layout.samples.push_back(shares[i]);
      p.layout.micro_batches.push_back(static_cast<int>(std::min<int64_t>(data.layout.micro_batches[old], shares[i])));
      if (!data.layout.recompute.empty()) p.layout.recompute.push_back(data.layout.recompute[old]);
      RankPlan& rp = p.ranks[static_cast<size_t>(rank)];
      rp.replica = replica;
      rp.stage = 0;
      rp.optimizer_shard = 1;
      members.push_back(replica++);
    }
    l.groups.push_back(members);
  }
  sync_rank_shares(p);
  for (RankPlan& rp : p.ranks) {
    if (rp.replica < 0) continue;
    rp.memory = rank_memory(p, in.costs, rp);
    if (rp.memory.total() > rp.device.memory_bytes) {
      out.problem = "rank " + std::to_string(rp.rank) + " (" + rp.device.label() + ") cannot hold its local share of " +
                    std::to_string(rp.samples) + " samples";
      return out;
    }
  }
  l.inner_steps = static_cast<int>(l.groups.size());  // until predict_local chooses H and the H_g
  l.group_steps.assign(l.groups.size(), 1);
  p.local = l;
  // A parallel.local_steps below the groups is refused here (not worked round by leaving
  // ranks idle): the setting is what is wrong.
  predict_local(p, in.costs, in.cluster, in.sync_step_seconds, in.local_steps);
  out.plan = std::move(p);
  return out;
}

}  // namespace

LocalPlanResult make_local_plan(const LocalPlanInput& in) {
  std::vector<int> order(in.data_plan.ranks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return replica_samples_per_s(in.costs, a) > replica_samples_per_s(in.costs, b);
  });
  // As the synchronous planner does: every rank, unless fewer (the fastest ones, at least
  // two) are predicted kIdleGain faster. A rank whose one-sample step outlasts the
  // others' whole share holds every round back, whatever share it gets.
  LocalPlanResult best;
  for (size_t used = order.size(); used >= 2; --used) {
    LocalPlanResult r = local_plan_over(in, std::vector<int>(order.begin(), order.begin() + static_cast<long>(used)));
    if (!r.plan) {
      if (!best.plan && best.problem.empty()) best.problem = r.problem;
      continue;
    }
    if (!best.plan || r.plan->predicted.step_seconds < (1 - kIdleGain) * best.plan->predicted.step_seconds)
      best = std::move(r);
  }
  return best;
}

std::optional<Plan> local_plan_for(const PlannerInput& in, const Plan& sync_plan,
                                   std::optional<config::SyncPolicy> asked, int64_t local_steps) {
  const bool wanted = asked == config::SyncPolicy::local;
  HT_CHECK(!wanted || in.strategy == config::ParallelStrategy::automatic || in.strategy == config::ParallelStrategy::data,
           "parallel.sync local with parallel.strategy ", config::to_string(in.strategy),
           ": local groups are data-parallel replicas of the whole model; expected strategy auto or data");
  if (!wanted) {
    if (asked || in.strategy != config::ParallelStrategy::automatic) return std::nullopt;
    const bool starved = std::any_of(sync_plan.ranks.begin(), sync_plan.ranks.end(), [](const RankPlan& r) {
      return r.replica < 0 || r.busy_fraction < kStarvedBusy;
    });
    if (!starved) return std::nullopt;
    // The group search tries each rank in each group so far, predicting a sub-plan each
    // time: at 1,024 ranks it ran for minutes. Asked for, local still searches.
    if (in.cluster.ranks.size() > kAutoLocalMaxRanks) return std::nullopt;
  }
  LocalPlanInput li;
  li.costs = in.costs;
  li.cluster = in.cluster;
  li.sync_step_seconds = sync_plan.predicted.step_seconds;
  li.local_steps = local_steps;
  PlannerInput data = in;
  data.strategy = config::ParallelStrategy::data;
  data.hub_may_step_optimizer = false;
  std::string problem;
  try {
    li.data_plan = make_plan(data);
  } catch (const Error& e) {
    problem = e.what();
  }
  LocalPlanResult r;
  if (problem.empty()) {
    r = make_local_plan(li);
    problem = r.problem;
  }
  if (wanted) {
    HT_CHECK(r.plan, "parallel.sync local: no local plan fits: ", problem,
             "; expected every rank to hold the whole model (use sync for pipelines)");
    return r.plan;
  }
  if (!r.plan || r.plan->local->gain < 1 + kLocalMinGain) return std::nullopt;
  return r.plan;
}

}  // namespace ht::plan
