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
  const auto s = static_cast<size_t>(src), d = static_cast<size_t>(dst);
  const double bw = c.links.bandwidth(s, d);
  return c.links.latency(s, d) + (bw > 0 ? bytes / bw : 0) +
         wake_seconds(c.ranks[static_cast<size_t>(dst)]);
}

// Stage s's all-reduce under the layout's reduce_parts, or its optimiser shards.
AllreduceRounds stage_reduce_rounds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs,
                                    const ClusterModel& cluster, size_t s, const LinkTiers* tiers) {
  std::vector<int> group;
  for (const auto& replica : layout.replicas) group.push_back(replica[s]);
  const auto [begin, end] = plan.stage_ranges[s];
  const double params = stage_footprint(costs, begin, end).params;
  return weighted_allreduce_rounds(cluster, group, stage_reduce_parts(plan, layout, s), params * kGradBytesPerParam,
                                   tiers);
}

double stage_reduce_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs,
                            const ClusterModel& cluster, size_t s, const LinkTiers* tiers) {
  std::vector<int> group;
  for (const auto& replica : layout.replicas) group.push_back(replica[s]);
  const auto [begin, end] = plan.stage_ranges[s];
  const double params = stage_footprint(costs, begin, end).params;
  return weighted_allreduce_seconds(cluster, group, stage_reduce_parts(plan, layout, s), params * kGradBytesPerParam,
                                    tiers);
}

// One round's link time (latency and the slowest member's transfer), the owners' longest
// wake and every member's: the parts of weighted_allreduce_seconds.
struct AllreduceTerms {
  double round = 0, owner_wake = 0, any_wake = 0;
};
AllreduceTerms allreduce_terms(const ClusterModel& cluster, const std::vector<int>& group,
                               const std::vector<double>& parts, double bytes, const LinkTiers* tiers);

}  // namespace

LinkTiers link_tiers(const ClusterModel& cluster) {
  std::vector<int> all(cluster.ranks.size());
  std::iota(all.begin(), all.end(), 0);
  return link_tiers(cluster, all);
}

LinkTiers link_tiers(const ClusterModel& cluster, const std::vector<int>& ranks) {
  const size_t m = ranks.size();
  HT_CHECK(cluster.links.size() == cluster.ranks.size(), "link_tiers: ", cluster.ranks.size(),
           " ranks but links of ", cluster.links.size(), "; expected the links of every rank");
  LinkTiers t;
  t.tier = cluster.links.tiers(ranks);
  if (t.tier.size() != m) {  // not symmetric: a tier per rank
    t.tier.resize(m);
    std::iota(t.tier.begin(), t.tier.end(), 0);
  }
  for (size_t p = 0; p < m; ++p) {
    const auto k = static_cast<size_t>(t.tier[p]);
    if (k == t.first.size()) {
      t.first.push_back(ranks[p]);
      t.second.push_back(-1);
    } else if (t.second[k] < 0) {
      t.second[k] = ranks[p];
    }
  }
  return t;
}

namespace {

// Whether ranks a and b are alike as devices, in their DeviceModel and profile rows:
// device_classes of the two alone, where their links tell nothing.
bool alike_devices(const ClusterModel& c, int a, int b) {
  ClusterModel two;
  two.ranks = {c.ranks[static_cast<size_t>(a)], c.ranks[static_cast<size_t>(b)]};
  two.links = Links::uniform(2, 1, 1);
  auto rows = [&](const std::vector<std::vector<double>>& t) {  // an absent row as an empty one
    auto row = [&](int r) {
      return static_cast<size_t>(r) < t.size() ? t[static_cast<size_t>(r)] : std::vector<double>{};
    };
    return std::vector<std::vector<double>>{row(a), row(b)};
  };
  two.block_seconds = rows(c.block_seconds);
  two.block_step_seconds = rows(c.block_step_seconds);
  two.block_call_seconds = rows(c.block_call_seconds);
  return device_classes(two).size() == 1;
}

}  // namespace

std::vector<int> cost_classes(const ClusterModel& cluster, const BlockCosts& costs, const LinkTiers& tiers) {
  const size_t n = cluster.ranks.size();
  HT_CHECK(tiers.tier.size() == n && costs.seconds_per_sample.size() == n, "cost_classes: ", n,
           " ranks, link tiers of ", tiers.tier.size(), " and block costs of ", costs.seconds_per_sample.size(),
           "; expected one each per rank");
  auto same_costs = [&](size_t a, size_t b) {
    return costs.seconds_per_sample[a] == costs.seconds_per_sample[b] && costs.call_seconds[a] == costs.call_seconds[b] &&
           costs.step_seconds[a] == costs.step_seconds[b] &&
           comm_overhead_seconds(costs, a) == comm_overhead_seconds(costs, b);
  };
  std::vector<int> out(n, -1), first;  // first: [class] its lowest rank
  for (size_t r = 0; r < n; ++r) {
    for (size_t k = 0; k < first.size(); ++k) {
      const auto f = static_cast<size_t>(first[k]);
      if (tiers.tier[f] == tiers.tier[r] && same_costs(f, r) && alike_devices(cluster, first[k], static_cast<int>(r))) {
        out[r] = static_cast<int>(k);
        break;
      }
    }
    if (out[r] < 0) {
      out[r] = static_cast<int>(first.size());
      first.push_back(static_cast<int>(r));
    }
  }
  return out;
}

double wake_seconds(const DeviceModel& d) {
  if (d.cpu_quota <= 0 || d.cpu_quota >= 1) return 0;
  return (1 - d.cpu_quota) * (1 - d.cpu_quota) * d.cpu_quota_period_s / 2;
}

double weighted_allreduce_seconds(const ClusterModel& cluster, const std::vector<int>& group,
                                  const std::vector<double>& parts, double bytes, const LinkTiers* tiers) {
  const AllreduceTerms t = allreduce_terms(cluster, group, parts, bytes, tiers);
  return 2 * t.round + t.owner_wake + t.any_wake;
}

AllreduceRounds weighted_allreduce_rounds(const ClusterModel& cluster, const std::vector<int>& group,
                                          const std::vector<double>& parts, double bytes, const LinkTiers* tiers) {
  const AllreduceTerms t = allreduce_terms(cluster, group, parts, bytes, tiers);
  return {t.round + t.owner_wake, t.round + t.any_wake};
}

namespace {

// Member i exchanges with every other member when it owns a part, else with the owners
// only (two non-owners never talk); it moves max(1 - f_i, (n - 1) f_i) x bytes over the
// slowest of those links, and the round takes the worst latency among them. Members of
// one tier with the same ownership see the same links, so the slowest link and worst
// latency are found per (tier, owner or not) from the members' counts per tier, and
// only the bytes moved are per member.
AllreduceTerms allreduce_terms(const ClusterModel& cluster, const std::vector<int>& group,
                               const std::vector<double>& parts, double bytes, const LinkTiers* tiers) {
  const size_t n = group.size();
  if (n <= 1) return {};
  HT_CHECK(!tiers || tiers->tier.size() == cluster.ranks.size(), "weighted all-reduce: link tiers of ",
           tiers ? tiers->tier.size() : 0, " ranks for a cluster of ", cluster.ranks.size(),
           "; expected the tiers of this cluster");
  LinkTiers own;
  if (!tiers) own = link_tiers(cluster, group);
  const LinkTiers& t = tiers ? *tiers : own;
  std::vector<int> local(t.first.size(), -1);  // [tier] its index among the group's tiers
  std::vector<int> ids;                        // [group tier] the tier
  std::vector<size_t> members, owners;         // [group tier]
  std::vector<size_t> tier_of(n);              // [member] its group tier
  double owner_wake = 0, any_wake = 0;
  for (size_t i = 0; i < n; ++i) {
    const int id = t.tier[tiers ? static_cast<size_t>(group[i]) : i];
    int& u = local[static_cast<size_t>(id)];
    if (u < 0) {
      u = static_cast<int>(ids.size());
      ids.push_back(id);
      members.push_back(0);
      owners.push_back(0);
    }
    tier_of[i] = static_cast<size_t>(u);
    ++members[tier_of[i]];
    const double wake = wake_seconds(cluster.ranks[static_cast<size_t>(group[i])]);
    any_wake = std::max(any_wake, wake);
    if (parts[i] > 0) {
      ++owners[tier_of[i]];
      owner_wake = std::max(owner_wake, wake);
    }
  }
  const size_t k = ids.size();
  std::vector<char> seen(2 * k, 0);  // [2 u + owner]
  for (size_t i = 0; i < n; ++i) seen[2 * tier_of[i] + (parts[i] > 0 ? 1 : 0)] = 1;
  std::vector<double> slowest_bw(2 * k, 0);
  double latency = 0;
  for (size_t u = 0; u < k; ++u)
    for (size_t owner = 0; owner < 2; ++owner) {
      if (!seen[2 * u + owner]) continue;
      double& slowest = slowest_bw[2 * u + owner];
      for (size_t v = 0; v < k; ++v) {
        const size_t partners = (owner ? members[v] : owners[v]) - (owner && v == u ? 1 : 0);
        if (partners == 0) continue;
        // Constant over the two tiers (within one: between two of its ranks).
        const auto a = static_cast<size_t>(t.first[static_cast<size_t>(ids[u])]);
        const auto b = static_cast<size_t>(v != u ? t.first[static_cast<size_t>(ids[v])]
                                                  : t.second[static_cast<size_t>(ids[u])]);
        latency = std::max(latency, cluster.links.latency(a, b));
        const double bw = cluster.links.bandwidth(a, b);
        if (bw > 0 && (slowest == 0 || bw < slowest)) slowest = bw;
      }
    }
  double round = 0;
  for (size_t i = 0; i < n; ++i) {
    const double slowest = slowest_bw[2 * tier_of[i] + (parts[i] > 0 ? 1 : 0)];
    const double moved = std::max(1 - parts[i], static_cast<double>(n - 1) * parts[i]) * bytes;
    if (slowest > 0) round = std::max(round, moved / slowest);
  }
  return {latency + round, owner_wake, any_wake};
}

// `passes` reads and writes of stage s's gradient bytes at replica k's memory bandwidth.
double gradient_passes_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs, size_t s,
                               size_t k, double passes) {
  const auto [begin, end] = plan.stage_ranges[s];
  const double bytes = stage_footprint(costs, begin, end).params * kGradBytesPerParam;
  const double bw = plan.ranks[static_cast<size_t>(layout.replicas[k][s])].device.copy_bandwidth();
  return bw > 0 ? passes * bytes / bw : 0.0;
}

size_t deadline_leader(const PipelineLayout& layout) {
  return layout.reduce_owner >= 0 ? static_cast<size_t>(layout.reduce_owner) : 0;
}

}  // namespace

double deadline_member_copy_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs, size_t s,
                                    size_t k) {
  if (layout.replicas.size() < 2 || k == deadline_leader(layout)) return 0;
  return gradient_passes_seconds(plan, layout, costs, s, k, 2 * 2);
}

double deadline_copy_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs, size_t s) {
  const size_t n = layout.replicas.size();
  if (n < 2) return 0;
  double member = 0;
  for (size_t k = 0; k < n; ++k) member = std::max(member, deadline_member_copy_seconds(plan, layout, costs, s, k));
  return member +
         gradient_passes_seconds(plan, layout, costs, s, deadline_leader(layout), 5 + 3 * static_cast<double>(n));
}

ReduceChoice cheapest_reduce_owner(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                                   const LinkTiers* tiers) {
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
    out.by_share_seconds += stage_reduce_seconds(plan, by_share, costs, cluster, s, tiers);
    out.hub_seconds += stage_reduce_seconds(plan, hub, costs, cluster, s, tiers);
  }
  if (!fits) out.hub_seconds = 0;
  else if (out.hub_seconds < out.by_share_seconds) out.owner = hub.reduce_owner;
  return out;
}

PlanCostTable plan_cost_table(const Plan& plan, const BlockCosts& costs,
                              const ClusterModel& cluster, const LinkTiers* tiers) {
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
  t.workspace_bytes.assign(n, 0);
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
    t.workspace_bytes[r] = mb * f.workspace_bytes;
  }
  const size_t stages = plan.stage_ranges.size();
  t.reduce_seconds.assign(stages, 0);
  t.gather_seconds.assign(stages, 0);
  for (size_t s = 0; s < stages; ++s) {
    // A sharded stage's round 2 carries the updated weights: GatherWeights, after the step.
    if (optimizer_shards(plan, s).empty()) {
      t.reduce_seconds[s] = stage_reduce_seconds(plan, plan.layout, costs, cluster, s, tiers);
      if (plan.sync_policy == SyncPolicy::deadline) t.reduce_seconds[s] += deadline_copy_seconds(plan, plan.layout, costs, s);
    } else {
      std::tie(t.reduce_seconds[s], t.gather_seconds[s]) =
          stage_reduce_rounds(plan, plan.layout, costs, cluster, s, tiers);
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
  m.message_seconds = [links = &cluster](int src, int dst, int64_t bytes) {
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
  m.workspace_bytes = [table](int rank, int) {
    return static_cast<int64_t>(table->workspace_bytes[static_cast<size_t>(rank)]);
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

// A rank's link cost is the median over the other ranks of an exchange of kLinkProbeBytes
// with each (latency plus transfer): a rank behind a slow link has it to most ranks, the
// others to it alone.
namespace {
constexpr double kLinkProbeBytes = 4e6;
constexpr double kSlowLinkFactor = 2.0;
}  // namespace

std::vector<int> link_last_order(const ClusterModel& cluster, const std::vector<int>& order, size_t* kept) {
  const size_t n = cluster.links.size();
  if (kept) *kept = order.size();
  if (n != cluster.ranks.size() || n < 3) return order;
  // Links are per site: over the sites that hold ranks, each with its count, so the cost
  // is O(ranks + sites^2 log sites), not O(ranks^2), at thousands of ranks.
  const std::vector<size_t>& site = cluster.links.sites();
  std::vector<int> first(cluster.links.site_count(), -1), second(cluster.links.site_count(), -1);
  std::vector<size_t> count(cluster.links.site_count(), 0);
  for (size_t r = 0; r < n; ++r) {
    ++count[site[r]];
    if (first[site[r]] < 0) first[site[r]] = static_cast<int>(r);
    else if (second[site[r]] < 0) second[site[r]] = static_cast<int>(r);
  }
  auto pair_cost = [&](size_t a, size_t b) {
    const double bw = std::min(cluster.links.bandwidth(a, b), cluster.links.bandwidth(b, a));
    const double lat = std::max(cluster.links.latency(a, b), cluster.links.latency(b, a));
    return lat + (bw > 0 ? kLinkProbeBytes / bw : 0);
  };
  std::vector<double> site_cost(first.size(), 0);
  for (size_t s = 0; s < first.size(); ++s) {
    if (first[s] < 0) continue;
    const auto a = static_cast<size_t>(first[s]);
    std::vector<std::pair<double, size_t>> peers;  // (cost, ranks at it)
    for (size_t t = 0; t < first.size(); ++t) {
      const int b = t == s ? second[s] : first[t];  // the site's own link: to its second rank
      if (b >= 0) peers.emplace_back(pair_cost(a, static_cast<size_t>(b)), t == s ? count[t] - 1 : count[t]);
    }
    std::sort(peers.begin(), peers.end());
    size_t seen = 0;
    for (const auto& [c, k] : peers)
      if ((seen += k) * 2 >= n - 1) {
        site_cost[s] = c;
        break;
      }
  }
  double cheapest = site_cost[site[0]];
  for (size_t r = 1; r < n; ++r) cheapest = std::min(cheapest, site_cost[site[r]]);
  std::vector<int> out, slow;
  for (int r : order) (site_cost[site[static_cast<size_t>(r)]] <= kSlowLinkFactor * cheapest ? out : slow).push_back(r);
  std::stable_sort(slow.begin(), slow.end(), [&](int a, int b) {
    return site_cost[site[static_cast<size_t>(a)]] < site_cost[site[static_cast<size_t>(b)]];
  });
  if (kept) *kept = out.size();
  out.insert(out.end(), slow.begin(), slow.end());
  return out;
}

}  // namespace ht::plan
