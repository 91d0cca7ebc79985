#include "plan/what_if.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/units.h"
#include "plan/deadline_plan.h"
#include "plan/plan_costs.h"
#include "plan/rebalance.h"
#include "plan/simulator.h"

namespace ht::plan {

using Policy = config::SyncPolicy;

namespace {

Policy policy_of(const Plan& plan) {
  switch (plan.sync_policy) {
    case SyncPolicy::deadline: return Policy::deadline;
    case SyncPolicy::local: return Policy::local;
    case SyncPolicy::synchronous: break;
  }
  return Policy::sync;
}

// A plan and what it runs on: after a failure or a join the job runs another plan over
// another world. ids[i] is the identity of the plan's rank i: its rank in the world the
// events were given for (joined ranks get ids from that world's size up).
struct Phase {
  Plan plan;
  // Shared: a probe file's cluster holds its links as dense matrices.
  std::shared_ptr<const BlockCosts> costs_ptr;
  std::shared_ptr<const ClusterModel> cluster_ptr;
  const BlockCosts& costs() const { return *costs_ptr; }
  const ClusterModel& cluster() const { return *cluster_ptr; }
  std::vector<int> ids;
  int version = 0;
  double started_s = 0;  // when its job started (a restart's end): its re-splits count from then

  void set_ids(std::vector<int> v) {
    ids = std::move(v);
    where.assign(static_cast<size_t>(*std::max_element(ids.begin(), ids.end())) + 1, -1);
    for (size_t i = 0; i < ids.size(); ++i) where[static_cast<size_t>(ids[i])] = static_cast<int>(i);
  }
  int index_of(int id) const {
    return id >= 0 && static_cast<size_t>(id) < where.size() ? where[static_cast<size_t>(id)] : -1;
  }

 private:
  std::vector<int> where;  // [id] -> index in ids, -1: not in this phase
};

// One step's parts in one state of the cluster. sync and deadline: the step and each
// rank's compute (deadline: simulated without slow factors, which it applies per rank);
// local: each group's inner step and the round's own list (its outer passes).
struct StepParts {
  double step = 0;
  std::vector<double> busy;
  double tail = 0;  // step - the largest compute: what follows it (the reduction)
  // deadline: each rank's own copies of the gradient (plan::deadline_member_copy_seconds),
  // taken out of `tail`, so that a rank's arrival is its compute, its copies and the tail.
  std::vector<double> copy;
  // deadline: when each rank reaches its reduction, slow factors applied: its compute on
  // one stage; on a hybrid plan, when its ReduceGradsDeadline begins in the step simulated
  // with the factors (a replica's pipeline paces its ranks).
  std::vector<double> arrival;
  std::vector<double> group_steps;
  std::vector<double> plain_group_steps;  // without the slow factors
  double round_extra = 0;
  // Re-split (parallel.rebalance_every): each rank's samples a step in the plan played;
  // empty: the plan's.
  std::vector<int64_t> rank_samples;
  std::shared_ptr<const Plan> plan;  // the plan played where re-split (local: its round's split)
};

SimResult simulate_with(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                        const std::vector<double>& factors) {
  auto table = std::make_shared<const PlanCostTable>(plan_cost_table(plan, costs, cluster));
  CostModel cm = plan_cost_model(plan, table, cluster);
  if (std::any_of(factors.begin(), factors.end(), [](double f) { return f != 1; })) {
    cm.compute_seconds = [base = cm.compute_seconds, factors](int rank, const Instruction& in) {
      return base(rank, in) * factors[static_cast<size_t>(rank)];
    };
  }
  return simulate(plan_schedules(plan), cm);
}

// A local plan's groups and H in words: groups of the same make-up (ranks per device)
// counted together, in the order of their first group, idle ranks last.
std::string local_shape(const Plan& plan) {
  std::vector<std::pair<std::string, int>> kinds;  // make-up, groups
  for (int g = 0; g < static_cast<int>(plan.local->groups.size()); ++g) {
    std::vector<std::pair<std::string, int>> devices;  // label, ranks; in group order
    for (int r : group_ranks(plan, g)) {
      const std::string& label = plan.ranks[static_cast<size_t>(r)].device.label();
      auto it = std::find_if(devices.begin(), devices.end(), [&](const auto& d) { return d.first == label; });
      if (it == devices.end()) devices.emplace_back(label, 1);
      else ++it->second;
    }
    std::string makeup;
    for (const auto& [label, n] : devices) makeup += (makeup.empty() ? "" : " + ") + std::to_string(n) + " " + label;
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == makeup; });
    if (it == kinds.end()) kinds.emplace_back(makeup, 1);
    else ++it->second;
  }
  const size_t groups = plan.local->groups.size();
  std::string out = std::to_string(groups) + (groups == 1 ? " group (" : " groups (");
  for (size_t k = 0; k < kinds.size() && k < 4; ++k)
    out += (k ? ", " : "") + (kinds[k].second > 1 ? std::to_string(kinds[k].second) + " x " : "") + kinds[k].first;
  if (kinds.size() > 4) out += ", " + std::to_string(kinds.size() - 4) + " more kinds";
  const auto idle = std::count_if(plan.ranks.begin(), plan.ranks.end(), [](const RankPlan& r) { return r.replica < 0; });
  if (idle > 0) out += "; " + std::to_string(idle) + " ranks idle";
  return out + "), H " + std::to_string(plan.local->inner_steps);
}

// Equal but for rounding: spans that abut, a round that ended when the exchange was ready.
bool same_time(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}); }

// A pipeline with no replica beside it: no stand-in for a stalled stage.
bool pure_pipeline(const Plan& plan) { return plan.stage_ranges.size() > 1 && plan.layout.replicas.size() == 1; }

// When each rank of `ranks` reaches its ReduceGradsDeadline in a simulated step (its first
// span of it: the wait for the others, or the reduction); 0 for a rank without one.
std::vector<double> reduction_arrivals(const SimResult& sim, size_t ranks) {
  std::vector<double> at(ranks, -1);
  const std::string reduce = op_name(Op::reduce_grads_deadline);
  for (const Span& s : sim.timeline) {
    const auto r = static_cast<size_t>(s.rank);
    if (s.name == reduce && r < ranks && (at[r] < 0 || s.start_s < at[r])) at[r] = s.start_s;
  }
  for (double& a : at) a = std::max(a, 0.0);
  return at;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

class Play {
 public:
  Play(const WhatIfInput& in, Policy policy, const Phase& start, bool with_events)
      : in_(in), policy_(policy), phase_(start), record_(with_events) {
    if (with_events) events_ = in.events;
    used_.assign(events_.size(), false);
    finish_points_.assign(events_.size(), 0);
    has_links_ = std::any_of(events_.begin(), events_.end(), [](const WhatIfEvent& e) { return e.kind == WhatIfKind::link; });
  }

  PolicyOutcome run() {
    out_.policy = policy_;
    out_.step_seconds = phase_.plan.predicted.step_seconds;
    if (policy_ == Policy::local && phase_.plan.local) {
      out_.groups = static_cast<int>(phase_.plan.local->groups.size());
      out_.inner_steps = phase_.plan.local->inner_steps;
      out_.plan_shape = local_shape(phase_.plan);
    }
    if (record_) {
      if (policy_ == Policy::local && phase_.plan.local)
        for (size_t g = 0; g < phase_.plan.local->groups.size(); ++g) lane_name(static_cast<int>(g));
      else
        out_.lanes = {"job"};
    }
    try {
      if (policy_ == Policy::local) run_local();
      else if (policy_ == Policy::deadline && !pure_pipeline(phase_.plan)) run_deadline();
      else run_sync();
    } catch (const Error& e) {
      out_.refused = e.what();
    }
    // A join waits for a checkpoint: one that none followed before the end changed
    // nothing, which a cost of 0 alone would not say. (One after the end is said by the
    // table's notes on late events.)
    if (out_.refused.empty())
      for (size_t i = 0; i < events_.size(); ++i)
        if (!used_[i] && events_[i].kind == WhatIfKind::join && events_[i].at_s < out_.seconds)
          out_.notes.push_back(events_[i].spec + ": never joined: " +
                               (in_.checkpoint_every > 0
                                    ? "no checkpoint (every " + std::to_string(in_.checkpoint_every) +
                                          " steps) came after it before the job's end"
                                    : std::string("the job writes no checkpoint (checkpoint.every 0)")) +
                               ", and a device joins at one");
    return out_;
  }

 private:
  bool in_force(const WhatIfEvent& e, double t) const { return e.at_s <= t; }

  void lane_name(int lane) {
    while (out_.lanes.size() <= static_cast<size_t>(lane)) out_.lanes.push_back("group " + std::to_string(out_.lanes.size()));
  }

  // A span of the timeline; one that continues its lane's last span of the same kind
  // extends it (a thousand plain steps are one span).
  void span(int lane, double start, double end, WhatIfSpanKind kind) {
    if (!record_ || !(end > start) || same_time(start, end)) return;
    if (policy_ == Policy::local) lane_name(lane);
    if (last_.size() <= static_cast<size_t>(lane)) last_.resize(static_cast<size_t>(lane) + 1, -1);
    int& at = last_[static_cast<size_t>(lane)];
    if (at >= 0) {
      WhatIfSpan& s = out_.timeline[static_cast<size_t>(at)];
      if (s.kind == kind && same_time(s.end, start)) {
        s.end = std::max(s.end, end);
        return;
      }
    }
    out_.timeline.push_back({start, end, lane, kind});
    at = static_cast<int>(out_.timeline.size()) - 1;
  }

  // A span on every lane; `lost` spans lie over what was drawn, not after it.
  void span_all(double start, double end, WhatIfSpanKind kind) {
    if (!record_) return;
    for (size_t lane = 0; lane < out_.lanes.size(); ++lane) {
      if (kind == WhatIfSpanKind::lost) {
        if (end > start && !same_time(start, end)) out_.timeline.push_back({start, end, static_cast<int>(lane), kind});
      } else {
        span(static_cast<int>(lane), start, end, kind);
      }
    }
  }

  std::string state_key(double t) {
    std::string k = std::to_string(phase_.version) + ":";
    for (size_t i = 0; i < events_.size(); ++i) {
      const WhatIfEvent& e = events_[i];
      if (e.kind == WhatIfKind::slow || e.kind == WhatIfKind::link) k += in_force(e, t) ? '1' : '0';
      if (e.kind == WhatIfKind::slow && in_force(e, t) && resplits() && settle_clock(t) >= settle_time(i)) k += 's';
    }
    // Only link events read gone_ (cluster_at): without one it cannot change a step.
    if (has_links_)
      for (size_t i = 0; i < gone_.size(); ++i)
        if (gone_[i]) k += "|" + std::to_string(i);
    return k;
  }

  bool gone(int index) const { return static_cast<size_t>(index) < gone_.size() && gone_[static_cast<size_t>(index)]; }

  bool links_in_force(double t) const {
    return std::any_of(events_.begin(), events_.end(),
                       [&](const WhatIfEvent& e) { return e.kind == WhatIfKind::link && in_force(e, t); });
  }

  // The phase's cluster with the link events in force at t.
  ClusterModel cluster_at(double t) const {
    ClusterModel c = phase_.cluster();
    for (const WhatIfEvent& e : events_) {
      if (e.kind != WhatIfKind::link || !in_force(e, t)) continue;
      const int a = phase_.index_of(e.rank), b = phase_.index_of(e.peer);
      if (a < 0 || b < 0 || gone(a) || gone(b)) continue;
      const auto i = static_cast<size_t>(a), j = static_cast<size_t>(b);
      c.links.set_latency(i, j, e.latency_s);
      c.links.set_latency(j, i, e.latency_s);
      c.links.set_bandwidth(i, j, e.bandwidth_bytes_per_s);
      c.links.set_bandwidth(j, i, e.bandwidth_bytes_per_s);
    }
    return c;
  }

  std::vector<double> factors_at(double t) const {
    std::vector<double> f(phase_.ids.size(), 1.0);
    for (const WhatIfEvent& e : events_) {
      if (e.kind != WhatIfKind::slow || !in_force(e, t)) continue;
      const int i = phase_.index_of(e.rank);
      if (i >= 0) f[static_cast<size_t>(i)] = e.factor;
    }
    return f;
  }

  // Whether the job re-splits its batch by measured speed (what_if.h): under local its
  // rounds, where there is more than one group.
  bool resplits() const {
    const Plan& plan = phase_.plan;
    if (in_.rebalance_every <= 0) return false;
    if (policy_ == Policy::local) return plan.local && plan.local->groups.size() > 1;
    return plan.layout.replicas.size() > 1 && in_.planner.strategy != config::ParallelStrategy::equal &&
           (policy_ == Policy::sync || plan.stage_ranges.size() == 1);
  }

  // The time whose re-splits a state at t has: under local its round's start (every
  // group of a round runs one split), which run_local sets; t elsewhere.
  double settle_clock(double t) const { return policy_ == Policy::local && round_start_ >= 0 ? round_start_ : t; }

  // When slow event i's re-split runs, in the current job (infinity while it is found:
  // at the factor's start it is not yet in).
  double settle_time(size_t i) {
    const auto key = std::make_pair(phase_.version, i);
    if (const auto it = settle_.find(key); it != settle_.end()) return it->second;
    const double from = std::max(events_[i].at_s, phase_.started_s);
    settle_[key] = std::numeric_limits<double>::infinity();
    const double round_start = round_start_;
    round_start_ = from;
    const StepParts& p = parts(from);
    round_start_ = round_start;
    double at = from;
    if (policy_ == Policy::local) {
      // Rounds: the window of kResplitRounds rounds' medians, the round after a change left
      // out, and the answer taken at an exchange (runtime/local_sync.h).
      const Plan& plan = p.plan ? *p.plan : phase_.plan;
      double round = 0;
      for (size_t g = 0; g < p.group_steps.size(); ++g)
        round = std::max(round, p.group_steps[g] * plan.local->group_steps[g]);
      at += static_cast<double>(kResplitRounds + 2) * (round + p.round_extra);
    } else {
      double step = p.step;  // deadline: the latest part, which its budget grows to
      for (size_t r = 0; r < p.arrival.size(); ++r) step = std::max(step, p.arrival[r] + p.copy[r] + p.tail);
      at += static_cast<double>(kRebalanceLagChecks * in_.rebalance_every + 2) * step;
    }
    settle_[key] = at;
    return at;
  }

  // The slow factors whose re-split runs at t (1 elsewhere).
  std::vector<double> settled_factors_at(double t) {
    std::vector<double> f(phase_.ids.size(), 1.0);
    if (!resplits()) return f;
    for (size_t i = 0; i < events_.size(); ++i) {
      const WhatIfEvent& e = events_[i];
      if (e.kind != WhatIfKind::slow || !in_force(e, t)) continue;
      const int r = phase_.index_of(e.rank);
      if (r >= 0 && settle_clock(t) >= settle_time(i)) f[static_cast<size_t>(r)] = e.factor;
    }
    return f;
  }

  // The phase's plan re-split over its costs slowed by `factors` (plan/rebalance.h).
  Plan resplit_for(const std::vector<double>& factors) const {
    BlockCosts c = phase_.costs();
    for (size_t r = 0; r < factors.size(); ++r) {
      if (factors[r] == 1) continue;
      for (auto* row : {&c.seconds_per_sample, &c.call_seconds, &c.step_seconds})
        if (r < row->size())
          for (double& x : (*row)[r]) x *= factors[r];
    }
    if (policy_ != Policy::local) return resplit(phase_.plan, phase_.plan, c);
    // local: the round's split by the slowed groups' costs, its groups and H as planned
    // (plan/local_plan.h's resplit_from_measured, from the costs instead of a window).
    Plan p = phase_.plan;
    const RoundSplit split =
        split_round(p.local->inner_steps, p.global_batch, group_costs(p, c, phase_.cluster()));
    p.local->group_steps = split.steps;
    p.local->round_samples = split.samples;
    return p;
  }

  // Under deadline on one stage: how much longer rank r's contribution to the leader and
  // the leader's result back take over their link in `changed` than in `base` (0 for the
  // leader, and for a link no slower).
  double own_link_change(const Plan& plan, const ClusterModel& base, const ClusterModel& changed, size_t r) const {
    const auto owner = static_cast<size_t>(std::max(plan.layout.reduce_owner, 0));
    const auto leader = static_cast<size_t>(plan.layout.replicas[owner][0]);
    if (r == leader || plan.ranks[r].replica < 0) return 0;
    double params = 0;
    for (double n : phase_.costs().params) params += n;
    const double bytes = params * kGradBytesPerParam;
    const auto both_ways = [&](const ClusterModel& c) {
      const double bw = c.links.bandwidth(r, leader);
      return 2 * (c.links.latency(r, leader) + (bw > 0 ? bytes / bw : 0));
    };
    return std::max(0.0, both_ways(changed) - both_ways(base));
  }

  const StepParts& parts(double t) {
    const std::string key = state_key(t);
    const auto hit = cache_.find(key);
    if (hit != cache_.end()) return hit->second;
    StepParts p;
    const bool links = links_in_force(t);
    const ClusterModel changed = links ? cluster_at(t) : ClusterModel{};
    const ClusterModel& cluster = links ? changed : phase_.cluster();
    const std::vector<double> factors = factors_at(t);
    const std::vector<double> settled = settled_factors_at(t);
    if (std::any_of(settled.begin(), settled.end(), [](double f) { return f != 1; }))
      p.plan = std::make_shared<const Plan>(resplit_for(settled));
    const Plan& plan = p.plan ? *p.plan : phase_.plan;
    if (p.plan)
      for (const RankPlan& rp : plan.ranks) p.rank_samples.push_back(rp.replica >= 0 ? rp.samples : 0);
    if (policy_ == Policy::local) {
      const int groups = static_cast<int>(plan.local->groups.size());
      double slowest_round = 0;
      // Groups of the same classes of ranks, slow factors, shares and step size play
      // alike: each such kind is simulated once (thousands of one-rank groups are a few).
      const std::vector<int> kind_of_rank = cost_classes(cluster, phase_.costs(), link_tiers(cluster));
      std::map<std::vector<double>, std::pair<double, double>> kinds;
      check_local_plan(plan);
      for (int g = 0; g < groups; ++g) {
        const std::vector<int> ranks = group_ranks(plan, g);
        // Its inner steps are sized n_g / H_g (to a sample), not one global batch.
        const int64_t size = inner_step_samples(plan, g, 0);
        std::vector<double> kind{static_cast<double>(size)};
        for (size_t i = 0; i < ranks.size(); ++i) {
          const auto r = static_cast<size_t>(plan.local->groups[static_cast<size_t>(g)][i]);
          kind.insert(kind.end(), {static_cast<double>(kind_of_rank[static_cast<size_t>(ranks[i])]),
                                   factors[static_cast<size_t>(ranks[i])], static_cast<double>(plan.layout.samples[r]),
                                   static_cast<double>(plan.layout.micro_batches[r])});
        }
        auto it = kinds.find(kind);
        if (it == kinds.end()) {
          Plan sub = group_plan_unchecked(plan, g);
          size_group_step(sub, plan, g, size);
          const BlockCosts sub_costs = costs_of(phase_.costs(), ranks);
          const ClusterModel sub_cluster = cluster_of(cluster, ranks);
          std::vector<double> sub_factors;
          for (int r : ranks) sub_factors.push_back(factors[static_cast<size_t>(r)]);
          it = kinds.emplace(kind, std::pair{simulate_with(sub, sub_costs, sub_cluster, sub_factors).step_seconds,
                                             simulate_with(sub, sub_costs, sub_cluster, {}).step_seconds})
                   .first;
        }
        p.group_steps.push_back(it->second.first);
        const double plain = it->second.second;
        p.plain_group_steps.push_back(plain);
        slowest_round = std::max(slowest_round, plain * plan.local->group_steps[static_cast<size_t>(g)]);
      }
      double job_step = plan.predicted.step_seconds;
      if (links) {  // the outer exchange crosses the changed links too
        Plan again = plan;
        predict_local(again, phase_.costs(), cluster, plan.local->sync_step_seconds, plan.local->inner_steps,
                      plan.local->round_align);
        job_step = again.predicted.step_seconds;
      }
      p.round_extra = std::max(0.0, job_step * plan.local->inner_steps - slowest_round);
    } else if (policy_ == Policy::deadline && !pure_pipeline(plan)) {
      // On one stage a changed link moves only its own ranks' exchange with the leader:
      // the step's common tail is the unchanged cluster's, and each rank's arrival takes
      // its own link's change (charged the whole reduction at a 1 MB/s link to one
      // member, every member's samples were left out).
      const bool one_stage = plan.stage_ranges.size() == 1;
      const SimResult sim = simulate_with(plan, phase_.costs(), one_stage ? phase_.cluster() : cluster, {});
      p.step = sim.step_seconds;
      p.busy = sim.busy_seconds;
      p.copy.assign(plan.ranks.size(), 0.0);
      for (size_t r = 0; r < plan.ranks.size(); ++r)
        if (plan.ranks[r].replica >= 0)
          p.copy[r] = deadline_member_copy_seconds(plan, plan.layout, phase_.costs(),
                                                   static_cast<size_t>(plan.ranks[r].stage),
                                                   static_cast<size_t>(plan.ranks[r].replica));
      if (one_stage) {
        p.arrival.resize(plan.ranks.size());
        for (size_t r = 0; r < plan.ranks.size(); ++r)
          p.arrival[r] = p.busy[r] * factors[r] + (links ? own_link_change(plan, phase_.cluster(), cluster, r) : 0);
        p.tail = p.step - *std::max_element(p.busy.begin(), p.busy.end());
      } else {
        const std::vector<double> plain = reduction_arrivals(sim, plan.ranks.size());
        const bool slowed = std::any_of(factors.begin(), factors.end(), [](double f) { return f != 1; });
        p.arrival = slowed ? reduction_arrivals(simulate_with(plan, phase_.costs(), cluster, factors), plan.ranks.size())
                           : plain;
        p.tail = p.step - *std::max_element(plain.begin(), plain.end());
      }
      p.tail = std::max(0.0, p.tail - *std::max_element(p.copy.begin(), p.copy.end()));
    } else {
      p.step = simulate_with(plan, phase_.costs(), cluster, factors).step_seconds;
    }
    return cache_.emplace(key, std::move(p)).first->second;
  }

  bool active(int index) const {
    return index >= 0 && phase_.plan.ranks[static_cast<size_t>(index)].replica >= 0;
  }

  // The end of work of `length` started at t on a rank whose stalls (not yet spent) hold
  // it: the rank is stopped over the union of its stalls (from `at` for S each), and the
  // work runs in the time between them. Marks the stalls that begin before that end as
  // spent.
  double held_end(int index, double t, double length, bool spend = true) {
    std::vector<std::pair<double, size_t>> stalls;  // (start, event)
    for (size_t i = 0; i < events_.size(); ++i) {
      const WhatIfEvent& e = events_[i];
      if (!used_[i] && e.kind == WhatIfKind::stall && phase_.index_of(e.rank) == index) stalls.emplace_back(e.at_s, i);
    }
    std::sort(stalls.begin(), stalls.end());
    double clock = t, left = length;  // the work not yet done at `clock`
    for (const auto& [at, i] : stalls) {
      if (at >= clock + left) break;  // the work ends before this stall begins
      const double resumed = at + events_[i].for_s;
      if (resumed <= clock) continue;  // over before the work got here, or within an earlier stall
      if (at > clock) left -= at - clock;
      clock = resumed;
    }
    const double end = clock + left;
    if (spend)
      for (const auto& [at, i] : stalls)
        if (at < end) used_[i] = true;
    return end;
  }

  // The first failure, not yet spent, of the phase's rank `index` before `end`; -1 if none.
  int failure_of(int index, double end) const {
    for (size_t i = 0; i < events_.size(); ++i)
      if (!used_[i] && events_[i].kind == WhatIfKind::fail && events_[i].at_s < end &&
          phase_.index_of(events_[i].rank) == index)
        return static_cast<int>(i);
    return -1;
  }

  // The first failure, not yet spent, of a rank of the phase before `end`.
  int failure_before(double end) const {
    for (size_t i = 0; i < events_.size(); ++i)
      if (!used_[i] && events_[i].kind == WhatIfKind::fail && events_[i].at_s < end &&
          phase_.index_of(events_[i].rank) >= 0)
        return static_cast<int>(i);
    return -1;
  }

  // Until when after t no event can change a step: the first start of a slow factor or a
  // link change after t, and of a stall (of a rank that trains), failure or join not yet
  // spent (one already due, or a join waiting for its checkpoint, gives t: not quiet).
  double quiet_until(double t) {
    double until = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < events_.size(); ++i) {
      const WhatIfEvent& e = events_[i];
      if (e.kind == WhatIfKind::slow || e.kind == WhatIfKind::link) {
        if (e.at_s > t) until = std::min(until, e.at_s);
        else if (e.kind == WhatIfKind::slow && resplits() && settle_time(i) > t)
          until = std::min(until, settle_time(i));
      } else if (!used_[i]) {
        const int r = phase_.index_of(e.rank);
        // An idle rank's stall holds no step (held_end skips it); where the play is sync's
        // it holds the job at a log exchange (idle_stall_hold), played step by step from
        // its start.
        if (e.kind == WhatIfKind::stall && !active(r) && (!sync_play_ || r < 0)) continue;
        if (e.kind != WhatIfKind::join && r < 0) continue;
        until = std::min(until, std::max(t, e.at_s));
      }
    }
    return until;
  }

  // A join that has happened by t and not yet been planned in.
  int join_by(double t) const {
    for (size_t i = 0; i < events_.size(); ++i)
      if (!used_[i] && events_[i].kind == WhatIfKind::join && events_[i].at_s <= t) return static_cast<int>(i);
    return -1;
  }

  // Every join waiting by t, taken (one restart brings them all in).
  std::vector<int> take_joins_by(double t) {
    std::vector<int> joins;
    for (int j = join_by(t); j >= 0; j = join_by(t)) {
      used_[static_cast<size_t>(j)] = true;
      joins.push_back(j);
    }
    return joins;
  }

  // "fail:rank=1,at=5 and fail:rank=2,at=5": the events' specs, for notes and errors.
  std::string specs_of(const std::vector<int>& events) const {
    std::string specs;
    for (int e : events) specs += (specs.empty() ? "" : " and ") + events_[static_cast<size_t>(e)].spec;
    return specs;
  }

  void replan(const ClusterModel& cluster, const BlockCosts& costs, std::vector<int> ids) {
    // A new job (a restart, a join): its log exchanges count from none.
    std::fill(finish_points_.begin(), finish_points_.end(), 0);
    PlannerInput pin;
    pin.cluster = cluster;
    pin.costs = costs;
    pin.global_batch = in_.planner.global_batch;
    pin.min_micro_batches = in_.planner.min_micro_batches;
    pin.strategy = in_.planner.strategy;
    pin.hub_may_step_optimizer = in_.planner.hub_may_step_optimizer;
    pin.may_shard_optimizer = in_.planner.may_shard_optimizer;
    pin.use_every_rank = in_.planner.use_every_rank;
    pin.one_stage = in_.planner.one_stage;
    pin.config_name = in_.planner.config_name;
    pin.config_hash = in_.planner.config_hash;
    pin.flush_every = in_.planner.flush_every;
    Phase next;
    next.plan = plan_for_policy(pin, policy_, in_.local_steps);
    next.costs_ptr = std::make_shared<const BlockCosts>(costs);
    next.cluster_ptr = std::make_shared<const ClusterModel>(cluster);
    next.set_ids(std::move(ids));
    next.version = phase_.version + 1;
    phase_ = std::move(next);
  }

  // The job restarts without the failed rank at t (after the restart): re-planned.
  void replan_without(const std::vector<int>& failed_events) {
    std::vector<bool> gone(phase_.ids.size(), false);
    for (int f : failed_events) gone[static_cast<size_t>(phase_.index_of(events_[static_cast<size_t>(f)].rank))] = true;
    const std::string specs = specs_of(failed_events);
    std::vector<int> keep, ids;
    for (size_t i = 0; i < phase_.ids.size(); ++i)
      if (!gone[i]) keep.push_back(static_cast<int>(i)), ids.push_back(phase_.ids[i]);
    HT_CHECK(!keep.empty(), "what-if: ", specs, " leave", failed_events.size() > 1 ? "" : "s", " no rank to restart on");
    try {
      replan(cluster_of(phase_.cluster(), keep), costs_of(phase_.costs(), keep), std::move(ids));
    } catch (const Error& e) {
      throw Error("after " + specs + ", no plan on the ranks left: " + e.what());
    }
  }

  // Ranks of the catalogue devices join (one restart for all of them), each linked to
  // every rank as rank 0's median link.
  void replan_with(const std::vector<int>& join_events) {
    ClusterModel c = phase_.cluster();
    std::vector<double> lat, bw;
    for (size_t j = 1; j < c.ranks.size(); ++j) lat.push_back(c.links.latency(0, j)), bw.push_back(c.links.bandwidth(0, j));
    const double latency = lat.empty() ? 0 : median(lat), bandwidth = bw.empty() ? 1e9 : median(bw);
    std::vector<int> ids = phase_.ids;
    for (int j : join_events) {
      const WhatIfEvent& e = events_[static_cast<size_t>(j)];
      c.ranks.push_back(cluster_from_synth("synth:1x" + e.device, in_.catalogue_path).ranks.at(0));
      c.links.add_rank(latency, bandwidth);
      ids.push_back(static_cast<int>(in_.planner.cluster.ranks.size()) + joined_++);
    }
    // A joined rank is modelled from its datasheet (no profile row of its own).
    for (auto* rows : {&c.block_seconds, &c.block_step_seconds, &c.block_call_seconds})
      if (!rows->empty()) rows->resize(c.ranks.size());
    try {
      replan(c, block_costs(in_.model, c, in_.optimizer), std::move(ids));
    } catch (const Error& err) {
      throw Error("after " + specs_of(join_events) + ", no plan with the new rank" + (join_events.size() > 1 ? "s: " : ": ") +
                  err.what());
    }
  }

  // Leaves the failed ranks out of the phase's world before a re-plan (deadline, which
  // runs on without them).
  void drop_failed(const std::vector<bool>& failed) {
    std::vector<int> keep, ids;
    for (size_t i = 0; i < phase_.ids.size(); ++i)
      if (!failed[i]) keep.push_back(static_cast<int>(i)), ids.push_back(phase_.ids[i]);
    if (keep.size() == phase_.ids.size()) return;
    phase_.cluster_ptr = std::make_shared<const ClusterModel>(cluster_of(phase_.cluster(), keep));
    phase_.costs_ptr = std::make_shared<const BlockCosts>(costs_of(phase_.costs(), keep));
    phase_.set_ids(std::move(ids));
  }

  // At a checkpoint boundary (time t, after the step): a pending join restarts the job on
  // the larger world. Returns the time the job goes on.
  double join_at_checkpoint(double t, int64_t done) {
    if (done >= in_.steps) return t;
    const std::vector<int> joins = take_joins_by(t);
    if (joins.empty()) return t;
    // The step before, so that a join that slows the job says so (under deadline every rank
    // trains: a slow device that joins sets the pace).
    const double before = phase_.plan.predicted.step_seconds;
    replan_with(joins);
    phase_.started_s = t + kRestartSeconds;
    const double after = phase_.plan.predicted.step_seconds;
    for (int j : joins)
      out_.notes.push_back(events_[static_cast<size_t>(j)].spec + ": joined at the checkpoint of step " +
                           std::to_string(done) + " (" + format_seconds(t) + "), re-planned: step " +
                           format_seconds(after) + " (was " + format_seconds(before) + ")" +
                           (joins.size() > 1 ? " (" + std::to_string(joins.size()) + " joined with one restart)" : ""));
    span_all(t, t + kRestartSeconds, WhatIfSpanKind::restart);
    return t + kRestartSeconds;
  }

  bool checkpoint_at(int64_t done) const { return in_.checkpoint_every > 0 && done % in_.checkpoint_every == 0; }

  // A failure at T ends the job: restart from the newest checkpoint on the ranks left.
  // Returns the time the job goes on; `done` becomes the checkpoint's step. Failures of
  // other ranks by the restart's end (at the same time, or while it restarts) are left out
  // by the same restart: the ranks it starts on are those still there.
  double restart(int failed, double t, double since, int64_t& done, int64_t checkpoint) {
    const WhatIfEvent& e = events_[static_cast<size_t>(failed)];
    const double at = std::max(e.at_s, t);
    std::vector<int> together{failed};
    used_[static_cast<size_t>(failed)] = true;
    for (size_t i = 0; i < events_.size(); ++i) {
      const WhatIfEvent& o = events_[i];
      if (used_[i] || o.kind != WhatIfKind::fail || o.at_s >= at + kRestartSeconds) continue;
      const int r = phase_.index_of(o.rank);
      if (r < 0) continue;
      used_[i] = true;  // a second failure of a rank already gone changes nothing more
      if (std::none_of(together.begin(), together.end(),
                       [&](int f) { return phase_.index_of(events_[static_cast<size_t>(f)].rank) == r; }))
        together.push_back(static_cast<int>(i));
    }
    out_.work_lost_steps += done - checkpoint;
    out_.work_lost_seconds += at - since + kRestartSeconds;
    const int64_t lost = done - checkpoint;
    done = checkpoint;
    span_all(since, at, WhatIfSpanKind::lost);
    span_all(at, at + kRestartSeconds, WhatIfSpanKind::restart);
    // Devices waiting to join by the restart's end come in with it: the job is re-planned
    // anyway (they waited for a checkpoint, and the failure restarts from one). One plan
    // over the ranks left and those joining: the ranks left alone may have none (local
    // needs two groups) that the joining ones give.
    const std::vector<int> joins = take_joins_by(at + kRestartSeconds);
    if (joins.empty()) {
      replan_without(together);
    } else {
      std::vector<bool> gone(phase_.ids.size(), false);
      for (int f : together) gone[static_cast<size_t>(phase_.index_of(events_[static_cast<size_t>(f)].rank))] = true;
      HT_CHECK(std::find(gone.begin(), gone.end(), false) != gone.end(), "what-if: ", specs_of(together), " leave",
               together.size() > 1 ? "" : "s", " no rank to restart on");
      drop_failed(gone);
      replan_with(joins);
    }
    phase_.started_s = at + kRestartSeconds;
    const std::string specs = specs_of(together);
    // The re-plan is of the ranks left as first given: a slow factor or link change in
    // force is played from then on but not planned around.
    out_.notes.push_back(specs + ": restart from the checkpoint of step " + std::to_string(checkpoint) + " (" +
                         std::to_string(lost) + " steps lost) on " + std::to_string(phase_.ids.size()) +
                         " ranks, re-planned on their planned speeds: step " +
                         format_seconds(phase_.plan.predicted.step_seconds) +
                         (together.size() > 1 ? " (" + std::to_string(together.size()) + " failed, one restart)" : ""));
    for (int j : joins)
      out_.notes.push_back(events_[static_cast<size_t>(j)].spec + ": joined with the restart after " + specs);
    return at + kRestartSeconds;
  }

  // Under sync, after job step `done` ended at t: the stalls of idle ranks that hold the
  // job here (what_if.h): at the second log exchange finished since the stall began (rank
  // 0 finishes log step kE's after step kE + 1), at a checkpoint or at the job's end.
  // Returns when the job goes on.
  double idle_stall_hold(double t, int64_t done) {
    const int64_t every = std::max<int64_t>(1, in_.log_every);
    const bool finish_point = done > 1 && (done - 1) % every == 0;
    double go_on = t;
    for (size_t i = 0; i < events_.size(); ++i) {
      const WhatIfEvent& e = events_[i];
      const int r = phase_.index_of(e.rank);
      if (used_[i] || e.kind != WhatIfKind::stall || r < 0 || active(r) || e.at_s >= t) continue;
      if (finish_point) ++finish_points_[i];
      if (finish_points_[i] < 2 && !checkpoint_at(done) && done < in_.steps) continue;
      used_[i] = true;
      go_on = std::max(go_on, e.at_s + e.for_s);
    }
    return go_on;
  }

  void finish(double seconds, int64_t samples) {
    out_.seconds = seconds;
    out_.samples_per_s = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
  }

  void run_sync() {
    sync_play_ = true;
    if (policy_ == Policy::deadline)
      out_.notes.push_back("a pipeline has no stand-in for a stalled stage: deadline waits for it as sync does");
    double t = 0, since = 0;  // since: when the work after the newest checkpoint began
    int64_t done = 0, checkpoint = 0;
    while (done < in_.steps) {
      const double step = parts(t).step;
      // Steps that end before the next event are alike: each is played as the loop below
      // would (the same additions, so the same times), without asking every rank.
      for (const double quiet = quiet_until(t); done < in_.steps && t + step < quiet;) {
        span(0, t, t + step, WhatIfSpanKind::work);
        t += step;
        ++done;
        if (checkpoint_at(done)) checkpoint = done, since = t;  // no join is waiting (quiet)
      }
      if (done >= in_.steps) break;
      double end = t + step;
      for (size_t r = 0; r < phase_.ids.size(); ++r)
        if (active(static_cast<int>(r))) end = std::max(end, held_end(static_cast<int>(r), t, step));
      if (const int f = failure_before(end); f >= 0) {
        span(0, t, std::max(t, events_[static_cast<size_t>(f)].at_s), WhatIfSpanKind::work);  // then lost
        t = since = restart(f, t, since, done, checkpoint);
        continue;
      }
      span(0, t, t + step, WhatIfSpanKind::work);
      span(0, t + step, end, WhatIfSpanKind::held);
      t = end;
      ++done;
      // Held by an idle rank's stall (sync's plan, and deadline's pure pipeline, which
      // runs as sync does): a failure while the job waits ends it there, the step's
      // checkpoint not written.
      if (const double go_on = idle_stall_hold(t, done); go_on > t) {
        if (const int f = failure_before(go_on); f >= 0) {
          t = since = restart(f, t, since, done, checkpoint);
          continue;
        }
        span(0, t, go_on, WhatIfSpanKind::held);
        t = go_on;
      }
      if (checkpoint_at(done)) {
        checkpoint = done;
        t = since = join_at_checkpoint(t, done);
      }
    }
    finish(t, in_.steps * in_.planner.global_batch);
  }

  // The budget as comm/deadline_reduce's leader sets it (what_if.h): the plan's until
  // kDeadlineMinMeasured steps have closed, then (1 + slack) x the window's median latest
  // arrival. `window`: (step, latest arrival after its start) of the last closed steps.
  double adapted_budget(const std::deque<std::pair<int64_t, double>>& window, double first) const {
    if (window.size() < static_cast<size_t>(kDeadlineMinMeasured)) return first;
    std::vector<double> v;
    for (const auto& w : window) v.push_back(w.second);
    return median(std::move(v)) * (1 + in_.deadline_slack);
  }

  // What a deadline step leaves out as one: on one stage each active rank alone; on a
  // hybrid plan each replica, whose ranks a pipeline ties together (a stalled rank holds
  // its replica's every stage, and each stage's reduction leaves that replica out).
  struct DeadlineUnit {
    std::vector<int> ranks;  // phase indices
    int64_t samples = 0;
  };
  std::vector<DeadlineUnit> deadline_units() const {
    const Plan& plan = phase_.plan;
    std::vector<DeadlineUnit> units;
    if (plan.stage_ranges.size() == 1) {
      for (size_t r = 0; r < phase_.ids.size(); ++r)
        if (active(static_cast<int>(r))) units.push_back({{static_cast<int>(r)}, plan.ranks[r].samples});
    } else {
      for (size_t k = 0; k < plan.layout.replicas.size(); ++k)
        units.push_back({plan.layout.replicas[k], plan.layout.samples[k]});
    }
    return units;
  }

  void run_deadline() {
    double t = 0;
    int64_t done = 0, dropped = 0;
    std::vector<DeadlineUnit> units = deadline_units();
    std::vector<int> missed(units.size(), 0);
    std::vector<bool> failed(units.size(), false);
    gone_.assign(phase_.ids.size(), false);
    std::deque<std::pair<int64_t, double>> window;
    // A stalled unit's part of the step it stopped in, sent when it resumes: (step, when,
    // its arrival after that step's start); counted if the step is still in the window.
    std::vector<std::tuple<int64_t, double, double>> returning;
    double budget = phase_.plan.predicted.step_seconds * (1 + in_.deadline_slack);
    // The reduction's leader: term % size, rank 0's unit first; a member that hears
    // nothing from it within its patience moves to the next.
    size_t leader = 0;
    const auto name_of = [&](size_t u) { return phase_.ids[static_cast<size_t>(units[u].ranks.front())]; };
    // The last step was steady (every unit in by the budget, its window all that step's
    // arrival, nothing returning): its close, and the state it was played in.
    bool steady = false;
    double steady_close = 0, steady_budget = 0;  // a failure counts from before a step's budget ends
    std::string steady_key;
    while (done < in_.steps) {
      // Steps alike a steady one that end before the next event are played as the loop
      // below would play them (the same additions, so the same times), without asking
      // every unit.
      if (steady && state_key(t) == steady_key)
        for (const double quiet = quiet_until(t); done < in_.steps && t + steady_budget < quiet;) {
          span(0, t, t + steady_close, WhatIfSpanKind::work);
          window.emplace_back(done, steady_close);
          while (window.size() > static_cast<size_t>(kDeadlineMedianOf) + 1) window.pop_front();
          t += steady_close;
          ++done;  // a checkpoint here changes nothing: no join is waiting (quiet)
        }
      if (done >= in_.steps) break;
      const StepParts& p = parts(t);
      for (auto it = returning.begin(); it != returning.end();) {
        const auto [step, when, arrival] = *it;
        if (when > t) {
          ++it;
          continue;
        }
        for (auto& w : window)
          if (w.first == step) w.second = std::max(w.second, arrival);
        it = returning.erase(it);
      }
      budget = adapted_budget(window, budget);
      // Each unit as the step finds it: silent (failed, or stalled past the budget), or its
      // contribution's arrival after the step's start.
      struct Seen {
        bool silent = false, held = false;
        double arrival = 0, end = 0;  // end: when it arrives, stalls included
      };
      std::vector<Seen> seen(units.size());
      for (size_t u = 0; u < units.size(); ++u) {
        Seen& x = seen[u];
        x.silent = failed[u];
        x.end = t;
        for (int idx : units[u].ranks) {
          const auto r = static_cast<size_t>(idx);
          const double part = p.arrival[r] + p.copy[r] + p.tail;
          x.arrival = std::max(x.arrival, part);
          // t + part exactly when no stall holds it (a rank of a unit already silent is
          // not played, but its failure is still taken: another rank of a replica that
          // failed is gone too, and a failure left due would hold every later step).
          const double e = x.silent ? t + part : held_end(idx, t, part, false);
          // A failure before the rank's contribution left leaves it out from this step on
          // (one after it, or after the job's last step, does not touch this step).
          if (const int f = failure_of(idx, e); f >= 0) {
            used_[static_cast<size_t>(f)] = true;
            if (!gone_[r])
              out_.notes.push_back(events_[static_cast<size_t>(f)].spec + ": left out from step " +
                                   std::to_string(done) + " on, no restart");
            gone_[r] = true;
            failed[u] = x.silent = true;
            continue;
          }
          if (x.silent) continue;
          x.held = x.held || e > t + part;
          x.end = std::max(x.end, e);
        }
        if (!x.silent) {
          x.arrival = std::max(x.arrival, x.end - t);
          x.silent = x.held && x.arrival > budget;  // stalled past the budget: nothing heard
        }
      }
      // Nobody left to close a step: the job ends here, as under sync.
      HT_CHECK(std::find(failed.begin(), failed.end(), false) != failed.end(),
               "what-if: by step ", done, " every ",
               units.front().ranks.size() > 1 ? "replica has lost a rank (deadline leaves a replica out whole)"
                                              : "rank has failed",
               ": none left to train");
      // Every unit stalled past the budget: no step closes while all are stopped. The first
      // back leads and waits a budget for the others, so this step's budget runs from then.
      double step_budget = budget;
      if (std::all_of(seen.begin(), seen.end(), [](const Seen& x) { return x.silent; })) {
        double first = std::numeric_limits<double>::infinity();
        for (size_t u = 0; u < units.size(); ++u)
          if (!failed[u]) first = std::min(first, seen[u].end);
        step_budget = first - t + budget;
        for (size_t u = 0; u < units.size(); ++u)
          if (!failed[u] && seen[u].arrival <= step_budget) seen[u].silent = false;
      }
      bool waited = false, any_missing = false, leader_silent = false;
      double last = 0, latest = 0;  // latest: the arrivals the budget adapts to, late ones included
      // The step's close without waiting: the last arrival in time of the units not far
      // behind. A unit whose part takes kDeadlineBehindSteps such closes or more is as far
      // behind as one back from a stop: comm/deadline_reduce's leader waits for it only as
      // for a silent one (kDeadlineWaitedSteps steps), and its part, a step it computed
      // on an old state, is never in the step's sum, however long the budget has grown.
      double fastest = std::numeric_limits<double>::infinity(), pace = 0;
      for (const Seen& x : seen)
        if (!x.silent) fastest = std::min(fastest, x.arrival);
      for (const Seen& x : seen)
        if (!x.silent && x.arrival <= step_budget && x.arrival < kDeadlineBehindSteps * fastest)
          pace = std::max(pace, x.arrival);
      const auto behind = [&](const Seen& x) { return !x.silent && pace > 0 && x.arrival >= kDeadlineBehindSteps * pace; };
      for (size_t u = 0; u < units.size(); ++u) {
        const Seen& x = seen[u];
        if (x.silent && !failed[u] && missed[u] == 0) returning.emplace_back(done, x.end, x.arrival);  // one send, on resuming
        if (!x.silent) latest = std::max(latest, x.arrival);
        if (x.arrival <= step_budget && !x.silent && !behind(x)) {
          last = std::max(last, x.arrival);
          missed[u] = 0;
          continue;
        }
        any_missing = true;
        // A leader far behind (slowed past kDeadlineBehindSteps closes) is as silent to its
        // members: their patience runs out, and the next member leads.
        leader_silent = leader_silent || ((x.silent || behind(x)) && u == leader);
        // A re-split moved the shares: one stage's unit is its rank, with the share played.
        dropped += p.rank_samples.empty() || units[u].ranks.size() != 1
                       ? units[u].samples
                       : p.rank_samples[static_cast<size_t>(units[u].ranks.front())];
        const bool unheard = x.silent || behind(x);
        waited = waited || !unheard || missed[u] < kDeadlineWaitedSteps;
        missed[u] = unheard ? missed[u] + 1 : 0;
      }
      double close = waited ? step_budget : last;
      if (leader_silent) {
        // The members wait their patience after sending, then the next unit leads from
        // then on: it waits a budget for the silent one (new to its count), and measures
        // its own window afresh.
        size_t next = leader;
        for (size_t k = 1; k <= units.size(); ++k)
          if (!failed[(leader + k) % units.size()]) {
            next = (leader + k) % units.size();
            break;
          }
        double sent = 0;
        for (int idx : units[next].ranks)
          sent = std::max(sent, p.arrival[static_cast<size_t>(idx)] + p.copy[static_cast<size_t>(idx)] + p.tail);
        close = sent + kDeadlinePatienceBudgets * budget + kDeadlinePatienceSeconds + budget;
        out_.notes.push_back("the leader (rank " + std::to_string(name_of(leader)) + ") fell silent at step " +
                             std::to_string(done) + ": rank " + std::to_string(name_of(next)) +
                             " leads from then on");
        leader = next;
        window.clear(), returning.clear();
      }
      // Stalls that ended by this step's close are spent: the rank is caught up.
      for (size_t i = 0; i < events_.size(); ++i)
        if (events_[i].kind == WhatIfKind::stall && events_[i].at_s + events_[i].for_s <= t + close) used_[i] = true;
      if (any_missing) ++out_.steps_closed_short;
      span(0, t, t + close, any_missing ? WhatIfSpanKind::short_step : WhatIfSpanKind::work);
      window.emplace_back(done, latest);
      while (window.size() > static_cast<size_t>(kDeadlineMedianOf) + 1) window.pop_front();
      steady = !any_missing && !leader_silent && returning.empty() && close == latest &&
               window.size() == static_cast<size_t>(kDeadlineMedianOf) + 1 &&
               std::all_of(window.begin(), window.end(), [&](const auto& w) { return w.second == latest; });
      if (steady) steady_close = close, steady_budget = adapted_budget(window, budget), steady_key = state_key(t);
      t += close;
      ++done;
      if (checkpoint_at(done)) {
        if (join_by(t) >= 0 && done < in_.steps) drop_failed(gone_);
        const double went_on = join_at_checkpoint(t, done);
        if (went_on != t) {  // a new job: its leader measures afresh from the new plan's step
          steady = false;
          units = deadline_units();
          missed.assign(units.size(), 0), failed.assign(units.size(), false);
          gone_.assign(phase_.ids.size(), false);
          leader = 0;
          window.clear(), returning.clear();
          budget = phase_.plan.predicted.step_seconds * (1 + in_.deadline_slack);
        }
        t = went_on;
      }
    }
    // The job's end is collective (comm/deadline_reduce's finish hears from every member):
    // a rank still stopped then is waited for, and caught up at no charge.
    for (const WhatIfEvent& e : events_) {
      const int r = phase_.index_of(e.rank);
      if (e.kind == WhatIfKind::stall && e.at_s < t && r >= 0 && active(r) && !gone_[static_cast<size_t>(r)])
        t = std::max(t, e.at_s + e.for_s);
    }
    out_.samples_dropped = dropped;
    finish(t, in_.steps * in_.planner.global_batch - dropped);
  }

  // Rounds of H job steps; each group's clock runs on its own (see what_if.h).
  void run_local() {
    int64_t done = 0, checkpoint = 0;
    double since = 0, exchange_ready = 0;  // the end of the previous round on every group
    std::vector<double> clock(phase_.plan.local->groups.size(), 0.0);
    // Per group, of its previous round: late by an event (held in it, or in an earlier
    // round and not waited for since: a group held by less than a round stays behind the
    // others by the hold, unseen, until they wait for it), and the samples it took.
    std::vector<bool> late(clock.size(), false), waited_for(clock.size(), false);
    std::vector<int64_t> round_samples(clock.size(), 0);
    // The late rounds that ended after a group's end of its next round (`ends`): waited for.
    const auto count_waits = [&](const std::vector<double>& ends, const std::vector<double>& ready_at) {
      waited_for.assign(ready_at.size(), false);
      for (size_t h = 0; h < ready_at.size(); ++h) {
        if (!late[h]) continue;
        waited_for[h] = std::any_of(ends.begin(), ends.end(),
                                    [&](double e) { return e < ready_at[h] && !same_time(e, ready_at[h]); });
        if (waited_for[h]) out_.samples_waited_for += round_samples[h], ++out_.rounds_waited_for;
      }
    };
    while (done < in_.steps) {
      // The round's split: the plan's, or a re-split in force at its start (settle_clock).
      round_start_ = *std::min_element(clock.begin(), clock.end());
      const StepParts& at_start = parts(round_start_);
      const std::shared_ptr<const Plan> round_plan = at_start.plan;
      const Plan& plan = round_plan ? *round_plan : phase_.plan;
      const int64_t round = std::min<int64_t>(plan.local->inner_steps, in_.steps - done);
      std::vector<double> next(clock.size()), ends(clock.size()), works(clock.size()), starts(clock.size()),
          reach(clock.size());
      std::vector<bool> held_now(clock.size(), false);
      std::vector<int64_t> samples_now(clock.size(), 0);
      int failed = -1;
      double fail_from = 0;
      for (size_t g = 0; g < clock.size(); ++g) {
        const StepParts& p = parts(clock[g]);
        const int64_t batches = batches_in_round(plan, static_cast<int>(g), round);
        const double work = static_cast<double>(batches) * p.group_steps[g];
        // The samples of those inner steps: the first n_g mod H_g one more (inner_step_samples).
        const int64_t n = plan.local->round_samples[g], h = plan.local->group_steps[g];
        const int64_t larger = std::min(batches, n % h);
        samples_now[g] = larger * (n / h + 1) + (batches - larger) * (n / h);
        // The exchange of the round before is finished D job steps into this one: the
        // group's steps before that run without it, the rest after it (D = H: all before,
        // the wait at the round's end).
        const int64_t delay = std::min<int64_t>(plan.local->outer_delay, round);
        const double before = delay < round ? static_cast<double>(batches_in_round(plan, static_cast<int>(g), delay)) *
                                                  p.group_steps[g]
                                            : work;
        const double start = std::max(clock[g], exchange_ready - before);
        reach[g] = clock[g] + before;
        double end = start + work;
        for (int r : group_ranks(plan, static_cast<int>(g))) end = std::max(end, held_end(r, start, work));
        if (const int f = failure_before(end); f >= 0 && (failed < 0 || events_[static_cast<size_t>(f)].at_s <
                                                                              events_[static_cast<size_t>(failed)].at_s)) {
          failed = f;
          fail_from = clock[g];
        }
        held_now[g] = (end > start + work && !same_time(end, start + work)) ||
                      (batches > 0 && p.group_steps[g] > p.plain_group_steps[g] &&
                       !same_time(p.group_steps[g], p.plain_group_steps[g]));
        ends[g] = end;
        starts[g] = start;
        works[g] = start + work;
        next[g] = end + p.round_extra;
      }
      if (failed >= 0) {
        const double at = std::max(events_[static_cast<size_t>(failed)].at_s, fail_from);
        for (size_t g = 0; g < clock.size(); ++g) span(static_cast<int>(g), clock[g], at, WhatIfSpanKind::work);
        const double go_on = restart(failed, fail_from, since, done, checkpoint);
        since = exchange_ready = go_on;
        clock.assign(phase_.plan.local->groups.size(), go_on);
        late.assign(clock.size(), false);
        round_samples.assign(clock.size(), 0);
        continue;
      }
      count_waits(reach, clock);
      // The wait (drawn at the round's start: the clock moves as if the steps before D
      // waited too), the inner steps, the hold, the outer pass. A wait for a group late by
      // an event is drawn as one; the waits of the plan's own imbalance are part of its rounds.
      const bool event_wait = std::find(waited_for.begin(), waited_for.end(), true) != waited_for.end();
      for (size_t g = 0; g < clock.size(); ++g) {
        const int lane = static_cast<int>(g);
        span(lane, clock[g], starts[g], event_wait ? WhatIfSpanKind::waiting : WhatIfSpanKind::work);
        span(lane, starts[g], works[g], WhatIfSpanKind::work);
        span(lane, works[g], ends[g], WhatIfSpanKind::held);
        span(lane, ends[g], next[g], WhatIfSpanKind::work);
      }
      for (size_t g = 0; g < clock.size(); ++g) late[g] = held_now[g] || (late[g] && !waited_for[g]);
      clock = next;
      round_samples = samples_now;
      exchange_ready = *std::max_element(clock.begin(), clock.end());
      const int64_t before = done;
      done += round;
      // A checkpoint is taken where the round crosses a multiple of checkpoint.every.
      if (in_.checkpoint_every > 0 && done / in_.checkpoint_every > before / in_.checkpoint_every) {
        checkpoint = done;
        since = exchange_ready;
        const double go_on = join_at_checkpoint(exchange_ready, done);
        if (go_on != exchange_ready) {
          since = exchange_ready = go_on;
          clock.assign(phase_.plan.local->groups.size(), go_on);
          late.assign(clock.size(), false);
          round_samples.assign(clock.size(), 0);
        }
      }
    }
    // The final flush waits for every group's last round.
    count_waits(clock, clock);
    if (out_.rounds_waited_for > 0)
      out_.notes.push_back(std::to_string(out_.rounds_waited_for) + " group rounds held by an event were waited for at " +
                           "the exchange (" + std::to_string(out_.samples_waited_for) +
                           " samples, applied late in time, not in rounds)");
    finish(exchange_ready, in_.steps * in_.planner.global_batch);
  }

  const WhatIfInput& in_;
  Policy policy_;
  Phase phase_;
  std::vector<WhatIfEvent> events_;
  std::vector<bool> used_;
  std::vector<int> finish_points_;  // per event: sync's log exchanges finished since an idle rank's stall began
  bool sync_play_ = false;          // run_sync plays: sync, and deadline's pure pipeline
  // Under deadline, the phase's ranks failed and left out for good (no restart): a link
  // event to one changes no step.
  std::vector<bool> gone_;
  bool has_links_ = false;
  std::map<std::string, StepParts> cache_;
  std::map<std::pair<int, size_t>, double> settle_;  // (phase version, slow event): settle_time
  double round_start_ = -1;  // local: the start of the round being played (settle_clock)
  int joined_ = 0;
  bool record_ = false;   // the timeline: only for the play with the events
  std::vector<int> last_;  // per lane, its last span in out_.timeline (-1: none)
  PolicyOutcome out_;
};

}  // namespace

WhatIfResult run_what_if(const WhatIfInput& in) {
  WhatIfResult result;
  result.steps = in.steps;
  result.global_batch = in.planner.global_batch;
  const auto costs = std::make_shared<const BlockCosts>(in.planner.costs);
  const auto cluster = std::make_shared<const ClusterModel>(in.planner.cluster);
  for (Policy policy : {Policy::sync, Policy::deadline, Policy::local}) {
    PolicyOutcome refused;
    refused.policy = policy;
    Phase start;
    try {
      const auto shown = std::find_if(in.plans.begin(), in.plans.end(), [&](const Plan& p) { return policy_of(p) == policy; });
      start.plan = shown != in.plans.end() ? *shown : plan_for_policy(in.planner, policy, in.local_steps);
    } catch (const Error& e) {
      refused.refused = e.what();
      result.policies.push_back(refused);
      continue;
    }
    start.costs_ptr = costs;
    start.cluster_ptr = cluster;
    std::vector<int> ids(cluster->ranks.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    start.set_ids(std::move(ids));
    const PolicyOutcome plain = Play(in, policy, start, false).run();
    PolicyOutcome out = Play(in, policy, start, true).run();
    out.baseline_seconds = plain.seconds;
    out.lost_seconds = out.seconds - plain.seconds;
    // Two plays that differ only in how their sums of thousands of steps round: none lost
    // (a join that changed nothing showed "-0.0 µs" and a note that the job ran faster).
    if (std::fabs(out.lost_seconds) <= 1e-9 * std::max(out.seconds, plain.seconds)) out.lost_seconds = 0;
    // The play waits a stall through; a job waits for a peer no longer than the timeout
    // (a 40 s stall under an 8 s timeout was shown as 40 s lost where the job ended).
    // Deadline rides a stall out, except in a pipeline, which it plays as sync does.
    const bool waits = policy != Policy::deadline || start.plan.stage_ranges.size() > 1;
    for (const WhatIfEvent& e : in.events)
      if (waits && e.kind == WhatIfKind::stall && in.peer_timeout_s > 0 && e.for_s > in.peer_timeout_s &&
          e.at_s < out.seconds)
        out.notes.push_back(e.spec + ": outlasts parallel.peer_timeout_s (" + number("%g", in.peer_timeout_s) +
                            " s): where this policy waits for rank " + std::to_string(e.rank) +
                            ", a job ends there with an error naming it; played through as a wait");
    result.policies.push_back(std::move(out));
  }
  return result;
}

}  // namespace ht::plan
