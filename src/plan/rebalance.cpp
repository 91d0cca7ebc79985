#include "plan/rebalance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/stats.h"
#include "core/units.h"
#include "plan/batch_split.h"
#include "plan/memory_fit.h"
#include "plan/planner.h"
#include "plan/rebalance_message.h"

namespace ht::plan {

namespace {

// The median seconds of a rank's steps, and under a CPU quota q at least the median CPU
// seconds / q.
double sustained(const std::vector<double>& wall, const std::vector<double>& cpu, const DeviceModel& d) {
  const double w = median(wall);
  if (d.cpu_quota <= 0 || d.cpu_quota >= 1 || cpu.empty()) return w;
  return std::max(w, median(cpu) / d.cpu_quota);
}

// Replica r's measured work per sample in its steps of `micro_batches` micro-batches: its
// slowest rank's, sustained (-1: fewer than kMinTrialSteps such steps on a rank).
double work_per_sample(const Plan& p, const ClusterModel& cluster, const std::vector<RankMeasure>& measured,
                       size_t r, int micro_batches) {
  double slowest = 0;
  for (int rank : p.layout.replicas[r]) {
    const auto k = static_cast<size_t>(rank);
    const RankMeasure& m = measured[k];
    std::vector<double> work, cpu;
    for (size_t i = 0; i < m.work_s.size() && i < m.micro_batches.size(); ++i)
      if (m.micro_batches[i] == micro_batches) {
        work.push_back(m.work_s[i]);
        if (i < m.work_cpu_s.size()) cpu.push_back(m.work_cpu_s[i]);
      }
    if (work.size() < static_cast<size_t>(kMinTrialSteps)) return -1;
    slowest = std::max(slowest, sustained(work, cpu.size() == work.size() ? cpu : std::vector<double>{},
                                          cluster.ranks[k]));
  }
  return slowest / static_cast<double>(p.layout.samples[r]);
}

// Every rank's shares and memory after the layout changed.
void recount_memory(Plan& p, const BlockCosts& costs) {
  sync_rank_shares(p);
  for (RankPlan& rp : p.ranks) rp.memory = rank_memory(p, costs, rp);
}

bool replica_fits(const Plan& p, size_t r) {
  return std::all_of(p.ranks.begin(), p.ranks.end(), [&](const RankPlan& rp) {
    return rp.replica != static_cast<int>(r) || rp.memory.total() <= rp.device.memory_bytes;
  });
}

double sum(const std::vector<double>& row, int begin, int end) {
  return std::accumulate(row.begin() + begin, row.begin() + end, 0.0);
}

// Replica r's shares set to `share`, micro-batches as first planned (at most the share).
void set_share(Plan& p, const Plan& original, size_t r, int64_t share) {
  p.layout.samples[r] = share;
  p.layout.micro_batches[r] =
      static_cast<int>(std::min<int64_t>(original.layout.micro_batches[r], share));
}

// The most samples replica r holds: every rank of it inside its memory.
int64_t replica_capacity(Plan p, const Plan& original, size_t r, const BlockCosts& costs) {
  auto fits = [&](int64_t share) {
    set_share(p, original, r, share);
    sync_rank_shares(p);
    for (int rank : p.layout.replicas[r]) {
      const RankPlan& rp = p.ranks[static_cast<size_t>(rank)];
      if (rank_memory(p, costs, rp).total() > rp.device.memory_bytes) return false;
    }
    return true;
  };
  int64_t lo = 1, hi = p.global_batch;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

BlockCosts calibrated_costs(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                            const std::vector<RankMeasure>& measured) {
  HT_CHECK(measured.size() == plan.ranks.size(), "calibrated_costs: ", measured.size(),
           " measurements for ", plan.ranks.size(), " ranks");
  HT_CHECK(cluster.ranks.size() == plan.ranks.size(), "calibrated_costs: a cluster of ", cluster.ranks.size(),
           " ranks for a plan of ", plan.ranks.size());
  BlockCosts out = costs;
  for (const RankPlan& rp : plan.ranks) {
    const auto k = static_cast<size_t>(rp.rank);
    const RankMeasure& m = measured[k];
    if (rp.replica < 0 || m.work_s.empty() || rp.samples <= 0) continue;
    // The model's time for the rank's work in a step: its micro-batches' fixed costs
    // plus its samples; both parts scale to what it measured.
    const double modelled =
        sum(costs.seconds_per_sample[k], rp.block_begin, rp.block_end) * static_cast<double>(rp.samples) +
        sum(costs.call_seconds[k], rp.block_begin, rp.block_end) * rp.micro_batches;
    const DeviceModel& d = cluster.ranks[k];
    const double work = sustained(m.work_s, m.work_cpu_s, d);
    if (d.cpu_quota > 0 && d.cpu_quota < 1 && !m.comm_cpu_s.empty()) {
      out.comm_overhead_seconds.resize(plan.ranks.size(), 0);
      out.comm_overhead_seconds[k] = median(m.comm_cpu_s) / d.cpu_quota;
    }
    if (work > 0 && modelled > 0) {
      for (double& s : out.seconds_per_sample[k]) s *= work / modelled;
      for (double& s : out.call_seconds[k]) s *= work / modelled;
    }
    // A sharded rank steps its part of the state: what it measured says nothing of a
    // rank that keeps none.
    if (rp.optimizer_shard <= 0) continue;
    const double step = sustained(m.optimizer_s, m.optimizer_cpu_s, d) / rp.optimizer_shard;
    const double modelled_step = sum(costs.step_seconds[k], rp.block_begin, rp.block_end);
    const double params = sum(costs.params, rp.block_begin, rp.block_end);
    for (int b = rp.block_begin; b < rp.block_end; ++b) {
      double& s = out.step_seconds[k][static_cast<size_t>(b)];
      if (modelled_step > 0) s *= step / modelled_step;
      else if (params > 0) s = step * costs.params[static_cast<size_t>(b)] / params;
    }
  }
  return out;
}

Plan resplit(const Plan& plan, const Plan& original, const BlockCosts& costs) {
  Plan p = plan;
  const size_t replicas = p.layout.replicas.size();
  std::vector<ReplicaCapacity> capacity(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    double slowest = 0, fixed = 0;
    for (int rank : p.layout.replicas[r]) {
      const RankPlan& rp = p.ranks[static_cast<size_t>(rank)];
      slowest = std::max(slowest, sum(costs.seconds_per_sample[static_cast<size_t>(rank)],
                                      rp.block_begin, rp.block_end));
      // Per step: its communication's CPU, and its calls' fixed part per micro-batch.
      fixed = std::max(fixed, comm_overhead_seconds(costs, static_cast<size_t>(rank)) +
                                  original.layout.micro_batches[r] *
                                      sum(costs.call_seconds[static_cast<size_t>(rank)], rp.block_begin, rp.block_end));
    }
    HT_CHECK(slowest > 0, "resplit: replica ", r, " has no cost");
    capacity[r] = {1 / slowest, replica_capacity(p, original, r, costs), fixed};
  }
  const std::vector<int64_t> shares = split_batch(p.global_batch, capacity);
  for (size_t r = 0; r < replicas; ++r) set_share(p, original, r, shares[r]);
  recount_memory(p, costs);
  return p;
}

Plan with_shares(const Plan& original, const std::vector<int64_t>& shares) {
  int64_t total = 0;
  for (int64_t n : shares) total += n;
  HT_CHECK(shares.size() == original.layout.replicas.size() && total == original.global_batch &&
               std::all_of(shares.begin(), shares.end(), [](int64_t n) { return n >= 1; }),
           "with_shares: ", shares.size(), " shares summing to ", total, " for ", original.layout.replicas.size(),
           " replicas; expected one of at least 1 per replica, summing to the global batch ", original.global_batch);
  Plan p = original;
  for (size_t r = 0; r < shares.size(); ++r) set_share(p, original, r, shares[r]);
  sync_rank_shares(p);
  return p;
}

Plan with_resumed_shares(const Plan& plan, const std::vector<int64_t>& shares, const std::vector<int>& micro_batches,
                         const BlockCosts& costs, const ClusterModel& cluster) {
  Plan p = with_shares(plan, shares);
  HT_CHECK(micro_batches.size() == shares.size(), micro_batches.size(), " micro-batch counts for ", shares.size(),
           " replicas; expected one per replica");
  for (size_t r = 0; r < shares.size(); ++r)
    HT_CHECK(shares[r] >= std::min(plan.layout.samples[r], kMinMicroBatchSamples), "replica ", r, "'s share of ",
             shares[r], " samples is below ", kMinMicroBatchSamples,
             ": a rank measured at so few samples is measured by its fixed costs, and the checks would not give it "
             "samples back should it be faster now");
  for (size_t r = 0; r < shares.size(); ++r) {
    HT_CHECK(micro_batches[r] >= p.layout.micro_batches[r] && micro_batches[r] <= shares[r], "replica ", r, "'s ",
             micro_batches[r], " micro-batches for its ", shares[r], " samples; expected ", p.layout.micro_batches[r],
             " (the plan's) to ", shares[r]);
    p.layout.micro_batches[r] = micro_batches[r];
  }
  recount_memory(p, costs);
  for (size_t r = 0; r < shares.size(); ++r)
    for (int rank : p.layout.replicas[r]) {
      const RankPlan& rp = p.ranks[static_cast<size_t>(rank)];
      HT_CHECK(rp.memory.total() <= rp.device.memory_bytes, "replica ", r, "'s ", shares[r], " samples in ",
               micro_batches[r], " micro-batches need ", format_bytes(rp.memory.total()), " on rank ", rank,
               ", which holds ", format_bytes(rp.device.memory_bytes));
    }
  predict_plan(p, costs, cluster);
  return p;
}

std::vector<double> seconds_per_sample_of(const Plan& plan, const BlockCosts& costs) {
  std::vector<double> out(plan.ranks.size(), 0.0);
  for (const RankPlan& rp : plan.ranks)
    if (rp.replica >= 0)
      out[static_cast<size_t>(rp.rank)] = sum(costs.seconds_per_sample[static_cast<size_t>(rp.rank)], rp.block_begin,
                                              rp.block_end);
  return out;
}

double measured_step_seconds(const std::vector<RankMeasure>& measured) {
  double slowest = 0;
  for (const RankMeasure& m : measured) slowest = std::max(slowest, median(m.wall_s));
  return slowest;
}

bool drop_steps_before_speed_change(RankMeasure& m, size_t recent, size_t least) {
  const size_t n = m.work_s.size();
  if (recent < std::max<size_t>(least, 1) || n < recent + kMinSpeedSteps) return false;
  const auto cut = static_cast<std::ptrdiff_t>(n - recent);
  const double before = median(std::vector<double>(m.work_s.begin(), m.work_s.begin() + cut));
  const double after = median(std::vector<double>(m.work_s.begin() + cut, m.work_s.end()));
  if (!(before > 0) || std::abs(after - before) <= kSpeedChange * before) return false;
  for (std::vector<double>* v : measure_series(m))
    if (v->size() == n) v->erase(v->begin(), v->begin() + cut);
  return true;
}

std::vector<double> measured_reduce_seconds(const Plan& plan, const std::vector<RankMeasure>& measured) {
  HT_CHECK(measured.size() == plan.ranks.size(), "measured_reduce_seconds: ", measured.size(),
           " measurements for ", plan.ranks.size(), " ranks");
  std::vector<double> out;
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    size_t steps = SIZE_MAX;
    for (const auto& replica : plan.layout.replicas)
      steps = std::min(steps, measured[static_cast<size_t>(replica[s])].reduce_s.size());
    // Aligned from the end: every window ends at the check's step, and one may be shorter
    // (drop_steps_before_speed_change trims a rank's alone).
    std::vector<double> least(steps, -1);
    for (const auto& replica : plan.layout.replicas) {
      const std::vector<double>& mine = measured[static_cast<size_t>(replica[s])].reduce_s;
      for (size_t k = 0; k < steps; ++k) {
        const double t = mine[mine.size() - steps + k];
        least[k] = least[k] < 0 ? t : std::min(least[k], t);
      }
    }
    out.push_back(least.empty() ? -1 : median(std::move(least)));
  }
  return out;
}

ShareTuner::ShareTuner(Plan original, BlockCosts costs, ClusterModel cluster, bool move_shares,
                       std::optional<Plan> all_ranks, bool micro_batch_trials)
    : original_(std::move(original)),
      costs_(std::move(costs)),
      cluster_(std::move(cluster)),
      move_shares_(move_shares),
      micro_batch_trials_(micro_batch_trials) {
  for (const RankPlan& r : original_.ranks)
    if (static_cast<size_t>(r.rank) < cluster_.ranks.size())
      cores_shared_ = cores_shared_ || cluster_.ranks[static_cast<size_t>(r.rank)].cores_shared;
  if (all_ranks && has_idle_ranks(original_) && move_shares_ && replicates_whole_model(original_) &&
      replicates_whole_model(*all_ranks) && all_ranks->world_size == original_.world_size &&
      all_ranks->predicted.step_seconds <= (1 + kIdleTrialMargin) * original_.predicted.step_seconds)
    all_ranks_ = std::move(all_ranks);
}

Rebalance ShareTuner::check(const Plan& current, const std::vector<RankMeasure>& measured) {
  // The change a check judges is the one this tuner returned last: under deadline another
  // rank's tuner may have decided the shares running now (it led meanwhile), and judging
  // those against this tuner's measured step before its own change would undo or keep
  // the wrong one.
  if (before_change_ && current.layout.samples != returned_) before_change_.reset();
  Rebalance out = check_once(current, measured);
  if (out.changed) returned_ = out.plan.layout.samples;
  return out;
}

bool ShareTuner::speeds_moved(const Plan& current, const BlockCosts& calibrated) const {
  const std::vector<double> now = seconds_per_sample_of(current, calibrated);
  for (size_t r = 0; r < now.size() && r < per_sample_at_change_.size(); ++r) {
    const double a = now[r], b = per_sample_at_change_[r];
    if (a > 0 && b > 0 && std::max(a / b, b / a) > 1 + kSpeedChange) return true;
  }
  return false;
}

namespace {

// Whether every replica's share moves the same way (up, down or not at all) from `now`
// to `a` as to `b`.
bool same_moves(const std::vector<int64_t>& now, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != now.size() || b.size() != now.size()) return false;
  auto sign = [](int64_t d) { return (d > 0) - (d < 0); };
  for (size_t r = 0; r < now.size(); ++r)
    if (sign(a[r] - now[r]) != sign(b[r] - now[r])) return false;
  return true;
}

}  // namespace

Rebalance ShareTuner::check_once(const Plan& current, const std::vector<RankMeasure>& measured) {
  // A re-split held back on shared cores counts only where the very next check asks again.
  std::vector<int64_t> asked = std::move(asked_);
  const int asked_in_a_row = std::exchange(asked_in_a_row_, 0);
  asked_.clear();
  const BlockCosts calibrated = calibrated_costs(current, costs_, cluster_, measured);
  const std::vector<double> reduce = measured_reduce_seconds(current, measured);
  Rebalance out;
  out.plan = current;
  predict_plan(out.plan, calibrated, cluster_, reduce);
  out.current_step_s = out.plan.predicted.step_seconds;
  out.measured_step_s = measured_step_seconds(measured);

  if (before_change_) {
    std::optional<Plan> before = std::move(before_change_);
    before_change_.reset();
    // A rank whose own time per sample moved by more than kSpeedChange since the change
    // (a card that throttles, a slowed rank) made the step slower, not the change: the
    // shares move on from the speeds measured now instead (undone, the change was kept
    // from the ranks that no longer had the speed it was made for, five checks long).
    const bool speed_changed =
        before->layout.replicas == current.layout.replicas && speeds_moved(current, calibrated);
    if (out.measured_step_s > (1 + kRebalanceMinGain) * step_before_change_ && !speed_changed) {
      per_sample_at_change_ = seconds_per_sample_of(current, calibrated);  // the speeds the settling is of
      rejected_.insert(current.layout.samples);
      out.relayout = before->layout.replicas != current.layout.replicas;
      if (out.relayout) original_ = std::move(*original_before_trial_);
      out.plan = std::move(*before);
      out.changed = out.reverted = true;
      settle_ = kSettleChecks;
      return out;
    }
  }
  if (all_ranks_) {  // the ranks left idle, with the planner's shares for them
    Plan next = std::move(*all_ranks_);
    all_ranks_.reset();
    predict_plan(next, calibrated, cluster_);
    before_change_ = out.plan;
    step_before_change_ = out.measured_step_s;
    original_before_trial_ = std::move(original_);
    original_ = next;
    out.plan = std::move(next);
    out.changed = out.relayout = true;
    return out;
  }
  if (trial_) {  // kept when the tried count's steps were faster per sample, else undone
    const MicroBatchTrial t = *trial_;
    trial_.reset();
    const size_t r = t.replica;
    const int tried = current.layout.micro_batches[r];
    const double old_s = work_per_sample(current, cluster_, measured, r, t.micro_batches_before);
    const double tried_s = work_per_sample(current, cluster_, measured, r, tried);
    out.trial_seconds_per_sample = {old_s, tried_s};
    out.plan.layout.alternate_micro_batches.clear();
    out.changed = true;  // the alternation ends either way
    if (old_s <= 0 || tried_s <= 0 || tried_s >= (1 - kRebalanceMinGain) * old_s) {
      // 4x as many slower: 2x may still gain, the once; 2x slower: settled.
      finer_[r] = tried == 4 * t.micro_batches_before ? 2 : 1;
      out.plan.layout.micro_batches[r] = t.micro_batches_before;
      recount_memory(out.plan, costs_);
      predict_plan(out.plan, calibrated, cluster_, reduce);
      out.reverted = true;
      return out;
    }
    original_.layout.micro_batches[r] = tried;
  }
  // Settling after an undone change, unless a rank's speed has moved since: then the
  // shares follow it now (a card that throttled during the settling waited five checks).
  if (settle_ > 0 && !speeds_moved(current, calibrated)) {
    --settle_;
    return out;
  }
  settle_ = 0;
  if (!move_shares_) return out;
  const Plan& now = out.plan;  // the current plan, its micro-batch trial ended
  if (now.layout.replicas.size() >= 2) {
    Plan next = resplit(now, original_, calibrated);
    if (next.layout.samples != now.layout.samples && !rejected_.count(next.layout.samples)) {
      predict_plan(next, calibrated, cluster_, reduce);
      const double gain = next.layout.samples == left_ ? kRebalanceMinGain : kResplitMinGain;
      if (next.predicted.step_seconds < (1 - gain) * out.current_step_s) {
        const int in_a_row = same_moves(now.layout.samples, asked, next.layout.samples) ? asked_in_a_row + 1 : 1;
        if (cores_shared_ && in_a_row < kSharedCoreChecks) {
          asked_ = next.layout.samples;
          asked_in_a_row_ = in_a_row;
          return out;  // nor a micro-batch trial, judged on the speeds this check doubts
        }
        left_ = now.layout.samples;
        before_change_ = out.plan;
        step_before_change_ = out.measured_step_s;
        per_sample_at_change_ = seconds_per_sample_of(now, calibrated);
        out.plan = std::move(next);
        out.changed = true;
        return out;
      }
    }
  }
  if (!micro_batch_trials_ || now.stage_ranges.size() != 1) return out;
  // The shares stay: try the replica with the largest micro-batches in smaller ones.
  auto factor = [&](size_t r) {  // how many times as many micro-batches to try (1: none)
    const int64_t per_micro_batch = now.layout.samples[r] / now.layout.micro_batches[r];
    const int most = finer_.count(r) ? finer_.at(r) : 4;
    for (int f = most; f > 1; f /= 2)
      if (per_micro_batch >= f * kMinMicroBatchSamples) return f;
    return 1;
  };
  std::optional<size_t> widest;
  for (size_t r = 0; r < now.layout.replicas.size(); ++r)
    if (factor(r) > 1 && (!widest || now.layout.samples[r] * now.layout.micro_batches[*widest] >
                                         now.layout.samples[*widest] * now.layout.micro_batches[r]))
      widest = r;
  if (!widest) return out;
  const size_t r = *widest;
  Plan next = now;
  const int m = now.layout.micro_batches[r];
  next.layout.micro_batches[r] = m * factor(r);
  next.layout.alternate_micro_batches.assign(now.layout.replicas.size(), 0);
  next.layout.alternate_micro_batches[r] = m;
  recount_memory(next, costs_);
  if (!replica_fits(next, r)) {
    finer_[r] = 1;
    return out;
  }
  predict_plan(next, calibrated, cluster_, reduce);
  trial_ = MicroBatchTrial{r, m};
  out.plan = std::move(next);
  out.changed = true;
  return out;
}

}  // namespace ht::plan
