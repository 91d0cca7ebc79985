// parallel.sync local: which ranks form the groups and which are left idle, and
// whether auto takes local (plan/local_plan.h); predict_local (local_plan.cpp) then
// sets H, the H_g and the prediction.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/units.h"
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

// The data-parallel plan of `data` with only `ranks` (world ranks) in it, one replica
// each, taking `shares`, the other ranks idle: a group's synchronous step, priced on the
// world's cluster and tiers as they are (a group's own renumbered cluster would find its
// tiers again, and copy a probe file's dense links). Each rank keeps its replica's
// micro-batches and recomputation from `data`.
Plan group_only(const Plan& data, const BlockCosts& costs, const std::vector<int>& ranks,
                const std::vector<int64_t>& shares) {
  Plan p = data;
  p.global_batch = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  p.strategy = Strategy::data;
  p.layout = PipelineLayout{};
  p.layout.reduce_owner = -1;
  const bool recompute = !data.layout.recompute.empty();
  for (RankPlan& rp : p.ranks) {
    rp.replica = rp.stage = -1;
    rp.samples = 0;
    rp.memory = {};
    rp.busy_fraction = 0;
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankPlan& old = data.ranks[static_cast<size_t>(ranks[i])];
    const auto r = static_cast<size_t>(old.replica);
    p.layout.replicas.push_back({ranks[i]});
    p.layout.samples.push_back(shares[i]);
    p.layout.micro_batches.push_back(static_cast<int>(std::min<int64_t>(data.layout.micro_batches[r], shares[i])));
    if (recompute) p.layout.recompute.push_back(data.layout.recompute[r]);
    RankPlan& rp = p.ranks[static_cast<size_t>(ranks[i])];
    rp.replica = static_cast<int>(i);
    rp.stage = 0;
    rp.optimizer_shard = 1;
  }
  sync_rank_shares(p);
  for (const int r : ranks) {
    RankPlan& rp = p.ranks[static_cast<size_t>(r)];
    rp.memory = rank_memory(p, costs, rp);
  }
  return p;
}

std::vector<double> speeds_of(const BlockCosts& costs, const std::vector<int>& ranks) {
  std::vector<double> s;
  for (int r : ranks) s.push_back(replica_samples_per_s(costs, r));
  return s;
}

// Predicted samples/s of `ranks` as one synchronous group taking `samples` a step.
double group_throughput(const LocalPlanInput& in, const LinkTiers& tiers, const std::vector<int>& ranks,
                        int64_t samples) {
  if (samples < static_cast<int64_t>(ranks.size())) return 0;
  Plan p = group_only(in.data_plan, in.costs, ranks, shares_by_speed(samples, speeds_of(in.costs, ranks)));
  predict_plan(p, in.costs, in.cluster, {}, &tiers);
  return p.predicted.samples_per_s;
}

int64_t nominal_share(const LocalPlanInput& in, const std::vector<int>& ranks, double total_speed) {
  double s = 0;
  for (int r : ranks) s += replica_samples_per_s(in.costs, r);
  return std::max<int64_t>(static_cast<int64_t>(ranks.size()),
                           std::llround(static_cast<double>(in.data_plan.global_batch) * s / total_speed));
}


// The local plan of `groups` (world ranks; every other rank idle): each group's inner
// step one whole global batch split over its ranks by speed, micro-batches fitted,
// predicted by predict_local. `classes`: cost_classes of every rank.
LocalPlanResult plan_of_groups(const LocalPlanInput& in, const std::vector<int>& classes,
                               const std::vector<std::vector<int>>& groups) {
  LocalPlanResult out;
  const Plan& data = in.data_plan;
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
  // A group's share is the whole global batch, more than the rank's data-parallel share:
  // a rank that cannot hold it in its micro-batches gets the least count that fits (as
  // the synchronous planner's memory strategy 2), found once per class and share.
  std::map<std::pair<int, int64_t>, int> fitted;  // (class, share) -> micro-batches
  // A CPU rank computing in its host's memory keeps the outer state there too, so its
  // step fits in the rest.
  const double outer_state = outer_state_bytes(in.costs);
  const auto room = [&](const RankPlan& rp) {
    return rp.device.memory_bytes - (rp.device.device_in_host ? outer_state : 0);
  };
  for (RankPlan& rp : p.ranks) {
    // The synchronous plan's strategies were for its shares: these are recorded afresh
    // for the group's (`hetrain plan` showed "14 of at most 11" beside 24 micro-batches).
    rp.memory_strategies.clear();
    rp.memory_steps.clear();
    if (rp.replica < 0) continue;
    rp.memory = rank_memory(p, in.costs, rp);
    if (rp.recompute) {
      RankPlan without = rp;
      without.recompute = false;
      const MemoryUse all = rank_memory(p, in.costs, without);
      rp.memory_steps.push_back(over_capacity_step(all, room(rp)));
      add_strategy(rp, MemoryStrategy::recompute,
                   activations_step(MemoryStepKind::recompute, all.activations, rp.memory.activations));
    }
    if (rp.memory.total() <= room(rp)) continue;
    auto [known, fresh] = fitted.try_emplace({classes[static_cast<size_t>(rp.rank)], rp.samples}, 0);
    if (fresh) {
      RankPlan trial = rp;
      auto fits = [&](int m) {
        trial.micro_batches = m;
        trial.micro_batch_size = (trial.samples + m - 1) / m;
        return rank_memory(p, in.costs, trial).total() <= room(trial);
      };
      // lo does not fit; past kMaxMicroBatches the share does not fit at all.
      int lo = rp.micro_batches, hi = static_cast<int>(std::min<int64_t>(rp.samples, kMaxMicroBatches));
      if (fits(hi)) {
        while (hi - lo > 1) {
          const int mid = lo + (hi - lo) / 2;
          (fits(mid) ? hi : lo) = mid;
        }
        known->second = hi;
      }
    }
    if (known->second == 0) {
      out.problem = "rank " + std::to_string(rp.rank) + " (" + rp.device.label() + ") cannot hold its local share of " +
                    std::to_string(rp.samples) + " samples, " +
                    (rp.samples > kMaxMicroBatches
                         ? "even in " + std::to_string(kMaxMicroBatches) + " micro-batches (the most a step runs) of " +
                               std::to_string((rp.samples + kMaxMicroBatches - 1) / kMaxMicroBatches)
                         : std::string("even one at a time"));
      return out;
    }
    p.layout.micro_batches[static_cast<size_t>(rp.replica)] = known->second;
    rp.micro_batches = known->second;
    rp.micro_batch_size = (rp.samples + known->second - 1) / known->second;
    // What the share needs in one micro-batch: the figure the count is chosen against.
    RankPlan whole = rp;
    whole.micro_batches = 1;
    whole.micro_batch_size = whole.samples;
    const MemoryUse before = rank_memory(p, in.costs, whole);
    rp.memory = rank_memory(p, in.costs, rp);
    if (rp.memory_steps.empty()) rp.memory_steps.push_back(over_capacity_step(before, room(rp)));
    MemoryStep step = activations_step(MemoryStepKind::micro_batches, before.activations, rp.memory.activations);
    step.micro_batches = rp.micro_batches;
    step.micro_batch_size = rp.micro_batch_size;
    add_strategy(rp, MemoryStrategy::micro_batches, step);
  }
  l.inner_steps = static_cast<int>(l.groups.size());  // until predict_local chooses H and the H_g
  l.group_steps.assign(l.groups.size(), 1);
  l.outer_delay = l.inner_steps;
  p.local = l;
  // A parallel.local_steps below the groups is refused here (not worked round by leaving
  // ranks idle): the setting is what is wrong.
  predict_local(p, in.costs, in.cluster, in.sync_step_seconds, in.local_steps, in.flush_every);
  if (const std::optional<Shortfall> s = fit_host_memory(p, in.costs)) {
    out.problem = "rank " + std::to_string(s->rank) + " (" + s->device + ") cannot keep the outer state (" +
                  format_bytes(s->host_need.outer_state) + ": the model's weights 4 times) beside " +
                  format_bytes(s->host_need.total() - s->host_need.outer_state + s->host_others) + " in its host " +
                  s->host_name + "'s memory, " + format_bytes(s->capacity);
    return out;
  }
  note_host_memory(p);
  out.plan = std::move(p);
  return out;
}

// Synchronous groups of one class each (`order`'s ranks, fastest first): every class's
// ranks, in order, cut into min(k, its ranks) runs of near-equal size (the first ones a
// rank larger). Classes appear in the order of their first rank in `order`.
std::vector<std::vector<int>> class_groups(const std::vector<int>& classes, const std::vector<int>& order, size_t k) {
  std::vector<int> seen;
  std::map<int, std::vector<int>> members;
  for (int r : order) {
    auto [it, fresh] = members.try_emplace(classes[static_cast<size_t>(r)]);
    if (fresh) seen.push_back(it->first);
    it->second.push_back(r);
  }
  std::vector<std::vector<int>> groups;
  for (int c : seen) {
    const std::vector<int>& m = members[c];
    const size_t parts = std::min(k, m.size());
    for (size_t i = 0, at = 0; i < parts; ++i) {
      const size_t size = m.size() / parts + (i < m.size() % parts ? 1 : 0);
      groups.emplace_back(m.begin() + static_cast<long>(at), m.begin() + static_cast<long>(at + size));
      at += size;
    }
  }
  return groups;
}

// Within auto's bounds (bounded_local_plan): the class groups of k = 1, 2, 4, ... runs a
// class while they are at most in.most_groups (and at most parallel.local_steps, when
// set), each predicted; of those whose H is at most kMaxRoundSteps, the fastest, fewer
// groups preferred unless more are kIdleGain faster (a round's staleness grows with its
// groups' steps). `searched`: what the group search found, for the problem.
LocalPlanResult class_groups_plan(const LocalPlanInput& in, const std::vector<int>& classes,
                                  const std::vector<int>& order, const std::string& searched) {
  LocalPlanResult best;
  const size_t cap = in.local_steps > 0 ? std::min(in.most_groups, static_cast<size_t>(in.local_steps)) : in.most_groups;
  size_t tried = 0, least_h = 0, least_h_groups = 0;
  for (size_t k = 1;; k *= 2) {
    const std::vector<std::vector<int>> groups = class_groups(classes, order, k);
    if (groups.size() > cap || (k > 1 && groups.size() == tried)) break;
    tried = groups.size();
    LocalPlanResult r = plan_of_groups(in, classes, groups);
    if (!r.plan) {
      if (best.problem.empty()) best.problem = r.problem;
      continue;
    }
    const auto h = static_cast<size_t>(r.plan->local->inner_steps);
    if (least_h == 0 || h < least_h) least_h = h, least_h_groups = groups.size();
    if (h > static_cast<size_t>(kMaxRoundSteps)) continue;
    if (!best.plan || r.plan->predicted.step_seconds < (1 - kIdleGain) * best.plan->predicted.step_seconds)
      best = std::move(r);
  }
  if (best.plan) return best;
  const size_t kinds = class_groups(classes, order, 1).size();
  std::string why = searched + "; as synchronous groups of one class each, ";
  if (kinds > cap)
    why += std::to_string(kinds) + " classes of ranks (device and link tier), more than the " + std::to_string(cap) +
           " groups a round can give a step each";
  else if (least_h > 0)
    why += "a round needs at least " + std::to_string(least_h) + " inner steps (at " + std::to_string(least_h_groups) +
           (least_h_groups == 1 ? " group), more than kMaxRoundSteps " : " groups), more than kMaxRoundSteps ") +
           std::to_string(kMaxRoundSteps);
  else
    why += best.problem;
  best.problem = why;
  return best;
}

// The local plan over the fastest `used` ranks (`order`: every rank, fastest first), the
// others idle. `classes`: cost_classes of every rank; `tiers`: the cluster's link tiers.
// `bounded`: where the search gives more than in.most_groups groups, or its plan's round
// needs more than kMaxRoundSteps steps, class_groups_plan instead.
LocalPlanResult local_plan_over(const LocalPlanInput& in, const LinkTiers& tiers, const std::vector<int>& classes,
                                std::vector<int> order, bool bounded = false) {
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
  // Ranks are taken fastest first, a class's run of them at once: ranks of one class
  // (cost_classes) see the same links and costs, so each would make the choice the first
  // made. The run joins the existing group that keeps kGroupEfficiency of the two sides'
  // summed throughputs with all of it (and is fastest so), else forms a group of its
  // own if that keeps kGroupEfficiency of its ranks alone, else each of its ranks steps
  // alone. A run of one rank is the rank-by-rank search: a rank joins the best group that
  // it keeps efficient, or steps alone.
  std::vector<std::vector<int>> groups;
  std::vector<double> throughput;                 // per group, at its nominal share
  std::vector<std::map<int, size_t>> made_of;     // per group: ranks per class
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && classes[static_cast<size_t>(order[end])] == classes[static_cast<size_t>(order[begin])])
      ++end;
    const std::vector<int> run(order.begin() + static_cast<long>(begin), order.begin() + static_cast<long>(end));
    begin = end;
    const double alone = group_throughput(in, tiers, {run[0]}, nominal_share(in, {run[0]}, total_speed));
    const double run_alone = static_cast<double>(run.size()) * alone;
    int best = -1;
    double best_tput = 0;
    // Groups of the same classes in the same counts (the ranks of a class that each
    // stepped alone) joined by the run predict the same: once each.
    std::map<std::map<int, size_t>, double> joined_tput;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto [known, fresh] = joined_tput.try_emplace(made_of[g], 0.0);
      if (fresh) {
        std::vector<int> joined = groups[g];
        joined.insert(joined.end(), run.begin(), run.end());
        known->second = group_throughput(in, tiers, joined, nominal_share(in, joined, total_speed));
      }
      const double t = known->second;
      if (t >= kGroupEfficiency * (throughput[g] + run_alone) && t > best_tput) {
        best = static_cast<int>(g);
        best_tput = t;
      }
    }
    const int klass = classes[static_cast<size_t>(run[0])];
    if (best >= 0) {
      auto& g = groups[static_cast<size_t>(best)];
      g.insert(g.end(), run.begin(), run.end());
      throughput[static_cast<size_t>(best)] = best_tput;
      made_of[static_cast<size_t>(best)][klass] += run.size();
      continue;
    }
    if (run.size() > 1) {
      const double t = group_throughput(in, tiers, run, nominal_share(in, run, total_speed));
      if (t >= kGroupEfficiency * run_alone) {
        groups.push_back(run);
        throughput.push_back(t);
        made_of.push_back({{klass, run.size()}});
        continue;
      }
    }
    for (int r : run) {
      groups.push_back({r});
      throughput.push_back(alone);
      made_of.push_back({{klass, 1}});
    }
  }
  // Auto's bound (see local_plan_for): more groups than kMaxRoundSteps need a round
  // longer than any the accuracy was measured at, before predicting anything.
  if (in.most_groups > 0 && groups.size() > in.most_groups) {
    out.problem = std::to_string(groups.size()) + " groups, more than the " + std::to_string(in.most_groups) +
                  " inner steps a round can give one each";
    if (bounded) return class_groups_plan(in, classes, order, "the group search gives " + out.problem);
    return out;
  }
  out = plan_of_groups(in, classes, groups);
  if (bounded && out.plan && out.plan->local->inner_steps > kMaxRoundSteps)
    return class_groups_plan(in, classes, order,
                             "the group search's " + std::to_string(groups.size()) + " groups need rounds of " +
                                 std::to_string(out.plan->local->inner_steps) + " steps, more than kMaxRoundSteps " +
                                 std::to_string(kMaxRoundSteps));
  return out;
}

// make_local_plan, with `bounded` passed on to local_plan_over.
LocalPlanResult local_plan_of(const LocalPlanInput& in, bool bounded) {
  std::vector<int> order(in.data_plan.ranks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return replica_samples_per_s(in.costs, a) > replica_samples_per_s(in.costs, b);
  });
  const LinkTiers tiers = link_tiers(in.cluster);
  const std::vector<int> classes = cost_classes(in.cluster, in.costs, tiers);
  // As the synchronous planner does: every rank, unless fewer (the fastest ones, at least
  // two) are predicted kIdleGain faster. A rank whose one-sample step outlasts the
  // others' whole share holds every round back, whatever share it gets. Ranks of one
  // class are used or left idle together: the counts tried end at a class boundary of
  // the speed order.
  std::vector<size_t> counts;
  for (size_t used = order.size(); used >= 2; --used)
    if (used == order.size() ||
        classes[static_cast<size_t>(order[used])] != classes[static_cast<size_t>(order[used - 1])])
      counts.push_back(used);
  // The same over the order with the ranks behind slow links last (link_last_order): a
  // rank whose link only rounds of hundreds of steps would hide may be faster than one
  // beside it in the speed order, and leaving it idle should not take that one too. The
  // candidates are tried from the most ranks down, as above.
  const std::vector<int> by_links = link_last_order(in.cluster, order);
  std::vector<std::vector<int>> candidates, sets;
  auto add = [&](const std::vector<int>& from, size_t used) {
    std::vector<int> ranks(from.begin(), from.begin() + static_cast<long>(used));
    std::vector<int> set = ranks;
    std::sort(set.begin(), set.end());
    if (std::find(sets.begin(), sets.end(), set) != sets.end()) return;
    sets.push_back(std::move(set));
    candidates.push_back(std::move(ranks));
  };
  for (size_t used : counts) add(order, used);
  if (by_links != order)
    for (size_t used = by_links.size() - 1; used >= 2; --used)
      if (classes[static_cast<size_t>(by_links[used])] != classes[static_cast<size_t>(by_links[used - 1])])
        add(by_links, used);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const std::vector<int>& a, const std::vector<int>& b) { return a.size() > b.size(); });
  LocalPlanResult best;
  if (candidates.empty())  // one rank: no group to step beside another
    best.problem = "local steps groups beside one another, and the cluster has " + std::to_string(order.size()) +
                   " rank";
  for (const std::vector<int>& ranks : candidates) {
    LocalPlanResult r = local_plan_over(in, tiers, classes, ranks, bounded);
    if (!r.plan) {
      if (!best.plan && best.problem.empty()) best.problem = r.problem;
      continue;
    }
    if (!best.plan || r.plan->predicted.step_seconds < (1 - kIdleGain) * best.plan->predicted.step_seconds)
      best = std::move(r);
  }
  return best;
}

}  // namespace

LocalPlanResult make_local_plan(const LocalPlanInput& in) { return local_plan_of(in, false); }

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
    if (in.cluster.ranks.size() > kAutoLocalMaxRanks) return std::nullopt;
  }
  LocalPlanInput li;
  li.costs = in.costs;
  li.cluster = in.cluster;
  li.sync_step_seconds = sync_plan.predicted.step_seconds;
  li.local_steps = local_steps;
  li.flush_every = in.flush_every;
  // Auto takes local only where a round needs at most kMaxRoundSteps steps: every group
  // needs a step a round, and longer rounds grow the staleness past what was measured.
  if (!wanted) li.most_groups = kMaxRoundSteps;
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
             "; expected a data-parallel plan over two ranks or more, each holding the whole model and a sample of "
             "the global batch at least (use sync for one rank or a pipeline)");
    return r.plan;
  }
  if (!r.plan || r.plan->local->gain < 1 + kLocalMinGain || r.plan->local->inner_steps > kMaxRoundSteps)
    return std::nullopt;
  return r.plan;
}

LocalPlanResult bounded_local_plan(const PlannerInput& in, const Plan& sync_plan, int64_t local_steps) {
  LocalPlanResult r;
  if (in.strategy != config::ParallelStrategy::automatic && in.strategy != config::ParallelStrategy::data) {
    r.problem = std::string("parallel.strategy ") + config::to_string(in.strategy) +
                ": local groups are data-parallel replicas of the whole model; expected strategy auto or data";
    return r;
  }
  if (local_steps > kMaxRoundSteps) {
    r.problem = "parallel.local_steps " + std::to_string(local_steps) + " is above kMaxRoundSteps " +
                std::to_string(kMaxRoundSteps) + ", the longest round auto takes";
    return r;
  }
  LocalPlanInput li;
  li.costs = in.costs;
  li.cluster = in.cluster;
  li.sync_step_seconds = sync_plan.predicted.step_seconds;
  li.local_steps = local_steps;
  li.flush_every = in.flush_every;
  li.most_groups = kMaxRoundSteps;
  PlannerInput data = in;
  data.strategy = config::ParallelStrategy::data;
  data.hub_may_step_optimizer = false;
  try {
    li.data_plan = make_plan(data);
  } catch (const Error& e) {
    r.problem = e.what();
    return r;
  }
  return local_plan_of(li, true);
}

}  // namespace ht::plan
