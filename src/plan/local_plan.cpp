#include "plan/local_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "plan/batch_split.h"
#include "plan/memory_fit.h"
#include "plan/plan_costs.h"
#include "plan/planner.h"

namespace ht::plan {

namespace {

// Bytes the outer step streams per parameter on every rank: it reads the group's
// weights, the round's anchor, the outer weights and the momentum and writes the last
// three and the weights (the delta's all-reduce is counted apart).
constexpr double kOuterBytesPerParam = 4 * 8;

double total_params(const BlockCosts& costs) {
  return std::accumulate(costs.params.begin(), costs.params.end(), 0.0);
}

}  // namespace

BlockCosts costs_of(const BlockCosts& costs, const std::vector<int>& ranks) {
  BlockCosts out = costs;
  auto pick = [&](auto& rows, const auto& from) {
    if (from.empty()) return;
    rows.clear();
    for (int r : ranks) rows.push_back(from[static_cast<size_t>(r)]);
  };
  pick(out.seconds_per_sample, costs.seconds_per_sample);
  pick(out.call_seconds, costs.call_seconds);
  pick(out.step_seconds, costs.step_seconds);
  pick(out.source, costs.source);
  out.comm_overhead_seconds.clear();
  for (int r : ranks) out.comm_overhead_seconds.push_back(comm_overhead_seconds(costs, static_cast<size_t>(r)));
  return out;
}

ClusterModel cluster_of(const ClusterModel& cluster, const std::vector<int>& ranks) {
  ClusterModel out;
  out.source = cluster.source;
  for (int a : ranks) {
    const auto i = static_cast<size_t>(a);
    out.ranks.push_back(cluster.ranks[i]);
    std::vector<double> lat, bw;
    for (int b : ranks) {
      lat.push_back(cluster.latency_s[i][static_cast<size_t>(b)]);
      bw.push_back(cluster.bandwidth_bytes_per_s[i][static_cast<size_t>(b)]);
    }
    out.latency_s.push_back(lat);
    out.bandwidth_bytes_per_s.push_back(bw);
    if (i < cluster.block_seconds.size()) out.block_seconds.push_back(cluster.block_seconds[i]);
    if (i < cluster.block_step_seconds.size()) out.block_step_seconds.push_back(cluster.block_step_seconds[i]);
    if (i < cluster.block_call_seconds.size()) out.block_call_seconds.push_back(cluster.block_call_seconds[i]);
  }
  return out;
}

std::vector<int> group_ranks(const Plan& plan, int group) {
  HT_CHECK(plan.local && group >= 0 && group < static_cast<int>(plan.local->groups.size()), "group_ranks: group ",
           group, " of a plan with ", plan.local ? plan.local->groups.size() : 0, " groups");
  std::vector<int> out;
  for (int r : plan.local->groups[static_cast<size_t>(group)])
    for (int rank : plan.layout.replicas[static_cast<size_t>(r)]) out.push_back(rank);
  return out;
}

std::vector<int64_t> local_batches(const Plan& plan, int group, int64_t step) {
  const int64_t h = plan.local->inner_steps, hg = plan.local->group_steps[static_cast<size_t>(group)];
  const int64_t round = step / h, slot = step % h;
  auto first_in = [&](int64_t s) { return (s * hg + h - 1) / h; };  // ceil(s H_g / H)
  std::vector<int64_t> out;
  for (int64_t k = first_in(slot); k < first_in(slot + 1); ++k) out.push_back(round * h + group_first_step(plan, group) + k);
  return out;
}

double round_weight(const Plan& plan, int rank) {
  const int g = group_of_rank(plan, rank);
  if (g < 0) return 0;
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  return static_cast<double>(rp.samples) * plan.local->group_steps[static_cast<size_t>(g)] /
         (static_cast<double>(plan.global_batch) * plan.local->inner_steps);
}

int64_t batches_in_round(const Plan& plan, int group, int64_t job_steps) {
  const int64_t h = plan.local->inner_steps, hg = plan.local->group_steps[static_cast<size_t>(group)];
  HT_CHECK(job_steps >= 0 && job_steps <= h, "local plan: ", job_steps, " job steps into a round of ", h,
           "; expected 0..", h);
  return (job_steps * hg + h - 1) / h;
}

double partial_round_weight(const Plan& plan, int rank, int64_t job_steps) {
  const int g = group_of_rank(plan, rank);
  if (g < 0) return 0;
  int64_t all = 0;
  for (size_t k = 0; k < plan.local->groups.size(); ++k) all += batches_in_round(plan, static_cast<int>(k), job_steps);
  if (all == 0) return 0;
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  return static_cast<double>(rp.samples) * static_cast<double>(batches_in_round(plan, g, job_steps)) /
         (static_cast<double>(plan.global_batch) * static_cast<double>(all));
}

int group_of_rank(const Plan& plan, int rank) {
  if (!plan.local) return -1;
  const int replica = plan.ranks[static_cast<size_t>(rank)].replica;
  for (size_t g = 0; g < plan.local->groups.size(); ++g)
    for (int r : plan.local->groups[g])
      if (r == replica) return static_cast<int>(g);
  return -1;
}

int64_t group_samples(const Plan& plan, int group) {
  int64_t s = 0;
  for (int r : plan.local->groups[static_cast<size_t>(group)]) s += plan.layout.samples[static_cast<size_t>(r)];
  return s;
}

int64_t group_first_step(const Plan& plan, int group) {
  int64_t s = 0;
  for (int g = 0; g < group; ++g) s += plan.local->group_steps[static_cast<size_t>(g)];
  return s;
}

std::vector<int> steps_by_speed(int round_steps, const std::vector<double>& step_seconds,
                                const std::vector<double>& round_seconds) {
  const size_t n = step_seconds.size();
  HT_CHECK(n >= 1 && round_steps >= static_cast<int>(n), "local plan: ", round_steps, " inner steps a round for ",
           n, " groups; expected at least one per group");
  HT_CHECK(round_seconds.empty() || round_seconds.size() == n, "local plan: ", round_seconds.size(),
           " round costs for ", n, " groups; expected one per group");
  auto fixed = [&](size_t g) { return round_seconds.empty() ? 0.0 : round_seconds[g]; };
  // Greedy on the round's end: each further step goes to the group that would then end
  // the round earliest, which minimises the latest group's round.
  std::vector<int> h(n, 1);
  for (int k = static_cast<int>(n); k < round_steps; ++k) {
    size_t best = 0;
    for (size_t g = 1; g < n; ++g)
      if ((h[g] + 1) * step_seconds[g] + fixed(g) < (h[best] + 1) * step_seconds[best] + fixed(best)) best = g;
    ++h[best];
  }
  return h;
}

double round_step_seconds(const std::vector<double>& step_seconds, const std::vector<double>& round_seconds,
                          int round_steps) {
  const std::vector<int> h = steps_by_speed(round_steps, step_seconds, round_seconds);
  double r = 0;
  for (size_t g = 0; g < h.size(); ++g)
    r = std::max(r, h[g] * step_seconds[g] + (round_seconds.empty() ? 0.0 : round_seconds[g]));
  return r / round_steps;
}

int choose_round_steps(const std::vector<double>& step_seconds, const std::vector<double>& round_seconds, int least) {
  HT_CHECK(least >= static_cast<int>(step_seconds.size()), "local plan: at least ", least, " steps a round for ",
           step_seconds.size(), " groups; expected one per group at least");
  const int most = std::max(least, kMaxRoundSteps);
  std::vector<double> cost;
  for (int c = least; c <= most; ++c) cost.push_back(round_step_seconds(step_seconds, round_seconds, c));
  const double best = *std::min_element(cost.begin(), cost.end());
  int c = least;
  while (cost[static_cast<size_t>(c - least)] > (1 + kNearBestRound) * best) ++c;
  return c;
}

void check_local_plan(const Plan& plan) {
  HT_CHECK(plan.local, "check_local_plan: the plan has no local groups");
  const LocalSync& l = *plan.local;
  HT_CHECK(plan.stage_ranges.size() == 1 && replicates_whole_model(plan), "local plan: ",
           plan.stage_ranges.size(), " stages or optimiser sharding; expected one stage over the whole model on every rank");
  HT_CHECK(l.inner_steps >= 1, "local plan: inner_steps ", l.inner_steps, "; expected at least 1");
  HT_CHECK(!l.groups.empty(), "local plan: no groups; expected at least one");
  std::vector<int> seen(plan.layout.replicas.size(), 0);
  int next = 0;
  for (const auto& g : l.groups) {
    HT_CHECK(!g.empty(), "local plan: an empty group; expected at least one replica in each");
    for (int r : g) {
      HT_CHECK(r >= 0 && r < static_cast<int>(seen.size()), "local plan: group replica ", r, "; expected 0..",
               seen.size() - 1);
      HT_CHECK(r == next, "local plan: replica ", r, " where ", next,
               " was expected (groups hold consecutive replicas, in order)");
      ++seen[static_cast<size_t>(r)];
      ++next;
    }
  }
  HT_CHECK(next == static_cast<int>(seen.size()), "local plan: the groups hold ", next, " of the ", seen.size(),
           " replicas; expected every replica in exactly one group");
  HT_CHECK(l.group_steps.size() == l.groups.size(), "local plan: group_steps has ", l.group_steps.size(),
           " entries for ", l.groups.size(), " groups; expected one per group");
  int64_t steps = 0;
  for (size_t g = 0; g < l.groups.size(); ++g) {
    HT_CHECK(l.group_steps[g] >= 1, "local plan: group ", g, " takes ", l.group_steps[g],
             " inner steps a round; expected at least 1");
    steps += l.group_steps[g];
    int64_t samples = 0;
    for (int r : l.groups[g]) samples += plan.layout.samples[static_cast<size_t>(r)];
    HT_CHECK(samples == plan.global_batch, "local plan: group ", g, "'s replicas take ", samples,
             " samples a step; expected the global batch ", plan.global_batch, " (a group's inner step is one global batch)");
  }
  HT_CHECK(steps == l.inner_steps, "local plan: the groups' inner steps sum to ", steps, " a round but inner_steps is ",
           l.inner_steps, "; expected them equal (a round is inner_steps global batches)");
}

Plan group_plan(const Plan& plan, int group) {
  check_local_plan(plan);
  Plan p;
  p.config_name = plan.config_name;
  p.config_hash = plan.config_hash;
  p.cluster_source = plan.cluster_source;
  p.blocks = plan.blocks;
  p.strategy = Strategy::data;
  p.stage_ranges = plan.stage_ranges;
  const PipelineLayout& l = plan.layout;
  int next = 0;
  for (int r : plan.local->groups[static_cast<size_t>(group)]) {
    const auto k = static_cast<size_t>(r);
    p.layout.replicas.push_back({next});
    p.layout.samples.push_back(l.samples[k]);
    p.layout.micro_batches.push_back(l.micro_batches[k]);
    if (!l.recompute.empty()) p.layout.recompute.push_back(l.recompute[k]);
    if (!l.forward_seconds.empty()) p.layout.forward_seconds.push_back(l.forward_seconds[k]);
    if (!l.backward_seconds.empty()) p.layout.backward_seconds.push_back(l.backward_seconds[k]);
    RankPlan rp = plan.ranks[static_cast<size_t>(l.replicas[k][0])];
    rp.rank = next;
    rp.replica = next;
    p.ranks.push_back(rp);
    ++next;
  }
  p.world_size = next;
  p.global_batch = std::accumulate(p.layout.samples.begin(), p.layout.samples.end(), int64_t{0});
  p.predicted = plan.predicted;
  return p;
}

namespace {

// Every rank's share of each parameter's delta (its samples / global batch), and the
// delta exchange's predicted seconds over every rank.
double exchange_seconds(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster) {
  if (plan.local->groups.size() < 2) return 0;
  std::vector<int> all;
  std::vector<double> parts;
  for (const RankPlan& rp : plan.ranks) {  // idle ranks too: they take the sums
    all.push_back(rp.rank);
    parts.push_back(round_weight(plan, rp.rank));
  }
  return weighted_allreduce_seconds(cluster, all, parts, total_params(costs) * kGradBytesPerParam);
}

double update_seconds(const Plan& plan, const BlockCosts& costs, int rank) {
  const double bw = plan.ranks[static_cast<size_t>(rank)].device.memory_bandwidth;
  return bw > 0 ? total_params(costs) * kOuterBytesPerParam / bw : 0;
}

}  // namespace

std::vector<Schedule> outer_sync_schedules(const Plan& plan) {
  HT_CHECK(plan.local, "outer_sync_schedules: the plan is not local");
  std::vector<Schedule> out(plan.ranks.size());
  for (Schedule& s : out) {
    s.push_back(Instruction{Op::outer_sync_finish});
    s.push_back(Instruction{Op::outer_sync_start});
  }
  return out;
}

CostModel outer_sync_cost_model(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                                double inner_step_seconds) {
  const double exchange = exchange_seconds(plan, costs, cluster);
  const double hidden = plan.local->inner_steps * inner_step_seconds;
  CostModel m;
  std::vector<double> update;
  for (const RankPlan& rp : plan.ranks) update.push_back(update_seconds(plan, costs, rp.rank));
  m.compute_seconds = [update](int rank, const Instruction& in) {
    HT_CHECK(in.op == Op::outer_sync_start, "outer sync cost model: ", op_name(in.op), " is not compute");
    return update[static_cast<size_t>(rank)];
  };
  m.reduce_seconds = [exposed = std::max(0.0, exchange - hidden)](int, int) { return exposed; };
  return m;
}

void predict_local(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster, double sync_step_seconds,
                   int64_t local_steps) {
  LocalSync& l = *plan.local;
  const size_t n = l.groups.size();
  std::vector<double> step(n);  // each group's inner step, one global batch
  std::vector<Plan> subs;
  for (size_t g = 0; g < n; ++g) {
    const std::vector<int> ranks = group_ranks(plan, static_cast<int>(g));
    Plan sub = group_plan(plan, static_cast<int>(g));
    predict_plan(sub, costs_of(costs, ranks), cluster_of(cluster, ranks));
    step[g] = sub.predicted.step_seconds;
    subs.push_back(std::move(sub));
  }
  const double exchange = exchange_seconds(plan, costs, cluster);
  l.outer_exchange_seconds = exchange;
  // A job step at the groups' summed speed: what a round of H global batches takes per
  // batch when the H_g split is exact.
  double rate = 0;
  for (double t : step) rate += 1 / t;
  const double ideal = 1 / rate;
  // Each group's round also holds its own outer pass (OuterSyncStart on its slowest
  // rank), which the split of the round's steps and the choice of H allow for.
  std::vector<double> fixed(n, 0.0);
  for (size_t g = 0; g < n; ++g)
    for (int r : group_ranks(plan, static_cast<int>(g))) fixed[g] = std::max(fixed[g], update_seconds(plan, costs, r));
  auto round_seconds = [&](const std::vector<int>& h) {
    double r = 0;
    for (size_t g = 0; g < n; ++g) r = std::max(r, h[g] * step[g]);
    return r;
  };
  int h = 0;
  if (local_steps > 0) {
    HT_CHECK(local_steps >= static_cast<int64_t>(n), "parallel.local_steps ", local_steps, " is below the plan's ", n,
             " local groups; expected at least ", n, " (every group takes at least one inner step a round)");
    h = static_cast<int>(local_steps);
  } else {
    const int least = std::max(static_cast<int>(n), static_cast<int>(std::ceil(kHideFactor * exchange / ideal)));
    h = choose_round_steps(step, fixed, least);
  }
  l.inner_steps = h;
  l.group_steps = steps_by_speed(h, step, fixed);
  const double round = round_seconds(l.group_steps);
  for (size_t g = 0; g < n; ++g) {
    const std::vector<int> ranks = group_ranks(plan, static_cast<int>(g));
    for (size_t i = 0; i < ranks.size(); ++i)
      plan.ranks[static_cast<size_t>(ranks[i])].busy_fraction =
          subs[g].ranks[i].busy_fraction * l.group_steps[g] * step[g] / round;
  }
  const double inner = round / h;  // a job step: a round's time per global batch
  // The outer synchronisation's own lists, simulated: what a round adds to its H steps.
  const SimResult outer = simulate(outer_sync_schedules(plan), outer_sync_cost_model(plan, costs, cluster, inner));
  const double job_step = inner + outer.step_seconds / h;
  plan.predicted.step_seconds = job_step;
  plan.predicted.samples_per_s = static_cast<double>(plan.global_batch) / job_step;
  plan.predicted.bubble_fraction = 0;
  l.sync_step_seconds = sync_step_seconds;
  l.gain = sync_step_seconds > 0 ? sync_step_seconds / job_step : 0;
}

}  // namespace ht::plan
