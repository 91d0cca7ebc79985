#include "plan/plan_costs.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "core/error.h"
#include "plan/stage_memory.h"

namespace ht::plan {

namespace {

// A message waits for its receiver to wake as well as for the link.
double message_seconds(const ClusterModel& c, int src, int dst, double bytes) {
  if (src == dst) return 0;
  const double bw = c.bandwidth_bytes_per_s[src][dst];
  return c.latency_s[src][dst] + (bw > 0 ? bytes / bw : 0) +
         wake_seconds(c.ranks[static_cast<size_t>(dst)]);
}

// Stage s's all-reduce under the layout's reduce_parts, or its optimiser shards.
AllreduceRounds stage_reduce_rounds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs,
                                    const ClusterModel& cluster, size_t s) {
  std::vector<int> group;
  for (const auto& replica : layout.replicas) group.push_back(replica[s]);
  const auto [begin, end] = plan.stage_ranges[s];
  const double params = stage_footprint(costs, begin, end).params;
  return weighted_allreduce_rounds(cluster, group, stage_reduce_parts(plan, layout, s), params * kGradBytesPerParam);
}

double stage_reduce_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs,
                            const ClusterModel& cluster, size_t s) {
  std::vector<int> group;
  for (const auto& replica : layout.replicas) group.push_back(replica[s]);
  const auto [begin, end] = plan.stage_ranges[s];
  const double params = stage_footprint(costs, begin, end).params;
  return weighted_allreduce_seconds(cluster, group, stage_reduce_parts(plan, layout, s), params * kGradBytesPerParam);
}

// One round's link time (latency and the slowest member's transfer), the owners' longest
// wake and every member's: the parts of weighted_allreduce_seconds.
struct AllreduceTerms {
  double round = 0, owner_wake = 0, any_wake = 0;
};
AllreduceTerms allreduce_terms(const ClusterModel& cluster, const std::vector<int>& group,
                               const std::vector<double>& parts, double bytes);

}  // namespace

double wake_seconds(const DeviceModel& d) {
  if (d.cpu_quota <= 0 || d.cpu_quota >= 1) return 0;
  return (1 - d.cpu_quota) * (1 - d.cpu_quota) * d.cpu_quota_period_s / 2;
}

double weighted_allreduce_seconds(const ClusterModel& cluster, const std::vector<int>& group,
                                  const std::vector<double>& parts, double bytes) {
  const AllreduceTerms t = allreduce_terms(cluster, group, parts, bytes);
  return 2 * t.round + t.owner_wake + t.any_wake;
}

AllreduceRounds weighted_allreduce_rounds(const ClusterModel& cluster, const std::vector<int>& group,
                                          const std::vector<double>& parts, double bytes) {
  const AllreduceTerms t = allreduce_terms(cluster, group, parts, bytes);
  return {t.round + t.owner_wake, t.round + t.any_wake};
}

namespace {

AllreduceTerms allreduce_terms(const ClusterModel& cluster, const std::vector<int>& group,
                               const std::vector<double>& parts, double bytes) {
  const size_t n = group.size();
  if (n <= 1) return {};
  double latency = 0, round = 0, owner_wake = 0, any_wake = 0;
  for (size_t i = 0; i < n; ++i) {
    const double wake = wake_seconds(cluster.ranks[static_cast<size_t>(group[i])]);
    any_wake = std::max(any_wake, wake);
    if (parts[i] > 0) owner_wake = std::max(owner_wake, wake);
    double slowest_bw = 0;
    for (size_t j = 0; j < n; ++j) {
      if (i == j || (parts[i] <= 0 && parts[j] <= 0)) continue;  // two non-owners never talk
      const auto a = static_cast<size_t>(group[i]), b = static_cast<size_t>(group[j]);
      latency = std::max(latency, cluster.latency_s[a][b]);
      const double bw = cluster.bandwidth_bytes_per_s[a][b];
      if (slowest_bw == 0 || bw < slowest_bw) slowest_bw = bw;
    }
    const double moved = std::max(1 - parts[i], static_cast<double>(n - 1) * parts[i]) * bytes;
    if (slowest_bw > 0) round = std::max(round, moved / slowest_bw);
  }
  return {latency + round, owner_wake, any_wake};
}

}  // namespace

ReduceChoice cheapest_reduce_owner(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster) {
  const PipelineLayout& l = plan.layout;
  ReduceChoice out;
  if (l.replicas.size() < 2) return out;
  PipelineLayout hub = l;
  hub.reduce_owner = static_cast<int>(std::max_element(l.samples.begin(), l.samples.end()) - l.samples.begin());
  const double peers = static_cast<double>(l.replicas.size() - 1);
  PipelineLayout by_share = l;
  by_share.reduce_owner = -1;
  bool fits = true;
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    const RankPlan& rp = plan.ranks[static_cast<size_t>(hub.replicas[static_cast<size_t>(hub.reduce_owner)][s])];
    const auto [begin, end] = plan.stage_ranges[s];
    const double incoming = peers * stage_footprint(costs, begin, end).params * kGradBytesPerParam;
    // A sharded stage reduces by its shards either way.
    fits = fits && (!optimizer_shards(plan, s).empty() || rp.memory.total() + incoming <= rp.device.memory_bytes);
    out.by_share_seconds += stage_reduce_seconds(plan, by_share, costs, cluster, s);
    out.hub_seconds += stage_reduce_seconds(plan, hub, costs, cluster, s);
  }
  if (!fits) out.hub_seconds = 0;
  else if (out.hub_seconds < out.by_share_seconds) out.owner = hub.reduce_owner;
  return out;
}

PlanCostTable plan_cost_table(const Plan& plan, const BlockCosts& costs,
                              const ClusterModel& cluster) {
  const size_t n = plan.ranks.size();
  HT_CHECK(costs.seconds_per_sample.size() == n && cluster.ranks.size() == n,
           "plan_cost_table: the plan has ", n, " ranks, the costs ",
           costs.seconds_per_sample.size(), " and the cluster ", cluster.ranks.size());
  PlanCostTable t;
  t.stage_seconds_per_sample.assign(n, 0);
  t.pass_overhead_seconds.assign(n, 0);
  t.load_seconds_per_sample.assign(n, 0);
  t.optimizer_step_seconds.assign(n, 0);
  t.comm_overhead_seconds.assign(n, 0);
  t.activation_bytes.assign(n, 0);
  t.checkpoint_bytes.assign(n, 0);
  for (size_t r = 0; r < n; ++r) {
    const RankPlan& rp = plan.ranks[r];
    if (rp.replica < 0) continue;
    const auto& row = costs.seconds_per_sample[r];
    t.stage_seconds_per_sample[r] =
        std::accumulate(row.begin() + rp.block_begin, row.begin() + rp.block_end, 0.0);
    const DeviceModel& d = cluster.ranks[r];
    t.pass_overhead_seconds[r] =
        std::accumulate(costs.call_seconds[r].begin() + rp.block_begin,
                        costs.call_seconds[r].begin() + rp.block_end, 0.0) / 2;
    const StageFootprint f = stage_footprint(costs, rp.block_begin, rp.block_end);
    if (d.memory_bandwidth > 0)
      t.load_seconds_per_sample[r] = costs.input_bytes[static_cast<size_t>(rp.block_begin)] /
                                     d.memory_bandwidth;
    // A sharded rank updates its part of the weights; the all-gather brings the rest.
    const auto& step = costs.step_seconds[r];
    t.optimizer_step_seconds[r] =
        rp.optimizer_shard *
        std::accumulate(step.begin() + rp.block_begin, step.begin() + rp.block_end, 0.0);
    t.comm_overhead_seconds[r] = comm_overhead_seconds(costs, r);
    const auto mb = static_cast<double>(rp.micro_batch_size);
    t.activation_bytes[r] = mb * f.activation_bytes;
    t.checkpoint_bytes[r] = mb * f.checkpoint_bytes;
  }
  const size_t stages = plan.stage_ranges.size();
  t.reduce_seconds.assign(stages, 0);
  t.gather_seconds.assign(stages, 0);
  for (size_t s = 0; s < stages; ++s) {
    // A sharded stage's round 2 carries the updated weights: GatherWeights, after the step.
    if (optimizer_shards(plan, s).empty()) {
      t.reduce_seconds[s] = stage_reduce_seconds(plan, plan.layout, costs, cluster, s);
    } else {
      std::tie(t.reduce_seconds[s], t.gather_seconds[s]) = stage_reduce_rounds(plan, plan.layout, costs, cluster, s);
    }
  }
  return t;
}

CostModel plan_cost_model(const Plan& plan, std::shared_ptr<const PlanCostTable> table,
                          const ClusterModel& cluster) {
  CostModel m;
  auto layout = std::make_shared<const PipelineLayout>(plan.layout);
  std::vector<int> replica_of(plan.ranks.size(), -1);
  for (const RankPlan& rp : plan.ranks) replica_of[static_cast<size_t>(rp.rank)] = rp.replica;
  m.compute_seconds = [table, layout, replica_of](int rank, const Instruction& in) {
    const auto r = static_cast<size_t>(rank);
    if (in.op == Op::optimizer_step) return table->optimizer_step_seconds[r];
    const auto samples =
        static_cast<double>(micro_batch_samples(*layout, replica_of[r], in.micro_batch));
    const double work = samples * table->stage_seconds_per_sample[r];
    switch (in.op) {
      case Op::load_micro_batch: return samples * table->load_seconds_per_sample[r];
      case Op::forward:  // a step's communication overhead delays its first work
        return kForwardFraction * work + table->pass_overhead_seconds[r] +
               (in.micro_batch == 0 ? table->comm_overhead_seconds[r] : 0);
      case Op::recompute: return kForwardFraction * work + table->pass_overhead_seconds[r];
      case Op::backward: return (1 - kForwardFraction) * work + table->pass_overhead_seconds[r];
      default: fail("plan cost model: ", op_name(in.op), " is not compute");
    }
  };
  auto links = std::make_shared<const ClusterModel>(cluster);
  m.message_seconds = [links](int src, int dst, int64_t bytes) {
    return message_seconds(*links, src, dst, static_cast<double>(bytes));
  };
  m.reduce_seconds = [table](int, int stage) { return table->reduce_seconds[static_cast<size_t>(stage)]; };
  m.gather_seconds = [table](int, int stage) { return table->gather_seconds[static_cast<size_t>(stage)]; };
  m.activation_bytes = [table](int rank, int) {
    return static_cast<int64_t>(table->activation_bytes[static_cast<size_t>(rank)]);
  };
  m.checkpoint_bytes = [table](int rank, int) {
    return static_cast<int64_t>(table->checkpoint_bytes[static_cast<size_t>(rank)]);
  };
  return m;
}

double estimate_step_seconds(const Plan& plan, const PlanCostTable& t, const ClusterModel& cluster) {
  const PipelineLayout& l = plan.layout;
  double slowest_replica = 0;
  for (size_t r = 0; r < l.replicas.size(); ++r) {
    const auto& ranks = l.replicas[r];
    const double mb = static_cast<double>(l.samples[r]) / l.micro_batches[r];
    double first = 0, pace = 0, overhead = 0;
    for (size_t s = 0; s < ranks.size(); ++s) {
      const auto k = static_cast<size_t>(ranks[s]);
      overhead = std::max(overhead, t.comm_overhead_seconds[k]);
      const bool recompute = plan.ranks[k].recompute;
      const double compute = mb * t.stage_seconds_per_sample[k] * (1 + (recompute ? kForwardFraction : 0)) +
                             2 * t.pass_overhead_seconds[k];
      double comm = 0;
      if (s + 1 < ranks.size())
        comm += 2 * message_seconds(cluster, ranks[s], ranks[s + 1],
                                    mb * static_cast<double>(l.activation_bytes[s]));
      first += compute + comm;
      const double in_comm = s > 0 ? 2 * message_seconds(cluster, ranks[s - 1], ranks[s],
                                                         mb * static_cast<double>(l.activation_bytes[s - 1]))
                                   : 0;
      pace = std::max(pace, compute + comm + in_comm);
    }
    slowest_replica = std::max(slowest_replica, overhead + first + (l.micro_batches[r] - 1) * pace);
  }
  double reduce = 0;  // with the gather of a sharded stage, which follows the step
  for (size_t s = 0; s < t.reduce_seconds.size(); ++s)
    reduce = std::max(reduce, t.reduce_seconds[s] + (s < t.gather_seconds.size() ? t.gather_seconds[s] : 0));
  const double step = t.optimizer_step_seconds.empty() ? 0 : *std::max_element(t.optimizer_step_seconds.begin(), t.optimizer_step_seconds.end());
  return slowest_replica + reduce + step;
}

}  // namespace ht::plan
