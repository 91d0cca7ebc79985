#include "plan/local_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "config/config.h"
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
  out.links = cluster.links.of(ranks);
  for (int a : ranks) {
    const auto i = static_cast<size_t>(a);
    out.ranks.push_back(cluster.ranks[i]);
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

int64_t group_round_offset(const Plan& plan, int group) {
  int64_t s = 0;
  for (int g = 0; g < group; ++g) s += plan.local->round_samples[static_cast<size_t>(g)];
  return s;
}

int64_t inner_step_samples(const Plan& plan, int group, int k) {
  const auto g = static_cast<size_t>(group);
  const int64_t n = plan.local->round_samples[g], h = plan.local->group_steps[g];
  HT_CHECK(k >= 0 && k < h, "local plan: inner step ", k, " of group ", group, ", which takes ", h, " a round");
  return n / h + (k < n % h ? 1 : 0);
}

std::vector<int64_t> step_shares(const Plan& plan, int group, int64_t count) {
  const std::vector<int>& replicas = plan.local->groups[static_cast<size_t>(group)];
  const int64_t nominal = group_samples(plan, group);
  std::vector<int64_t> out;
  int64_t cum = 0, given = 0;
  for (int r : replicas) {
    cum += plan.layout.samples[static_cast<size_t>(r)];
    // Integer arithmetic (count x cum fits easily: both are sample counts).
    const int64_t upto = count * cum / nominal;
    out.push_back(upto - given);
    given = upto;
  }
  return out;
}

int64_t fitting_micro_batch(const Plan& plan, int replica) {
  const auto r = static_cast<size_t>(replica);
  const int64_t nominal = plan.layout.samples[r], mbs = plan.layout.micro_batches[r];
  const int64_t largest = (nominal + mbs - 1) / mbs;
  int64_t most = std::numeric_limits<int64_t>::max();
  for (const RankPlan& rp : plan.ranks) {
    if (rp.replica != replica) continue;
    // Activations grow with the micro-batch (stage_memory), nothing else does.
    if (rp.micro_batch_size < 1 || rp.memory.activations <= 0 || rp.device.memory_bytes <= 0) return largest;
    const double per_sample = rp.memory.activations / static_cast<double>(rp.micro_batch_size);
    // A CPU rank computing in its host's memory keeps the rest of its host use there too
    // (the outer state, 4.5 GiB of a laptop's 15.7 GiB for GPT-2 350M), as the groups'
    // micro-batches were fitted (local_groups.cpp): without it a laptop's inner steps were
    // sized at 6 samples a micro-batch where 4 fit.
    double room = rp.device.memory_bytes - rp.memory.total();
    if (rp.device.device_in_host) room -= rp.host.total() - rp.host.device;
    const auto extra = room > 0 ? static_cast<int64_t>(std::min(room / per_sample, 1e15)) : 0;
    most = std::min(most, rp.micro_batch_size + extra);
  }
  return most == std::numeric_limits<int64_t>::max() ? largest : std::max(largest, most);
}

void size_group_step(Plan& sub, const Plan& plan, int group, int64_t count) {
  const std::vector<int>& replicas = plan.local->groups[static_cast<size_t>(group)];
  HT_CHECK(count >= static_cast<int64_t>(replicas.size()), "local plan: an inner step of ", count,
           " samples for group ", group, "'s ", replicas.size(), " replicas; expected at least one sample each");
  HT_CHECK(sub.layout.samples.size() == replicas.size(), "size_group_step: a sub-plan of ",
           sub.layout.samples.size(), " replicas for group ", group, " of ", replicas.size());
  const std::vector<int64_t> shares = step_shares(plan, group, count);
  for (size_t i = 0; i < replicas.size(); ++i) {
    const auto r = static_cast<size_t>(replicas[i]);
    const int64_t largest = fitting_micro_batch(plan, static_cast<int>(r));
    const int64_t want = std::max<int64_t>(1, (shares[i] + largest - 1) / largest);
    sub.layout.samples[i] = shares[i];
    sub.layout.micro_batches[i] = static_cast<int>(std::max<int64_t>(1, std::min(shares[i], want)));
  }
  sub.global_batch = count;
  sync_rank_shares(sub);
}

std::vector<LocalBatch> local_batches(const Plan& plan, int group, int64_t step) {
  const int64_t h = plan.local->inner_steps, hg = plan.local->group_steps[static_cast<size_t>(group)];
  const int64_t round = step / h, slot = step % h;
  auto first_in = [&](int64_t s) { return (s * hg + h - 1) / h; };  // ceil(s H_g / H)
  std::vector<LocalBatch> out;
  int64_t first = round * h * plan.global_batch + group_round_offset(plan, group);
  const int64_t begin = first_in(slot), end = first_in(slot + 1);
  for (int64_t k = 0; k < end; ++k) {
    const int64_t count = inner_step_samples(plan, group, static_cast<int>(k));
    if (k >= begin) out.push_back({first, count});
    first += count;
  }
  return out;
}

int64_t batches_in_round(const Plan& plan, int group, int64_t job_steps) {
  const int64_t h = plan.local->inner_steps, hg = plan.local->group_steps[static_cast<size_t>(group)];
  HT_CHECK(job_steps >= 0 && job_steps <= h, "local plan: ", job_steps, " job steps into a round of ", h,
           "; expected 0..", h);
  return (job_steps * hg + h - 1) / h;
}

int64_t samples_in_round(const Plan& plan, int rank, int64_t job_steps) {
  const int g = group_of_rank(plan, rank);
  if (g < 0) return 0;
  const std::vector<int>& replicas = plan.local->groups[static_cast<size_t>(g)];
  const int replica = plan.ranks[static_cast<size_t>(rank)].replica;
  const auto i = static_cast<size_t>(std::find(replicas.begin(), replicas.end(), replica) - replicas.begin());
  // The group's steps have two sizes (inner_step_samples): the first n_g mod H_g one
  // more than the rest.
  const int64_t n = plan.local->round_samples[static_cast<size_t>(g)], h = plan.local->group_steps[static_cast<size_t>(g)];
  const int64_t taken = batches_in_round(plan, g, job_steps), larger = std::min(taken, n % h);
  int64_t s = 0;
  if (larger > 0) s += larger * step_shares(plan, g, n / h + 1)[i];
  if (taken > larger) s += (taken - larger) * step_shares(plan, g, n / h)[i];
  return s;
}

std::vector<double> round_weights(const Plan& plan) {
  std::vector<double> out(plan.ranks.size(), 0.0);
  const LocalSync& l = *plan.local;
  const double total = static_cast<double>(plan.global_batch) * l.inner_steps;
  for (size_t g = 0; g < l.groups.size(); ++g) {
    const int64_t n = l.round_samples[g], h = l.group_steps[g];
    const std::vector<int64_t> small = step_shares(plan, static_cast<int>(g), n / h);
    const std::vector<int64_t> large = step_shares(plan, static_cast<int>(g), n / h + 1);
    for (size_t i = 0; i < l.groups[g].size(); ++i) {
      const int rank = plan.layout.replicas[static_cast<size_t>(l.groups[g][i])][0];
      out[static_cast<size_t>(rank)] =
          static_cast<double>((n % h) * large[i] + (h - n % h) * small[i]) / total;
    }
  }
  return out;
}

double round_weight(const Plan& plan, int rank) {
  return static_cast<double>(samples_in_round(plan, rank, plan.local->inner_steps)) /
         (static_cast<double>(plan.global_batch) * plan.local->inner_steps);
}

double partial_round_weight(const Plan& plan, int rank, int64_t job_steps) {
  return segment_weight(plan, rank, 0, job_steps);
}

double segment_weight(const Plan& plan, int rank, int64_t from, int64_t to) {
  HT_CHECK(from >= 0 && from <= to && to <= plan.local->inner_steps, "local plan: job steps ", from, " to ", to,
           " of a round of ", plan.local->inner_steps, "; expected 0 <= from <= to <= H");
  if (group_of_rank(plan, rank) < 0) return 0;
  auto taken = [&](int r) { return samples_in_round(plan, r, to) - samples_in_round(plan, r, from); };
  int64_t all = 0;
  for (const RankPlan& rp : plan.ranks) all += taken(rp.rank);
  if (all == 0) return 0;
  return static_cast<double>(taken(rank)) / static_cast<double>(all);
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

RoundSplit split_round(int round_steps, int64_t global_batch, const std::vector<GroupCost>& groups) {
  const size_t n = groups.size();
  std::vector<double> step(n), fixed(n);
  for (size_t g = 0; g < n; ++g) {
    step[g] = groups[g].step_fixed + groups[g].per_sample * static_cast<double>(global_batch);
    fixed[g] = groups[g].round_fixed;
  }
  RoundSplit out;
  out.steps = steps_by_speed(round_steps, step, fixed);
  const int64_t total = static_cast<int64_t>(round_steps) * global_batch;
  // Group g's round: F_g + v_g n_g, F_g its fixed costs (H_g step_fixed + round_fixed).
  // Equal rounds R with the n_g summing to the total: R = (total + sum F_g / v_g) / sum
  // 1 / v_g, n_g = (R - F_g) / v_g; a group below its least is held there and the rest
  // solved again.
  std::vector<double> f(n), v(n), want(n);
  std::vector<int64_t> least(n);
  for (size_t g = 0; g < n; ++g) {
    f[g] = out.steps[g] * groups[g].step_fixed + groups[g].round_fixed;
    v[g] = std::max(groups[g].per_sample, 1e-15);  // a group with no cost per sample takes what it is given
    least[g] = out.steps[g] * std::max<int64_t>(1, groups[g].least_step);
  }
  int64_t least_sum = 0;
  for (int64_t l : least) least_sum += l;
  HT_CHECK(least_sum <= total, "local plan: a round of ", total, " samples for groups that need at least ",
           least_sum, "; expected a larger global batch");
  std::vector<bool> held(n, false);
  for (bool again = true; again;) {
    again = false;
    double rest = static_cast<double>(total), inv = 0, fv = 0;
    for (size_t g = 0; g < n; ++g)
      if (held[g]) rest -= static_cast<double>(least[g]);
      else {
        inv += 1 / v[g];
        fv += f[g] / v[g];
      }
    const double r = (rest + fv) / inv;
    for (size_t g = 0; g < n; ++g) {
      if (held[g]) continue;
      want[g] = (r - f[g]) / v[g];
      if (want[g] < static_cast<double>(least[g])) {
        held[g] = again = true;
        want[g] = static_cast<double>(least[g]);
      }
    }
  }
  // Whole samples: each group's floor, the remainder one each to the largest fractions.
  out.samples.assign(n, 0);
  int64_t given = 0;
  std::vector<std::pair<double, size_t>> frac;
  for (size_t g = 0; g < n; ++g) {
    out.samples[g] = std::max(least[g], static_cast<int64_t>(std::floor(want[g])));
    given += out.samples[g];
    frac.push_back({want[g] - std::floor(want[g]), g});
  }
  std::stable_sort(frac.begin(), frac.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < total; k = (k + 1) % n, ++given) ++out.samples[frac[k].second];
  while (given > total) {  // floors held up at their least: take back from the one most above its own
    size_t big = 0;
    for (size_t g = 1; g < n; ++g)
      if (out.samples[g] - least[g] > out.samples[big] - least[big]) big = g;
    --out.samples[big];
    --given;
  }
  for (size_t g = 0; g < n; ++g) out.seconds = std::max(out.seconds, f[g] + v[g] * static_cast<double>(out.samples[g]));
  return out;
}

int choose_round_steps(int64_t global_batch, const std::vector<GroupCost>& groups, int least, int64_t align) {
  HT_CHECK(least >= static_cast<int>(groups.size()), "local plan: at least ", least, " steps a round for ",
           groups.size(), " groups; expected one per group at least");
  const int most = std::max(least, kMaxRoundSteps);
  std::vector<double> cost;
  for (int c = least; c <= most; ++c) cost.push_back(split_round(c, global_batch, groups).seconds / c);
  const double best = *std::min_element(cost.begin(), cost.end());
  const auto near = [&](int c) { return cost[static_cast<size_t>(c - least)] <= (1 + kNearBestRound) * best; };
  if (align > 0)
    for (int c = least; c <= most; ++c)
      if (align % c == 0 && near(c)) return c;
  int c = least;
  while (!near(c)) ++c;
  return c;
}

RoundSeconds cpu_round_seconds(double cpu_s, double outer_cpu_s, double wall_s, double waited_s) {
  const double busy = wall_s - waited_s;
  if (!(cpu_s > 0) || !(busy > 0)) return {};
  const double outer = std::clamp(outer_cpu_s, 0.0, cpu_s) / cpu_s;
  return {busy * (1 - outer), busy * outer};
}

std::vector<double> window_medians(const std::vector<std::vector<double>>& rounds) {
  HT_CHECK(!rounds.empty(), "window_medians: no rounds");
  const size_t n = rounds.front().size();
  std::vector<double> out(n);
  for (size_t g = 0; g < n; ++g) {
    std::vector<double> v;
    for (const std::vector<double>& r : rounds) {
      HT_CHECK(r.size() == n, "window_medians: a round of ", r.size(), " groups beside one of ", n);
      v.push_back(r[g]);
    }
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    out[g] = v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
  }
  return out;
}

std::optional<RoundSplit> resplit_from_measured(const Plan& plan, const std::vector<double>& inner_seconds,
                                                const std::vector<double>& pass_seconds) {
  const LocalSync& l = *plan.local;
  const size_t n = l.groups.size();
  HT_CHECK(inner_seconds.size() == n && pass_seconds.size() == n, "local re-split: ", inner_seconds.size(), " and ",
           pass_seconds.size(), " measured groups for ", n, "; expected one of each per group");
  std::vector<GroupCost> measured(n);
  double latest = 0;
  for (size_t g = 0; g < n; ++g) {
    if (!(inner_seconds[g] > 0) || !(pass_seconds[g] >= 0) || !std::isfinite(inner_seconds[g] + pass_seconds[g]))
      return std::nullopt;  // a group that took no step, or a clock gone wrong: nothing to go by
    measured[g].per_sample = inner_seconds[g] / static_cast<double>(l.round_samples[g]);
    measured[g].round_fixed = pass_seconds[g];
    measured[g].least_step = static_cast<int64_t>(l.groups[g].size());
    latest = std::max(latest, inner_seconds[g] + pass_seconds[g]);
  }
  RoundSplit split = split_round(l.inner_steps, plan.global_batch, measured);
  if (split.seconds > (1 - kResplitGain) * latest) return std::nullopt;
  return split;
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
  HT_CHECK(l.outer_delay >= 1 && l.outer_delay <= l.inner_steps, "local plan: outer_delay ", l.outer_delay,
           "; expected 1 to inner_steps ", l.inner_steps, " (the job steps into a round where the last round's outer step lands)");
  HT_CHECK(l.round_samples.size() == l.groups.size(), "local plan: round_samples has ", l.round_samples.size(),
           " entries for ", l.groups.size(), " groups; expected one per group");
  // A plan file's counts may be anything: the round's total and the groups' sum are
  // checked for overflow before they are compared.
  int64_t total = 0;
  HT_CHECK(!__builtin_mul_overflow(static_cast<int64_t>(l.inner_steps), plan.global_batch, &total),
           "local plan: inner_steps ", l.inner_steps, " x global batch ", plan.global_batch,
           " samples a round passes 2^63; expected a round a job can take");
  int64_t taken = 0;
  for (size_t g = 0; g < l.groups.size(); ++g) {
    const int64_t least = static_cast<int64_t>(l.group_steps[g]) * static_cast<int64_t>(l.groups[g].size());
    HT_CHECK(l.round_samples[g] >= least, "local plan: group ", g, " takes ", l.round_samples[g],
             " samples a round in ", l.group_steps[g], " inner steps over ", l.groups[g].size(),
             " replicas; expected at least ", least, " (one sample per replica and step)");
    HT_CHECK(l.round_samples[g] <= total && !__builtin_add_overflow(taken, l.round_samples[g], &taken),
             "local plan: group ", g, " takes ", l.round_samples[g], " samples a round; expected the groups to take ",
             total, " in all (inner_steps x global batch)");
  }
  HT_CHECK(taken == total, "local plan: the groups take ", taken,
           " samples a round; expected inner_steps x global batch = ", total);
}

Plan group_plan(const Plan& plan, int group) {
  check_local_plan(plan);
  return group_plan_unchecked(plan, group);
}

Plan group_plan_unchecked(const Plan& plan, int group) {
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
double exchange_seconds(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                        const LinkTiers* tiers = nullptr) {
  if (plan.local->groups.size() < 2) return 0;
  const std::vector<int> members = outer_members(plan);
  const std::vector<double> all = round_weights(plan);
  std::vector<double> weights;
  for (int r : members) weights.push_back(all[static_cast<size_t>(r)]);
  return weighted_allreduce_seconds(cluster, members, weights, total_params(costs) * kGradBytesPerParam, tiers);
}

// At the streaming rate: the outer step's arrays (the outer weights, their momentum, the
// deltas, the inner weights and the exchange's buffers) are more than the probe's
// gradient-sized triad holds in a cache. Charged at the triad's rate, the MLP's rounds at
// quotas 0.8/0.4/0.2/0.2 fell from 25 to 10 steps and its samples/s from 0.87-0.99 to
// 0.82 of the ranks' standalone sum (tools/bench-faults --cases local, one run, 2026-12-07).
double update_seconds(const Plan& plan, const BlockCosts& costs, int rank) {
  const double bw = plan.ranks[static_cast<size_t>(rank)].device.memory_bandwidth;
  return bw > 0 ? total_params(costs) * kOuterBytesPerParam / bw : 0;
}

// Whether each rank's own cores carry its part of the outer exchange: a CPU rank whose
// links to every other member run at host-memory speed (kHostCopyBandwidth and up),
// taken as ranks of one host, where the runtime exchanges through shared memory
// (comm/shared_allreduce.h). There is no engine apart from the cores the inner steps
// run on: the rank sums the part it owns, between its blocks. Over a slower link the
// exchange's time is the wire's, and a GPU rank's exchange runs beside its kernels.
// Per site, from one or two member ranks of it (ranks of a site share their links):
// O(members + sites^2).
std::vector<char> carries_exchange(const Plan& plan, const ClusterModel& cluster) {
  std::vector<char> out(plan.ranks.size(), 0);
  const std::vector<int> members = outer_members(plan);
  if (members.size() < 2 || cluster.links.size() != plan.ranks.size() || cluster.ranks.size() != plan.ranks.size())
    return out;
  const Links& links = cluster.links;
  const size_t sites = links.site_count();
  std::vector<int> first(sites, -1), second(sites, -1);
  for (int r : members) {
    const size_t s = links.sites()[static_cast<size_t>(r)];
    if (first[s] < 0) first[s] = r;
    else if (second[s] < 0) second[s] = r;
  }
  std::vector<double> slowest(sites, std::numeric_limits<double>::infinity());
  for (size_t s = 0; s < sites; ++s) {
    if (first[s] < 0) continue;
    if (second[s] >= 0)
      slowest[s] = links.bandwidth(static_cast<size_t>(first[s]), static_cast<size_t>(second[s]));
    for (size_t t = 0; t < sites; ++t)
      if (t != s && first[t] >= 0)
        slowest[s] = std::min(slowest[s], links.bandwidth(static_cast<size_t>(first[s]), static_cast<size_t>(first[t])));
  }
  for (int r : members)
    out[static_cast<size_t>(r)] = cluster.ranks[static_cast<size_t>(r)].kind == DeviceKind::cpu &&
                                  slowest[links.sites()[static_cast<size_t>(r)]] >= kHostCopyBandwidth;
  return out;
}

// A member's own outer work a round: its pass and, where it carries the exchange, the
// sums of its part through shared memory: every member's contribution read and the sums
// written, (members + 1) x its part, taken as an even one (the parts follow the split,
// which is not known yet where the groups' costs are: a fraction of the pass either way).
// `members`: outer_members(plan)'s count.
double outer_work_seconds(const Plan& plan, const BlockCosts& costs, int rank, const std::vector<char>& carries,
                          size_t members) {
  double s = update_seconds(plan, costs, rank);
  const double bw = plan.ranks[static_cast<size_t>(rank)].device.memory_bandwidth;
  if (carries[static_cast<size_t>(rank)] && bw > 0 && members > 0) {
    const auto m = static_cast<double>(members);
    s += total_params(costs) * 4 * (m + 1) / m / bw;
  }
  return s;
}

}  // namespace

std::vector<int> outer_members(const Plan& plan) {
  HT_CHECK(plan.local, "outer_members: the plan is not local");
  std::vector<int> out;
  for (const RankPlan& rp : plan.ranks)
    if (rp.rank == 0 || group_of_rank(plan, rp.rank) >= 0) out.push_back(rp.rank);
  return out;
}

std::vector<Schedule> outer_sync_schedules(const Plan& plan) {
  HT_CHECK(plan.local, "outer_sync_schedules: the plan is not local");
  std::vector<Schedule> out(plan.ranks.size());
  for (int r : outer_members(plan)) {
    out[static_cast<size_t>(r)].push_back(Instruction{Op::outer_sync_finish});
    out[static_cast<size_t>(r)].push_back(Instruction{Op::outer_sync_start});
  }
  return out;
}

CostModel outer_sync_cost_model(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                                double inner_step_seconds, const LinkTiers* tiers) {
  const double exchange = exchange_seconds(plan, costs, cluster, tiers);
  const double hidden = plan.local->outer_delay * inner_step_seconds;
  CostModel m;
  std::vector<double> update;
  const std::vector<char> carries = carries_exchange(plan, cluster);
  const size_t members = outer_members(plan).size();
  for (const RankPlan& rp : plan.ranks) update.push_back(outer_work_seconds(plan, costs, rp.rank, carries, members));
  m.compute_seconds = [update](int rank, const Instruction& in) {
    HT_CHECK(in.op == Op::outer_sync_start, "outer sync cost model: ", op_name(in.op), " is not compute");
    return update[static_cast<size_t>(rank)];
  };
  m.reduce_seconds = [exposed = std::max(0.0, exchange - hidden)](int, int) { return exposed; };
  return m;
}

namespace {

// Each group's costs for the split (predicted at one global batch and at half of it: a
// fixed part, the optimiser step and the per-call costs, and a part per sample), and
// its sub-plan predicted at one global batch (`subs`, for the busy fractions).
std::vector<GroupCost> costs_and_subs(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                                      std::vector<std::vector<double>>* busy, const LinkTiers* tiers) {
  const LocalSync& l = *plan.local;
  const int64_t batch = plan.global_batch;
  // Groups of the same classes of ranks, with the same nominal shares, cost the same:
  // each such kind is predicted once (4,096 one-rank groups are a few kinds).
  const LinkTiers own = tiers ? LinkTiers{} : link_tiers(cluster);
  const std::vector<int> kind_of_rank = cost_classes(cluster, costs, tiers ? *tiers : own);
  const std::vector<char> carries = carries_exchange(plan, cluster);
  const size_t members = outer_members(plan).size();
  std::map<std::vector<int64_t>, size_t> seen;  // a group's kind -> the first group of it
  std::vector<GroupCost> out(l.groups.size());
  if (busy) busy->assign(l.groups.size(), {});
  for (size_t g = 0; g < l.groups.size(); ++g) {
    const std::vector<int> ranks = group_ranks(plan, static_cast<int>(g));
    std::vector<int64_t> kind;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const auto r = static_cast<size_t>(l.groups[g][i]);
      kind.push_back(kind_of_rank[static_cast<size_t>(ranks[i])]);
      kind.push_back(plan.layout.samples[r]);
      kind.push_back(plan.layout.micro_batches[r]);
      if (!plan.layout.recompute.empty())
        for (bool b : plan.layout.recompute[r]) kind.push_back(b ? 1 : 0);
    }
    if (const auto it = seen.find(kind); it != seen.end()) {
      out[g] = out[it->second];
      if (busy) (*busy)[g] = (*busy)[it->second];
      continue;
    }
    seen.emplace(std::move(kind), g);
    const BlockCosts sub_costs = costs_of(costs, ranks);
    const ClusterModel sub_cluster = cluster_of(cluster, ranks);
    Plan sub = group_plan_unchecked(plan, static_cast<int>(g));
    predict_plan(sub, sub_costs, sub_cluster);
    const double step = sub.predicted.step_seconds;
    GroupCost& c = out[g];
    c.least_step = static_cast<int64_t>(l.groups[g].size());
    const int64_t half = std::max(c.least_step, batch / 2);
    if (half < batch) {
      Plan small = sub;
      size_group_step(small, plan, static_cast<int>(g), half);
      predict_plan(small, sub_costs, sub_cluster);
      c.per_sample = std::max(0.0, (step - small.predicted.step_seconds) / static_cast<double>(batch - half));
    } else {
      c.per_sample = step / static_cast<double>(batch);
    }
    c.step_fixed = std::max(0.0, step - c.per_sample * static_cast<double>(batch));
    // Its round also holds its own outer work (OuterSyncStart on its slowest rank).
    for (int r : ranks) c.round_fixed = std::max(c.round_fixed, outer_work_seconds(plan, costs, r, carries, members));
    if (busy)
      for (const RankPlan& rp : sub.ranks) (*busy)[g].push_back(rp.busy_fraction);
  }
  return out;
}

// How late a member may take its part in the exchange after the others expect it: it
// posts its delta and sums its part between the blocks of its inner steps (an
// executor poll at every block's forward and backward edge), so up to the time between
// two polls, and a rank under a CPU quota may be off its core for the rest of the
// period. Where the outer step landed sooner, the groups waited for it every round: on
// the MLP at 0.8/0.4/0.2/0.2 (H 17) the job ran at 0.88 of the standalone sum with the
// step 2 job steps into the round against 0.915 at its end (docs/architecture.md).
double exchange_lag(const Plan& plan, const std::vector<GroupCost>& cost, const ClusterModel& cluster) {
  const LocalSync& l = *plan.local;
  double lag = 0;
  for (int r : outer_members(plan)) {
    const int g = group_of_rank(plan, r);
    double between = 0;
    if (g >= 0) {
      const auto k = static_cast<size_t>(g);
      const double step = cost[k].step_fixed + cost[k].per_sample * static_cast<double>(l.round_samples[k]) /
                                                   static_cast<double>(l.group_steps[k]);
      between = step / (2.0 * std::max(1, plan.blocks));
    }
    if (static_cast<size_t>(r) < cluster.ranks.size()) {
      const DeviceModel& d = cluster.ranks[static_cast<size_t>(r)];
      if (d.cpu_quota > 0 && d.cpu_quota < 1) between += d.cpu_quota_period_s * (1 - d.cpu_quota);
    }
    lag = std::max(lag, between);
  }
  return lag;
}

// A job step: a round's inner steps per global batch, the latest group's round less the
// outer pass, which the outer synchronisation's own lists add (simulated).
double inner_job_step(const Plan& plan, const std::vector<GroupCost>& cost) {
  const LocalSync& l = *plan.local;
  double round = 0, pass = 0;
  for (size_t g = 0; g < cost.size(); ++g) {
    const double steps = l.group_steps[g] * cost[g].step_fixed + cost[g].per_sample * static_cast<double>(l.round_samples[g]);
    round = std::max(round, steps + cost[g].round_fixed);
    pass = std::max(pass, cost[g].round_fixed);
  }
  return std::max(0.0, round - pass) / l.inner_steps;
}

}  // namespace

std::vector<GroupCost> group_costs(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster) {
  check_local_plan(plan);
  return costs_and_subs(plan, costs, cluster, nullptr, nullptr);
}

void predict_local(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster, double sync_step_seconds,
                   int64_t local_steps, int64_t flush_every) {
  LocalSync& l = *plan.local;
  const size_t n = l.groups.size();
  const int64_t batch = plan.global_batch;
  // Until split below, the groups take whole global batches (what group_plan checks and
  // the exchange's weights start from).
  if (l.round_samples.size() != n) {
    l.round_samples.clear();
    for (int h : l.group_steps) l.round_samples.push_back(h * batch);
  }
  check_local_plan(plan);
  const LinkTiers tiers = link_tiers(cluster);
  std::vector<std::vector<double>> busy;  // each group's ranks' busy fractions at one batch
  const double exchange = exchange_seconds(plan, costs, cluster, &tiers);
  const std::vector<GroupCost> cost = costs_and_subs(plan, costs, cluster, &busy, &tiers);
  std::vector<double> step(n);  // at one global batch
  for (size_t g = 0; g < n; ++g) step[g] = cost[g].step_fixed + cost[g].per_sample * static_cast<double>(batch);
  // A job step at the groups' summed speed: what a round of H global batches takes per
  // batch when the split is exact.
  double rate = 0;
  for (double t : step) rate += 1 / t;
  const double ideal = 1 / rate;
  int h = 0;
  if (local_steps > 0) {
    // A config that does not fit the plan made for it: rejected as a config is (exit 2).
    if (local_steps < static_cast<int64_t>(n))
      throw config::ConfigError("parallel.local_steps " + std::to_string(local_steps) + " is below the plan's " +
                                std::to_string(n) + " local groups; expected at least " + std::to_string(n) +
                                " (every group takes at least one inner step a round)");
    h = static_cast<int>(local_steps);
  } else {
    const int least = std::max(static_cast<int>(n), static_cast<int>(std::ceil(kHideFactor * exchange / ideal)));
    h = choose_round_steps(batch, cost, least, flush_every);
  }
  RoundSplit split = split_round(h, batch, cost);
  l.inner_steps = h;
  l.group_steps = split.steps;
  l.round_samples = split.samples;
  // The least H above took the exchange at whole batches a group, where each member owns
  // an equal part. Split by speed, a fast member owns most of it and moves most of the
  // bytes: where that exchange outlasts the round, the round is lengthened to hide it (an
  // h100 beside four rtx3060 took 636 of a 5-step round's 640 samples, and the exchange of
  // 0.86 ms set a pace of 184 us a step where 18 steps hide it).
  if (local_steps <= 0 && h < kMaxRoundSteps) {
    const double split_exchange = exchange_seconds(plan, costs, cluster, &tiers);
    const double per_step = split.seconds / h;
    if (per_step > 0 && kHideFactor * split_exchange > split.seconds) {
      const int least = std::max(h + 1, static_cast<int>(std::min<double>(
                                            kMaxRoundSteps, std::ceil(kHideFactor * split_exchange / per_step))));
      h = choose_round_steps(batch, cost, least, flush_every);
      split = split_round(h, batch, cost);
      l.inner_steps = h;
      l.group_steps = split.steps;
      l.round_samples = split.samples;
    }
  }
  // Each group's rounds without its outer pass (OuterSyncStart, simulated below).
  double round = 0;
  std::vector<double> inner_round(n);
  for (size_t g = 0; g < n; ++g) {
    inner_round[g] = split.steps[g] * cost[g].step_fixed + cost[g].per_sample * static_cast<double>(split.samples[g]);
    round = std::max(round, inner_round[g] + cost[g].round_fixed);
  }
  for (size_t g = 0; g < n; ++g) {
    const std::vector<int> ranks = group_ranks(plan, static_cast<int>(g));
    for (size_t i = 0; i < ranks.size(); ++i)
      plan.ranks[static_cast<size_t>(ranks[i])].busy_fraction =
          busy[g][i] * inner_round[g] / round;
  }
  const double inner = inner_job_step(plan, cost);
  // The exchange as the split weighs its parts (H above took it at whole batches), and
  // the outer step at the round's end (apply_outer_delay may bring it sooner).
  l.outer_exchange_seconds = exchange_seconds(plan, costs, cluster, &tiers);
  l.outer_delay = h;
  l.round_align = flush_every > 0 && flush_every % h == 0 ? flush_every : 0;
  const SimResult outer = simulate(outer_sync_schedules(plan), outer_sync_cost_model(plan, costs, cluster, inner, &tiers));
  const double job_step = inner + outer.step_seconds / h;
  plan.predicted.step_seconds = job_step;
  plan.predicted.samples_per_s = static_cast<double>(plan.global_batch) / job_step;
  plan.predicted.bubble_fraction = 0;
  set_speedup(plan);
  l.sync_step_seconds = sync_step_seconds;
  l.gain = sync_step_seconds > 0 ? sync_step_seconds / job_step : 0;
}

SimResult simulate_local_round(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster) {
  check_local_plan(plan);
  const LocalSync& l = *plan.local;
  const size_t world = plan.ranks.size();
  const CostModel outer =
      outer_sync_cost_model(plan, costs, cluster, inner_job_step(plan, group_costs(plan, costs, cluster)));
  const double exposed = outer.reduce_seconds(0, 0);
  SimResult out = SimResult::zeroed(world);
  // Each group's inner steps before and after the outer step, their spans on the
  // group's own clock (shifted onto the round's below).
  struct Part {
    std::vector<Span> spans;
    double seconds = 0;
  };
  std::vector<Part> before(l.groups.size()), after(l.groups.size());
  for (size_t g = 0; g < l.groups.size(); ++g) {
    const std::vector<int> ranks = group_ranks(plan, static_cast<int>(g));
    const BlockCosts sub_costs = costs_of(costs, ranks);
    const ClusterModel sub_cluster = cluster_of(cluster, ranks);
    Plan sub = group_plan_unchecked(plan, static_cast<int>(g));
    std::map<int64_t, SimResult> by_size;  // a group's steps take at most two sizes
    const int64_t finish_after = batches_in_round(plan, static_cast<int>(g), l.outer_delay);
    for (int k = 0; k < l.group_steps[g]; ++k) {
      const int64_t count = inner_step_samples(plan, static_cast<int>(g), k);
      auto it = by_size.find(count);
      if (it == by_size.end()) {
        size_group_step(sub, plan, static_cast<int>(g), count);
        it = by_size.emplace(count, simulate_plan(sub, sub_costs, sub_cluster)).first;
      }
      const SimResult& step = it->second;
      Part& part = k < finish_after ? before[g] : after[g];
      for (Span s : step.timeline) {
        s.rank = ranks[static_cast<size_t>(s.rank)];
        s.start_s += part.seconds;
        s.end_s += part.seconds;
        part.spans.push_back(std::move(s));
      }
      part.seconds += step.step_seconds;
      for (size_t i = 0; i < ranks.size(); ++i)
        out.peak_activation_bytes[static_cast<size_t>(ranks[i])] =
            std::max(out.peak_activation_bytes[static_cast<size_t>(ranks[i])], step.peak_activation_bytes[i]);
    }
  }
  // The round's end. A group waits for the others only at OuterSyncFinish, for the
  // round before's exchange, which needs every member's deltas: so in steady state every
  // group's round takes as long as the latest's (its inner steps, the exposed exchange,
  // its ranks' outer work), and the others wait that difference there. This is the round
  // predict_local charges.
  const std::vector<int> members = outer_members(plan);
  std::vector<double> work(world, 0), pass(l.groups.size(), 0);
  for (int r : members) work[static_cast<size_t>(r)] = outer.compute_seconds(r, Instruction{Op::outer_sync_start});
  double period = 0;
  for (size_t g = 0; g < l.groups.size(); ++g) {
    for (int r : group_ranks(plan, static_cast<int>(g))) pass[g] = std::max(pass[g], work[static_cast<size_t>(r)]);
    period = std::max(period, before[g].seconds + after[g].seconds + exposed + pass[g]);
  }
  for (int r : members) period = std::max(period, exposed + work[static_cast<size_t>(r)]);  // an idle rank 0
  const std::string finish = op_name(Op::outer_sync_finish), start = op_name(Op::outer_sync_start);
  for (int r : members) {
    const int g = group_of_rank(plan, r);
    const auto k = static_cast<size_t>(g);
    const double inner = g >= 0 ? before[k].seconds + after[k].seconds : 0;
    const double arrive = g >= 0 ? before[k].seconds : 0;
    const double wait = period - (inner + exposed + (g >= 0 ? pass[k] : work[static_cast<size_t>(r)]));
    if (wait > 0) out.timeline.push_back(Span{r, finish, "idle", arrive, arrive + wait});
    const double leave = arrive + std::max(0.0, wait) + exposed;
    out.timeline.push_back(Span{r, finish, "comm", arrive + std::max(0.0, wait), leave});
    const double end = g >= 0 ? leave + after[k].seconds : leave;
    out.timeline.push_back(Span{r, start, "compute", end, end + work[static_cast<size_t>(r)]});
  }
  for (size_t g = 0; g < l.groups.size(); ++g) {
    const double resume = period - after[g].seconds - pass[g];  // where its Finish lets it go on
    for (Span s : before[g].spans) out.timeline.push_back(std::move(s));
    for (Span s : after[g].spans) {
      s.start_s += resume;
      s.end_s += resume;
      out.timeline.push_back(std::move(s));
    }
  }
  std::vector<char> working(world, 0);
  for (const Span& s : out.timeline) {
    const auto r = static_cast<size_t>(s.rank);
    working[r] = 1;
    out.step_seconds = std::max(out.step_seconds, s.end_s);
    if (s.category == "compute") out.busy_seconds[r] += s.end_s - s.start_s;
    else if (s.category == "comm") out.comm_seconds[r] += s.end_s - s.start_s;
  }
  summarise_ranks(out, working);
  return out;
}

void apply_outer_delay(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster, int64_t requested) {
  LocalSync& l = *plan.local;
  const int h = l.inner_steps;
  if (requested <= 0 || requested >= h) {
    l.outer_delay = h;
    return;
  }
  const std::vector<GroupCost> cost = group_costs(plan, costs, cluster);
  const double inner = inner_job_step(plan, cost);
  // Sooner than the exchange and the latest member's lag in it allow, every group would
  // wait there every round.
  const double hides =
      inner > 0 ? std::ceil((kHideFactor * l.outer_exchange_seconds + exchange_lag(plan, cost, cluster)) / inner) : h;
  l.outer_delay = static_cast<int>(std::clamp(std::max(static_cast<double>(requested), hides), 1.0, static_cast<double>(h)));
}

}  // namespace ht::plan
