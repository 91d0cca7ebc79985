#include "plan/planner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "plan/batch_split.h"
#include "plan/memory_fit.h"
#include "plan/plan_costs.h"
#include "plan/plan_notes.h"
#include "plan/stage_memory.h"
#include "plan/stage_partition.h"

namespace ht::plan {

namespace {

using Asked = config::ParallelStrategy;  // what parallel.strategy asks; Strategy: what a plan is

constexpr double kInf = std::numeric_limits<double>::infinity();
// Candidates ranked best by the closed-form estimate that are then simulated (besides
// the best of every rank count).
constexpr size_t kSimulatedCandidates = 4;
// try_micro_batches_first takes the variant where its estimate is at least this much lower.
constexpr double kVariantMinGain = 0.95;
// make_plan simulates a rank count's best only when estimated within this of the best.
constexpr double kUnsimulatedRatio = 2.0;
// Under auto the planner also tries leaving the slowest ranks idle, cutting the speed
// order wherever the next rank is more than this much slower than the one before: a
// class of slow ranks can cost more in communication than its compute gives back.
constexpr double kSpeedStep = 0.85;
// A stage count that does not divide the ranks is tried over fewer of them when it
// leaves at most this many idle (shapes_over).
constexpr int kMaxShapeIdle = 3;

Strategy strategy_of(int stages, int replicas) {
  return stages == 1 ? Strategy::data : replicas == 1 ? Strategy::pipeline : Strategy::hybrid;
}

void validate(const PlannerInput& in) {
  const size_t n = in.cluster.ranks.size();
  HT_CHECK(n >= 1, "planner: the cluster has no ranks");
  HT_CHECK(in.costs.seconds_per_sample.size() == n, "planner: block costs cover ",
           in.costs.seconds_per_sample.size(), " ranks but the cluster has ", n);
  HT_CHECK(!in.costs.params.empty(), "planner: the model has no blocks");
  HT_CHECK(in.global_batch >= 1, "planner: global batch ", in.global_batch, "; expected >= 1");
  HT_CHECK(in.min_micro_batches >= 1, "planner: micro-batches ", in.min_micro_batches,
           "; expected >= 1");
  for (size_t r = 0; r < n; ++r)
    HT_CHECK(in.cluster.ranks[r].memory_bytes > 0, "planner: rank ", r, " (",
             in.cluster.ranks[r].label(), ") has memory ", in.cluster.ranks[r].memory_bytes,
             " bytes; expected > 0");
}

// The plan's skeleton for a layout: ranks, ranges, shares, micro-batches; no memory
// decisions yet.
Plan skeleton(const PlannerInput& in, std::vector<std::vector<int>> replicas,
              std::vector<std::pair<int, int>> ranges, const std::vector<int64_t>& shares,
              int micro_batches) {
  Plan p;
  p.config_name = in.config_name;
  p.config_hash = in.config_hash;
  p.cluster_source = in.cluster.source;
  p.world_size = static_cast<int>(in.cluster.ranks.size());
  p.blocks = static_cast<int>(in.costs.params.size());
  p.global_batch = in.global_batch;
  const int stages = static_cast<int>(ranges.size());
  const int replica_count = static_cast<int>(replicas.size());
  p.strategy = strategy_of(stages, replica_count);
  p.stage_ranges = std::move(ranges);
  p.layout.replicas = std::move(replicas);
  p.layout.samples = shares;
  for (int64_t share : shares)
    p.layout.micro_batches.push_back(static_cast<int>(std::min<int64_t>(micro_batches, share)));
  for (int s = 0; s + 1 < stages; ++s)
    p.layout.activation_bytes.push_back(static_cast<int64_t>(
        in.costs.output_bytes[static_cast<size_t>(p.stage_ranges[s].second - 1)]));
  p.ranks.resize(in.cluster.ranks.size());
  for (size_t k = 0; k < p.ranks.size(); ++k) {
    p.ranks[k].rank = static_cast<int>(k);
    p.ranks[k].device = in.cluster.ranks[k];
  }
  for (int r = 0; r < replica_count; ++r)
    for (int s = 0; s < stages; ++s) {
      RankPlan& rp = p.ranks[static_cast<size_t>(p.layout.replicas[r][s])];
      rp.replica = r;
      rp.stage = s;
      std::tie(rp.block_begin, rp.block_end) = p.stage_ranges[s];
    }
  sync_rank_shares(p);
  return p;
}

// Fills the layout's cost estimates (they order each rank's communication, see
// build_1f1b) and the prediction, by simulating the schedules when `simulate_it`.
// `tiers`: link_tiers(cluster) where the caller has them (see plan_costs.h).
double finish(Plan& p, const BlockCosts& costs, const ClusterModel& cluster, bool simulate_it,
              const std::vector<double>& reduce_seconds = {}, const LinkTiers* tiers = nullptr) {
  PlanCostTable costed = plan_cost_table(p, costs, cluster, tiers);
  for (size_t s = 0; s < reduce_seconds.size() && s < costed.reduce_seconds.size(); ++s)
    if (reduce_seconds[s] >= 0) costed.reduce_seconds[s] = reduce_seconds[s];
  const auto table = std::make_shared<const PlanCostTable>(std::move(costed));
  auto& l = p.layout;
  l.forward_seconds.assign(l.replicas.size(), {});
  l.backward_seconds.assign(l.replicas.size(), {});
  for (size_t r = 0; r < l.replicas.size(); ++r)
    for (int rank : l.replicas[r]) {
      const auto k = static_cast<size_t>(rank);
      const double work = table->stage_seconds_per_sample[k] *
                          static_cast<double>(l.samples[r]) / l.micro_batches[r];
      l.forward_seconds[r].push_back(kForwardFraction * work + table->pass_overhead_seconds[k]);
      l.backward_seconds[r].push_back((1 - kForwardFraction) * work +
                                      table->pass_overhead_seconds[k]);
    }
  if (!simulate_it) return estimate_step_seconds(p, *table, cluster);
  const SimResult sim = simulate(plan_schedules(p), plan_cost_model(p, table, cluster));
  p.predicted.step_seconds = sim.step_seconds;
  p.predicted.samples_per_s = static_cast<double>(p.global_batch) / sim.step_seconds;
  p.predicted.bubble_fraction = sim.bubble_fraction;
  for (RankPlan& rp : p.ranks) rp.busy_fraction = sim.utilisation[static_cast<size_t>(rp.rank)];
  return sim.step_seconds;
}

// Ranks by whole-model throughput (fastest first), then memory, then rank.
std::vector<int> by_speed(const PlannerInput& in) {
  std::vector<int> order(in.cluster.ranks.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> speed(order.size());
  for (int k : order) speed[static_cast<size_t>(k)] = replica_samples_per_s(in.costs, k);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const auto ka = static_cast<size_t>(a), kb = static_cast<size_t>(b);
    if (speed[ka] != speed[kb]) return speed[ka] > speed[kb];
    return in.cluster.ranks[ka].memory_bytes > in.cluster.ranks[kb].memory_bytes;
  });
  return order;
}

struct Candidate {
  int used = 0;  // ranks the layout uses (the fastest ones, or those with the cheapest links)
  int stages = 1;
  std::optional<Plan> plan;
  LayoutProblem problem;  // when no plan
  double estimate = kInf;
  int seq = 0;  // its place in the search: ties go to the earlier
  bool simulated = false;  // estimate is the simulation's (make_plan)
};

// What the notes and NoPlanFits keep of every candidate: the plan itself is kept only
// while it may be simulated, since on a big world each plan holds every rank.
struct Outcome {
  int used = 0, stages = 1;
  bool feasible = false;
  double estimate = kInf;
  LayoutProblem problem;
};

bool estimated_before(const Candidate& a, const Candidate& b) {
  return a.estimate != b.estimate ? a.estimate < b.estimate : a.seq < b.seq;
}

// Drops the plans that can no longer be simulated: kept are the kSimulatedCandidates
// best by estimate and the best of every rank count (make_plan simulates no others).
void keep_best(std::vector<Candidate>& kept) {
  std::sort(kept.begin(), kept.end(), estimated_before);
  std::vector<int> counts;  // rank counts whose best is already kept
  std::vector<Candidate> out;
  for (size_t i = 0; i < kept.size(); ++i) {
    const bool first_of_count = std::find(counts.begin(), counts.end(), kept[i].used) == counts.end();
    if (first_of_count) counts.push_back(kept[i].used);
    if (i < kSimulatedCandidates || first_of_count) out.push_back(std::move(kept[i]));
  }
  kept = std::move(out);
}

// The hub holds every sum, so it can step the optimiser for all and send the weights
// instead (the same traffic): the others skip the step and keep no state. A slow rank's
// step then costs it nothing, and the hub's memory does not change. `p` (of `used` ranks,
// estimated at `estimate`) becomes that plan where it is estimated faster.
void hub_step_if_faster(const PlannerInput& in, const LinkTiers& tiers, int used, Plan& p, double& estimate) {
  const bool unsharded = std::all_of(p.ranks.begin(), p.ranks.end(), [](const RankPlan& r) { return r.optimizer_shard == 1; });
  if (!in.hub_may_step_optimizer || p.layout.reduce_owner < 0 || !unsharded ||
      used != static_cast<int>(in.cluster.ranks.size()))
    return;
  Plan h = p;
  set_hub_steps_optimizer(h, true);
  for (RankPlan& rp : h.ranks) rp.memory = rank_memory(h, in.costs, rp);
  if (const double e = finish(h, in.costs, in.cluster, false, {}, &tiers); e < estimate) {
    estimate = e;
    p = std::move(h);
  }
}

// Where a candidate recomputes, more micro-batches first may fit without: recomputation
// costs a forward a step, many small micro-batches their calls' fixed costs, and the
// estimate weighs them (a 7B-class model's pipeline on 4 v100s and 4 a100s recomputed in
// 147 micro-batches of 7, 2,216 s a step, where 1,024 of 1 fit without it: 1,622 s). The
// variant, fitted from the candidate's skeleton `q`, replaces its plan where its estimate
// is lower.
void try_micro_batches_first(const PlannerInput& in, const LinkTiers& tiers, Plan q, Candidate& c) {
  if (fit_memory(q, in.costs, in.may_shard_optimizer, true)) return;
  q.layout.reduce_owner = cheapest_reduce_owner(q, in.costs, in.cluster, &tiers).owner;
  const double e = finish(q, in.costs, in.cluster, false, {}, &tiers);
  if (e >= kVariantMinGain * c.estimate) return;
  c.estimate = e;
  hub_step_if_faster(in, tiers, c.used, q, c.estimate);
  c.plan = std::move(q);
}

// Where a replica's share by speed does not fit its device even with every memory
// strategy, it takes the most samples that do and the others the rest (split_batch's
// max_samples): a fast rank of little memory had the whole layout refused. The most is
// found by halving, each try a whole fit (optimiser sharding couples the replicas), one
// replica at a time, at most once each; `shares`, `p` and `shortfall` become the capped
// split's where one is found, and stay as they were otherwise.
void cap_shares_to_memory(const PlannerInput& in, const std::vector<std::vector<int>>& layout,
                          const std::vector<std::pair<int, int>>& ranges, int micro_batches,
                          std::vector<ReplicaCapacity> speed, std::vector<int64_t>& shares, Plan& p,
                          std::optional<Shortfall>& shortfall) {
  // The skeleton numbers replicas by their row of `layout` (-1: idle).
  auto replica_of = [](const Plan& q, int rank) { return q.ranks[static_cast<size_t>(rank)].replica; };
  using Split = std::tuple<std::vector<int64_t>, Plan, std::optional<Shortfall>>;
  // Not rank 0's evaluation either: it is held at its eval batch, whatever the shares.
  for (size_t round = 0; shortfall && !shortfall->host && !shortfall->evaluation && round < layout.size();
       ++round) {
    const int r = replica_of(p, shortfall->rank);
    if (r < 0 || speed[static_cast<size_t>(r)].max_samples >= 0 || shares[static_cast<size_t>(r)] <= 1) return;
    // The split with replica r at most `most` samples, where r fits it (another replica
    // may not: the next round's).
    auto attempt = [&](int64_t most) -> std::optional<Split> {
      std::vector<ReplicaCapacity> capped = speed;
      capped[static_cast<size_t>(r)].max_samples = most;
      bool room = false;  // whether the caps leave the batch a place
      int64_t held = 0;
      for (const ReplicaCapacity& x : capped) {
        if (x.max_samples < 0) room = true;
        else held += x.max_samples;
      }
      if (!room && held < in.global_batch) return std::nullopt;
      std::vector<int64_t> s = split_batch(in.global_batch, capped);
      Plan q = skeleton(in, layout, ranges, s, micro_batches);
      std::optional<Shortfall> f = fit_memory(q, in.costs, in.may_shard_optimizer);
      // r fits where what is short is another replica or the evaluation (checked once
      // the training fits), which that split then reports.
      if (f && !f->evaluation && replica_of(q, f->rank) == r) return std::nullopt;
      return Split{std::move(s), std::move(q), std::move(f)};
    };
    int64_t low = 0, high = shares[static_cast<size_t>(r)];  // fits at low (0: none found yet), not at high
    std::optional<Split> best;
    while (high - low > 1) {
      const int64_t mid = low + (high - low) / 2;
      if (std::optional<Split> got = attempt(mid)) {
        low = mid;
        best = std::move(got);
      } else {
        high = mid;
      }
    }
    if (!best) return;
    speed[static_cast<size_t>(r)].max_samples = low;
    std::tie(shares, p, shortfall) = std::move(*best);
  }
}

// A layout and its stage split made a candidate: shares by speed, the memory strategies,
// the reduce owner and the estimate (or why it does not fit), into `c`.
void complete(const PlannerInput& in, const LinkTiers& tiers, std::vector<std::vector<int>> layout,
              std::vector<std::pair<int, int>> ranges, int micro_batches, Candidate& c) {
  const int replicas = static_cast<int>(layout.size()), stages = static_cast<int>(ranges.size());
  std::vector<ReplicaCapacity> speed(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    double slowest = 0;
    for (int s = 0; s < stages; ++s) {
      const auto& row = in.costs.seconds_per_sample[static_cast<size_t>(layout[r][s])];
      slowest = std::max(slowest, std::accumulate(row.begin() + ranges[s].first,
                                                  row.begin() + ranges[s].second, 0.0));
    }
    speed[static_cast<size_t>(r)].samples_per_s = 1 / slowest;
  }
  std::vector<int64_t> shares = split_batch(in.global_batch, speed);
  Plan p = skeleton(in, layout, ranges, shares, micro_batches);
  std::optional<Shortfall> shortfall = fit_memory(p, in.costs, in.may_shard_optimizer);
  cap_shares_to_memory(in, layout, ranges, micro_batches, speed, shares, p, shortfall);
  if (shortfall) {
    c.problem.kind = LayoutProblemKind::memory;
    c.problem.shortfall = std::move(*shortfall);
    return;
  }
  p.layout.reduce_owner = cheapest_reduce_owner(p, in.costs, in.cluster, &tiers).owner;
  c.estimate = finish(p, in.costs, in.cluster, false, {}, &tiers);
  const bool recomputes = std::any_of(p.ranks.begin(), p.ranks.end(), [](const RankPlan& r) { return r.recompute; });
  hub_step_if_faster(in, tiers, c.used, p, c.estimate);
  c.plan = std::move(p);
  if (recomputes)
    try_micro_batches_first(in, tiers, skeleton(in, std::move(layout), std::move(ranges), shares, micro_batches), c);
}

// Layout `stages` x R over `order` (ranks, grouped R at a time: group g -> stage g).
Candidate build(const PlannerInput& in, const LinkTiers& tiers, int stages, const std::vector<int>& order,
                int micro_batches) {
  Candidate c;
  c.stages = stages;
  c.used = static_cast<int>(order.size());
  const int world = c.used;
  const int replicas = world / stages;
  if (in.global_batch < replicas) {
    c.problem.kind = LayoutProblemKind::batch_below_replicas;
    c.problem.global_batch = in.global_batch;
    c.problem.replicas = replicas;
    return c;
  }
  std::vector<std::vector<int>> layout(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r)
    for (int s = 0; s < stages; ++s) layout[r].push_back(order[static_cast<size_t>(s * replicas + r)]);

  const int blocks = static_cast<int>(in.costs.params.size());
  std::vector<std::vector<std::pair<int, int>>> splits{{{0, blocks}}};
  if (stages > 1) {
    StagePartitionInput pin;
    pin.memory_bytes = in.costs.state_bytes;
    pin.activation_bytes = in.costs.activation_bytes;
    pin.workspace_bytes = in.costs.workspace_bytes;
    for (int s = 0; s < stages; ++s) {
      std::vector<double> mean(static_cast<size_t>(blocks), 0);
      const DeviceModel* smallest = nullptr;
      for (int r = 0; r < replicas; ++r) {
        const auto k = static_cast<size_t>(layout[r][s]);
        for (size_t b = 0; b < mean.size(); ++b) mean[b] += in.costs.seconds_per_sample[k][b] / replicas;
        if (!smallest || in.cluster.ranks[k].memory_bytes < smallest->memory_bytes)
          smallest = &in.cluster.ranks[k];
      }
      pin.compute_seconds.push_back(std::move(mean));
      pin.devices.push_back(*smallest);
    }
    for (int s = 0; s < stages; ++s)
      for (int r = 0; r < replicas; ++r)
        if (layout[r][s] == 0) pin.whole_model_stage = s;  // see rank_memory
    if (pin.whole_model_stage >= 0) {
      for (double params : in.costs.params) pin.weight_bytes.push_back(kWeightBytesPerParam * params);
      pin.whole_model_capacity = in.cluster.ranks[0].memory_bytes;
      pin.whole_model_device = in.cluster.ranks[0].label();
      pin.whole_model_streamed = in.cluster.ranks[0].kind != DeviceKind::cpu;  // see rank_memory
    }
    pin.micro_batches = micro_batches;
    pin.micro_batch_size = std::max<int64_t>(1, in.global_batch / replicas / micro_batches);
    splits.clear();
    try {
      splits.push_back(partition_stages(pin).ranges);
    } catch (const StageSplitError&) {
    }
    // Also the split for the least activation memory (one sample in flight), where the
    // memory strategies decide the rest: a split that fits at this M only by filling a
    // stage may then need recomputation and many micro-batches, where a roomier one needs
    // neither (a 7B-class model on 4 v100s and 4 a100s: 2,200 s a step against 1,630).
    // The better estimate of the two is the candidate.
    pin.micro_batches = pin.micro_batch_size = 1;
    try {
      std::vector<std::pair<int, int>> roomy = partition_stages(pin).ranges;
      if (splits.empty() || roomy != splits.front()) splits.push_back(std::move(roomy));
    } catch (const StageSplitError& e) {
      if (splits.empty()) {
        c.problem.kind = LayoutProblemKind::no_stage_split;
        c.problem.split = e.failure;
        return c;
      }
    }
  }

  std::optional<Candidate> best;  // where neither split fits, the first one's problem
  for (const std::vector<std::pair<int, int>>& ranges : splits) {
    Candidate t = c;
    complete(in, tiers, layout, ranges, micro_batches, t);
    if (!best || (t.plan && (!best->plan || t.estimate < best->estimate))) best = std::move(t);
  }
  return std::move(*best);
}

// Stage counts to try over `used` ranks: S divides them, S <= blocks; restricted by the
// strategy.
std::vector<int> stage_counts(const PlannerInput& in, int used) {
  const int blocks = static_cast<int>(in.costs.params.size());
  if (in.strategy == Asked::data || in.strategy == Asked::equal || in.one_stage) return {1};
  if (in.strategy == Asked::pipeline) {
    HT_CHECK(used <= blocks, "planner: a pipeline over all ", used,
             " ranks needs a block per stage but the model has ", blocks, " blocks");
    return {used};
  }
  std::vector<int> out;
  for (int s = 1; s <= std::min(used, blocks); ++s)
    if (used % s == 0) out.push_back(s);
  return out;
}

// How many of the fastest ranks (`sorted`) to try: all of them and, under auto, the
// fastest alone and every count before a step down in speed (kSpeedStep).
std::vector<int> rank_counts(const PlannerInput& in, const std::vector<int>& sorted) {
  const int world = static_cast<int>(sorted.size());
  if (in.strategy != Asked::automatic || in.use_every_rank) return {world};
  // The fastest rank alone, always: among equal ranks (no speed step) a synchronous
  // plan's best is one of them or all of them (k of them take C / k + A(k), a ring's A
  // growing as (k - 1) / k), so where the reduction costs more than their compute gives
  // back, one alone is the plan (4 rtx3060 on 1 GbE planned the CNN at 21.7 ms a step,
  // one of them alone takes 0.85 ms).
  std::vector<int> out{1};
  for (int k = 2; k < world; ++k)
    if (replica_samples_per_s(in.costs, sorted[static_cast<size_t>(k)]) <
        kSpeedStep * replica_samples_per_s(in.costs, sorted[static_cast<size_t>(k - 1)]))
      out.push_back(k);
  if (world > 1) out.push_back(world);
  return out;
}

// The (ranks used, stages) shapes over `used` of the fastest ranks: the stage counts that
// divide them and, under auto, every other stage count S that leaves at most
// kMaxShapeIdle of them over, on the fastest S x floor(used / S), the rest idle. Without
// those a rank added could make the plan worse: the 1.3B-class GPT on 11 rtx3060
// planned as an 11-stage pipeline at 291 s a step where 10 of them as 2 x 5 take 230 s,
// 11 having no other divisor. The idle rule (kIdleMinGain) then weighs them. Every
// stage count was too many to try: the 1,024 ranks of tools/bench-plan took 2.4 s
// where they take 0.15 s.
std::vector<std::pair<int, int>> shapes_over(const PlannerInput& in, int used) {
  std::vector<std::pair<int, int>> out;
  for (int stages : stage_counts(in, used)) out.emplace_back(used, stages);
  if (in.strategy != Asked::automatic || in.use_every_rank || in.one_stage) return out;
  const int blocks = static_cast<int>(in.costs.params.size());
  for (int stages = 2; stages <= std::min(used, blocks); ++stages)
    if (used % stages != 0 && used % stages <= kMaxShapeIdle) out.emplace_back(stages * (used / stages), stages);
  return out;
}

// The (ranks used, stages) shapes to search, in order: for every count of the fastest
// ranks (rank_counts), shapes_over it; and under auto, where the count has more
// replicas of S stages than the batch has samples, the fastest S x batch ranks as S
// stages of one-sample-or-more replicas (every replica needs a sample), the rest idle.
// The count's own shape is kept too: it is ruled out, and says why.
std::vector<std::pair<int, int>> layout_shapes(const PlannerInput& in, const std::vector<int>& sorted) {
  const int blocks = static_cast<int>(in.costs.params.size());
  std::vector<std::pair<int, int>> out;
  auto add = [&](int used, int stages) {
    if (std::find(out.begin(), out.end(), std::pair{used, stages}) == out.end()) out.emplace_back(used, stages);
  };
  for (int used : rank_counts(in, sorted)) {
    for (const auto& [u, stages] : shapes_over(in, used))
      if (static_cast<int64_t>(u / stages) <= in.global_batch) add(u, stages);
    for (int stages : stage_counts(in, used)) add(used, stages);  // ruled out where too many replicas: says why
    if (in.strategy != Asked::automatic) continue;
    for (int stages = 1; stages <= std::min(used, blocks); ++stages)
      if (static_cast<int64_t>(used) > stages * in.global_batch)
        add(static_cast<int>(stages * in.global_batch), stages);
  }
  return out;
}

// Each rank's class (plan_costs.h's cost_classes) and rank 0 alone: it also holds the
// whole model in a pipeline, so it is never like another.
std::vector<int> class_of_rank(const PlannerInput& in, const LinkTiers& tiers) {
  std::vector<int> klass = cost_classes(in.cluster, in.costs, tiers);
  for (int& k : klass) ++k;
  if (!klass.empty()) klass[0] = 0;
  return klass;
}

std::vector<int> idle_ranks(const Plan& p) {
  std::vector<int> idle;
  for (const RankPlan& r : p.ranks)
    if (r.replica < 0) idle.push_back(r.rank);
  return idle;
}

// The pipeline orders tried for S groups of the speed order.
std::vector<std::vector<int>> group_orders(const PlannerInput& in, const std::vector<int>& sorted,
                                           int stages) {
  const int replicas = static_cast<int>(sorted.size()) / stages;
  std::vector<int> fastest_first(static_cast<size_t>(stages));
  std::iota(fastest_first.begin(), fastest_first.end(), 0);
  std::vector<std::vector<int>> orders{fastest_first};
  if (stages == 1) return orders;
  orders.emplace_back(fastest_first.rbegin(), fastest_first.rend());
  std::vector<int> memory_first = fastest_first;
  auto group_memory = [&](int g) {
    double m = kInf;
    for (int r = 0; r < replicas; ++r)
      m = std::min(m, in.cluster.ranks[static_cast<size_t>(sorted[g * replicas + r])].memory_bytes);
    return m;
  };
  std::stable_sort(memory_first.begin(), memory_first.end(),
                   [&](int a, int b) { return group_memory(a) > group_memory(b); });
  if (memory_first != orders[0] && memory_first != orders[1]) orders.push_back(memory_first);
  return orders;
}

// Equal shares, uniform layers, rank-order placement, no strategies: DDP with one stage,
// DeepSpeed's pipeline default with more.
Plan equal_plan(const PlannerInput& in, const LinkTiers& tiers, int stages, int micro_batches) {
  const int world = static_cast<int>(in.cluster.ranks.size());
  // Every replica needs a sample: past the batch the last ranks in rank order stay idle.
  const int replicas = static_cast<int>(std::min<int64_t>(world / stages, in.global_batch));
  const int blocks = static_cast<int>(in.costs.params.size());
  std::vector<std::vector<int>> layout(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r)
    for (int s = 0; s < stages; ++s) layout[r].push_back(r * stages + s);
  std::vector<std::pair<int, int>> ranges;
  for (int s = 0, i = 0; s < stages; ++s) {  // "uniform": the remainder to the first stages
    const int j = i + blocks / stages + (s < blocks % stages ? 1 : 0);
    ranges.emplace_back(i, j);
    i = j;
  }
  Plan p = skeleton(in, std::move(layout), std::move(ranges),
                    equal_split(in.global_batch, static_cast<size_t>(replicas)), micro_batches);
  p.strategy = Strategy::equal;
  for (RankPlan& rp : p.ranks) {
    rp.memory = rank_memory(p, in.costs, rp);
    if (rp.memory.total() > rp.device.memory_bytes) p.baseline.shortfalls.push_back(shortfall_of(rp));
  }
  p.baseline.fits = p.baseline.shortfalls.empty();
  finish(p, in.costs, in.cluster, true, {}, &tiers);
  return p;
}

void set_baseline(Plan& plan, const Plan& equal) {
  plan.baseline.layout = equal.layout;
  plan.baseline.stage_ranges = equal.stage_ranges;
  plan.baseline.predicted = equal.predicted;
  plan.baseline.fits = equal.baseline.fits;
  plan.baseline.shortfalls = equal.baseline.shortfalls;
  plan.speedup = equal.predicted.step_seconds / plan.predicted.step_seconds;
}

}  // namespace

void predict_plan(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                  const std::vector<double>& reduce_seconds, const LinkTiers* tiers) {
  finish(plan, costs, cluster, true, reduce_seconds, tiers);
  set_speedup(plan);
}

void set_speedup(Plan& plan) {
  if (plan.baseline.predicted.step_seconds > 0 && plan.predicted.step_seconds > 0)
    plan.speedup = plan.baseline.predicted.step_seconds / plan.predicted.step_seconds;
}

SimResult simulate_plan(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster) {
  auto table = std::make_shared<const PlanCostTable>(plan_cost_table(plan, costs, cluster));
  return simulate(plan_schedules(plan), plan_cost_model(plan, table, cluster));
}

Plan make_plan(const PlannerInput& in) {
  validate(in);
  const int world = static_cast<int>(in.cluster.ranks.size());
  const int base_m = in.min_micro_batches;
  if ((in.strategy == Asked::data || in.strategy == Asked::equal) && in.global_batch < world) {
    LayoutProblem problem;
    problem.kind = LayoutProblemKind::batch_below_replicas;
    problem.global_batch = in.global_batch;
    problem.replicas = world;
    throw NoPlanFits("planner: the global batch, " + std::to_string(in.global_batch) +
                         ", is smaller than the data-parallel replicas, " + std::to_string(world) + " (one sample each at least)",
                     world,
                     in.cluster.source, config::to_string(in.strategy), {{1, world, world, std::move(problem)}});
  }

  // Found once: every candidate's all-reduce is priced by them (plan_costs.h).
  const LinkTiers tiers = link_tiers(in.cluster);
  if (in.strategy == Asked::equal) {
    Plan p = equal_plan(in, tiers, 1, base_m);
    if (!p.baseline.fits) {
      LayoutProblem problem;
      problem.shortfall = p.baseline.shortfalls[0];
      throw NoPlanFits("planner: the equal split does not fit the cluster", world, in.cluster.source,
                       config::to_string(in.strategy), {{1, world, world, std::move(problem)}});
    }
    set_baseline(p, p);
    p.candidates = 1;
    mark_slow_links(p, in.cluster);
    p.notes.push_back(work_note(p, in.costs));
    return p;
  }

  const std::vector<int> sorted = by_speed(in);
  const std::vector<int> klass = class_of_rank(in, tiers);
  std::vector<Outcome> outcomes;  // every candidate, in search order
  std::vector<Candidate> kept;    // the plans that may yet be simulated (see keep_best)
  // The shapes over the speed order; then, where some ranks sit behind links at least
  // twice as costly as the cheapest, over the order with them last (link_last_order, as
  // the local planner does), cut where the class changes: no cut of the speed order
  // leaves out a fast rank behind a slow link (three rtx3090 beside one behind a link of
  // 1 KB/s planned at 459,515 s a step).
  std::vector<std::pair<const std::vector<int>*, std::pair<int, int>>> searches;
  for (const auto& shape : layout_shapes(in, sorted)) searches.push_back({&sorted, shape});
  std::vector<int> by_links;
  if (in.strategy == Asked::automatic && !in.use_every_rank) {
    size_t kept = 0;
    by_links = link_last_order(in.cluster, sorted, &kept);
    // Every cut among the ranks behind slow links, where the class changes, and before them.
    for (int used = world - 1; used >= std::max<int>(1, static_cast<int>(kept)); --used)
      if (used == static_cast<int>(kept) || klass[static_cast<size_t>(by_links[static_cast<size_t>(used)])] !=
                                                 klass[static_cast<size_t>(by_links[static_cast<size_t>(used - 1)])])
        for (const auto& shape : shapes_over(in, used)) searches.push_back({&by_links, shape});
  }
  for (const auto& [from, shape] : searches) {
    const auto [used, stages] = shape;
    const std::vector<int> fastest(from->begin(), from->begin() + used);
    const int replicas = used / stages;
    std::vector<std::vector<int>> seen;  // the class sequences of the orders tried
    for (const std::vector<int>& groups : group_orders(in, fastest, stages)) {
      std::vector<int> order, classes;
      for (int g : groups)
        for (int r = 0; r < replicas; ++r) order.push_back(fastest[static_cast<size_t>(g * replicas + r)]);
      for (int k : order) classes.push_back(klass[static_cast<size_t>(k)]);
      // The same classes in the same places: the same candidate with like ranks swapped.
      if (std::find(seen.begin(), seen.end(), classes) != seen.end()) continue;
      seen.push_back(std::move(classes));
      std::vector<int> ms{base_m};
      if (stages > 1) ms = {std::max(base_m, stages), std::max(base_m, 2 * stages), std::max(base_m, 4 * stages)};
      ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
      for (size_t i = 0; i < ms.size(); ++i) {
        // Once M covers the largest share a replica can get, a larger M runs the same
        // micro-batches of one sample; only its stage split would count more activations
        // in flight than the pipeline holds.
        if (i > 0 && ms[i - 1] >= in.global_batch - (replicas - 1)) break;
        Candidate c = build(in, tiers, stages, order, ms[i]);
        c.seq = static_cast<int>(outcomes.size());
        outcomes.push_back({c.used, c.stages, c.plan.has_value(), c.estimate, c.problem});
        if (c.plan) {
          kept.push_back(std::move(c));
          keep_best(kept);
        }
      }
    }
  }

  if (kept.empty()) {
    std::vector<RuledOutShape> shapes;
    std::map<std::pair<int, int>, bool> said;  // one reason per rank and stage count
    for (const Outcome& c : outcomes)
      if (!said[{c.used, c.stages}]) {
        said[{c.used, c.stages}] = true;
        shapes.push_back({c.stages, c.used / c.stages, c.used, c.problem});
      }
    throw NoPlanFits("planner: no plan fits the cluster with any layout, recomputation, "
                     "micro-batching or optimizer sharding",
                     world, in.cluster.source, config::to_string(in.strategy), std::move(shapes));
  }
  std::sort(kept.begin(), kept.end(), estimated_before);
  // Simulated: the best few overall and the best of every rank count, so that leaving
  // ranks idle is weighed against the simulated best that uses them all.
  std::map<int, Candidate*> best_using;  // simulated, by ranks used
  for (size_t i = 0; i < kept.size(); ++i) {
    Candidate* c = &kept[i];
    if (i >= kSimulatedCandidates && best_using.count(c->used)) continue;
    // A rank count's best estimated at more than kUnsimulatedRatio x the best is weighed
    // by its estimate: it cannot be chosen, and simulating it (a plan of hundreds of
    // micro-batches) cost a 64-rank search seconds.
    if (i < kSimulatedCandidates || c->estimate <= kUnsimulatedRatio * kept.front().estimate) {
      finish(*c->plan, in.costs, in.cluster, true, {}, &tiers);
      c->estimate = outcomes[static_cast<size_t>(c->seq)].estimate = c->plan->predicted.step_seconds;
      c->simulated = true;
    } else {
      c->plan->predicted.step_seconds = c->estimate;  // the idle-ranks note's figure
    }
    Candidate*& b = best_using[c->used];
    if (!b || c->estimate < b->estimate) b = c;
  }
  // The most ranks, unless fewer are predicted kIdleMinGain faster.
  Candidate* chosen = nullptr;
  for (auto it = best_using.rbegin(); it != best_using.rend(); ++it)
    if (!chosen || it->second->estimate < (1 - kIdleMinGain) * chosen->estimate) chosen = it->second;
  // One weighed by its estimate alone wins only where the simulation put the best far above
  // its estimate: the plan shown is simulated all the same.
  if (!chosen->simulated) finish(*chosen->plan, in.costs, in.cluster, true, {}, &tiers);
  Plan plan = std::move(*chosen->plan);
  plan.candidates = static_cast<int>(outcomes.size());

  const int stages = static_cast<int>(plan.stage_ranges.size());
  std::optional<Plan> uniform;  // DeepSpeed's default for the chosen shape
  if (stages > 1) uniform = equal_plan(in, tiers, stages, std::max(base_m, stages));
  // DDP when the batch covers the world, else the plan's shape laid out uniformly.
  const Plan ddp = equal_plan(in, tiers, 1, base_m);
  set_baseline(plan, in.global_batch >= world || !uniform ? ddp : *uniform);
  // The search splits a one-stage batch by speed, which gives a fast replica a large part
  // of the all-reduce (parts follow the shares); where its link cannot carry that, DDP's
  // equal split of every rank is faster, and a plan is never predicted slower than the
  // baseline it is shown against (64 rtx3060 beside one h100 planned at 0.89x).
  const bool ddp_instead = in.global_batch >= world && ddp.baseline.fits && in.strategy != Asked::pipeline &&
                           ddp.predicted.step_seconds < plan.predicted.step_seconds;
  if (ddp_instead) {
    const int candidates = plan.candidates;
    plan = ddp;
    plan.strategy = Strategy::data;  // a data-parallel plan the job may rebalance, not `equal`
    plan.candidates = candidates;
    set_baseline(plan, ddp);
  }

  mark_slow_links(plan, in.cluster);
  plan.notes.push_back(work_note(plan, in.costs));
  if (plan.layout.reduce_owner >= 0) {
    Plan every = plan;  // every rank stepping its own optimiser: the hub's choice was made so
    set_hub_steps_optimizer(every, false);
    const ReduceChoice r = cheapest_reduce_owner(every, in.costs, in.cluster, &tiers);
    const auto& owners = plan.layout.replicas[static_cast<size_t>(plan.layout.reduce_owner)];
    PlanNote reduce;
    reduce.kind = NoteKind::hub_reduces;
    reduce.ranks = owners;
    reduce.seconds = r.hub_seconds;
    reduce.other_seconds = r.by_share_seconds;
    plan.notes.push_back(reduce);
    if (hub_steps_optimizer(plan)) {
      for (RankPlan& rp : every.ranks) rp.memory = rank_memory(every, in.costs, rp);
      finish(every, in.costs, in.cluster, true, {}, &tiers);
      PlanNote step;
      step.kind = NoteKind::hub_steps_optimizer;
      step.ranks = owners;
      step.seconds = plan.predicted.step_seconds;
      step.other_seconds = every.predicted.step_seconds;
      plan.notes.push_back(step);
    }
  }
  if (!ddp_instead && chosen->used < world && best_using.count(world)) {
    PlanNote idle;
    idle.kind = NoteKind::idle_ranks;
    idle.ranks = idle_ranks(plan);
    idle.world = world;
    idle.seconds = plan.predicted.step_seconds;
    idle.other_seconds = best_using[world]->plan->predicted.step_seconds;
    plan.notes.push_back(idle);
  }
  if (!ddp_instead && uniform && in.global_batch >= world) {
    PlanNote u;
    u.kind = NoteKind::uniform_baseline;
    u.stages = stages;
    u.seconds = uniform->predicted.step_seconds;
    if (!uniform->baseline.fits) {
      u.problem = LayoutProblem{};
      u.problem->shortfall = uniform->baseline.shortfalls[0];
    }
    plan.notes.push_back(u);
  }
  // The best of each shape, so the user sees what the choice was against.
  std::map<std::pair<int, int>, const Outcome*> best_of;  // by (-ranks used, stages)
  for (const Outcome& c : outcomes) {
    const Outcome*& b = best_of[{-c.used, c.stages}];
    if (!b || (c.feasible && (!b->feasible || c.estimate < b->estimate))) b = &c;
  }
  note_host_memory(plan);
  for (const auto& [key, c] : best_of) {
    PlanNote shape;
    shape.kind = NoteKind::shape;
    shape.stages = c->stages;
    shape.replicas = c->used / c->stages;
    shape.ranks_used = c->used;
    shape.world = world;
    if (c->feasible) shape.seconds = c->estimate;
    else shape.problem = c->problem;
    // Faster than the plan over more ranks, but not by kIdleMinGain: say why not taken.
    // (Not where DDP's equal split replaced the chosen plan: the plan shown is another.)
    if (!ddp_instead && c->feasible && c->used < chosen->used && c->estimate < chosen->estimate)
      shape.other_seconds = chosen->estimate;
    plan.notes.push_back(shape);
  }
  return plan;
}

}  // namespace ht::plan
