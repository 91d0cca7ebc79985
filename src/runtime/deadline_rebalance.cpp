#include "runtime/deadline_rebalance.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/stats.h"
#include "plan/rebalance_message.h"

namespace ht::runtime {

namespace {
constexpr size_t kRowSize = 9;
// As Rebalancer's: the steps of at most this many checks (a 0.2 rank's median step moves
// by about 5% between windows of 10 steps).
constexpr int64_t kWindowChecks = 3;
}  // namespace

DeadlineRebalancer::DeadlineRebalancer(RebalanceFn decide, int64_t every, plan::Plan first,
                                       std::vector<int> world_rank_of, int64_t total_steps)
    : decide_(std::move(decide)),
      every_(decide_ ? every : 0),
      total_steps_(total_steps),
      first_(std::move(first)),
      world_rank_of_(std::move(world_rank_of)),
      window_(world_rank_of_.size()),
      steps_(world_rank_of_.size()),
      held_(world_rank_of_.size()),
      away_(world_rank_of_.size(), false) {
  HT_CHECK(world_rank_of_.size() == first_.layout.replicas.size(), "deadline rebalancing: ", world_rank_of_.size(),
           " members for a plan of ", first_.layout.replicas.size(), " replicas; expected one member per replica");
}

std::vector<double> DeadlineRebalancer::row(double work_s, double optimizer_s, double wall_s, double reduce_s,
                                            double work_cpu_s, double optimizer_cpu_s, double comm_cpu_s,
                                            int micro_batches, int64_t samples) {
  return {work_s,     optimizer_s, wall_s, reduce_s, work_cpu_s, optimizer_cpu_s, comm_cpu_s,
          static_cast<double>(micro_batches), static_cast<double>(samples)};
}

void DeadlineRebalancer::restart(const std::vector<int64_t>& shares, int64_t step) {
  for (plan::RankMeasure& w : window_) w = {};
  for (std::vector<int64_t>& s : steps_) s.clear();
  // A held row (a step past the stop bound, waiting for the member's next) stands where
  // the member's share stays: a member slowed 40x sends a row every 80 steps or so, and
  // the checks' re-splits of the others' shares in between had it wait for two rows in a
  // row without one, so that it was re-split in one run and never in another.
  for (size_t m = 0; m < held_.size(); ++m)
    if (!held_[m].empty() && held_[m][8] != static_cast<double>(shares[m])) held_[m].clear();
  window_shares_ = shares;
  restarted_at_ = step;
}

void DeadlineRebalancer::report(int member, int64_t /*step*/, std::span<const double> row,
                                const std::vector<int64_t>& shares) {
  // A row of another size (not this build's) or of a member out of range says nothing.
  if (every_ <= 0 || row.size() != kRowSize || member < 0 || static_cast<size_t>(member) >= window_.size() ||
      shares.size() != window_.size() || row[8] != static_cast<double>(shares[static_cast<size_t>(member)]) ||
      row[2] <= 0)
    return;
  // Another leader's re-split: rows of the old shares. The windows start at this rank's
  // next step (a late row's own step may be far older).
  if (shares != window_shares_) restart(shares, last_close_ + 1);
  const auto m = static_cast<size_t>(member);
  // A step longer than the windows' span of the job's steps may have held a stop
  // (SIGSTOP, a stalled host), and the row of the step the stop fell in, sent once the
  // member is back, is not its speed: kept, one such row (5 s among 10 ms ones) was a
  // sparse member's whole window, and the check moved its share to almost nothing. Such
  // a row is held until the member's next: another as long says the member is that slow
  // (a rank slowed 40x), and both count; a shorter one, that it was a stop, and the held
  // row is dropped. The job's step is the median wall of the last rows of any member.
  // (The median, a copy and a sort, only for a row past the bound over the least wall.)
  const double span = static_cast<double>(kWindowChecks * every_);
  const bool long_step = recent_walls_.size() >= kMinSteps &&
                         row[0] > span * *std::min_element(recent_walls_.begin(), recent_walls_.end()) &&
                         row[0] > span * median(recent_walls_);
  if (!long_step) {
    held_[m].clear();
  } else if (held_[m].empty()) {
    held_[m].assign(row.begin(), row.end());
    return;
  } else {
    keep(m, std::exchange(held_[m], {}));
  }
  keep(m, row);
}

void DeadlineRebalancer::keep(size_t m, std::span<const double> row) {
  // A member back from away: the others' rows of the stretch it was away ran beside a
  // stopped rank (on one host, with its core's share free), and a check that mixed them
  // with its first rows back moved shares that the next check moved back (after a 5 s
  // stop of a 0.2 rank of the CNN, the steps ran 10-20% slower for some 50 steps). The
  // windows start afresh from its return.
  if (away_[m]) {
    away_[m] = false;
    restart(window_shares_, last_close_ + 1);
  }
  recent_walls_.push_back(row[2]);
  if (recent_walls_.size() > kRecentWalls) recent_walls_.erase(recent_walls_.begin());
  plan::RankMeasure& w = window_[m];
  // A row counts from the step it arrived in, not the one it was for: a member too slow
  // to be waited for sends its row with a contribution many steps late, and counted by
  // that step its rows were never "since the last check", nor recent enough not to be
  // taken for a stopped member's.
  steps_[m].push_back(last_close_ + 1);
  w.work_s.push_back(row[0]);
  w.optimizer_s.push_back(row[1]);
  w.wall_s.push_back(row[2]);
  w.reduce_s.push_back(row[3]);
  w.work_cpu_s.push_back(row[4]);
  w.optimizer_cpu_s.push_back(row[5]);
  w.comm_cpu_s.push_back(row[6]);
  w.micro_batches.push_back(row[7]);
  const auto most = static_cast<size_t>(kWindowChecks * every_);
  std::vector<int64_t>& s = steps_[m];
  if (s.size() > most) s.erase(s.begin(), s.end() - static_cast<std::ptrdiff_t>(most));
  for (std::vector<double>* v : plan::measure_series(w))
    if (v->size() > most) v->erase(v->begin(), v->end() - static_cast<std::ptrdiff_t>(most));
}

std::vector<int64_t> DeadlineRebalancer::decide(int64_t step, const std::vector<int64_t>& shares) {
  if (every_ <= 0 || shares.size() != window_.size()) return {};
  // Leading again after another rank led: what this rank measured before is of another
  // spell (and its tuner's last change may not be the one running).
  if (step != last_close_ + 1 || shares != window_shares_) restart(shares, step);
  last_close_ = step;
  if ((step + 1) % every_ != 0 || step + 3 >= total_steps_) return {};
  // A member whose last row is older than the windows' span has sent none since: it is
  // away (stopped), and its window is emptied. One that still sends, however slowly (a
  // rank too slow to be waited for sends a contribution every few of the others' steps,
  // and an empty word after each catch-up), keeps its rows, older ones too: they are
  // what would move samples off it.
  const int64_t oldest = step - kWindowChecks * every_;
  for (size_t m = 0; m < window_.size(); ++m) {
    if (steps_[m].empty() || steps_[m].back() >= oldest) continue;
    steps_[m].clear();
    window_[m] = {};
    away_[m] = true;
  }
  // A member that sent fewer than kMinSteps rows, but some, while the windows had
  // 2 x kMinSteps steps to fill, is too slow to send more: a rank slowed 3x, left out of
  // most steps, sent one row in the 8 steps after a re-split, and one slowed 16x one in
  // 16 to 32 steps. It is judged on what it sent, where a short window would block the
  // check (the 16x one was never re-split) and its rows of before the slow-down (the
  // speed test needs kMinSteps recent ones to drop them) would hold its median. A
  // stopped member's rows are its speed before the stop, which moves nothing off it.
  const bool filled = step - restarted_at_ >= static_cast<int64_t>(2 * kMinSteps);
  for (size_t m = 0; m < window_.size(); ++m) {
    std::vector<int64_t>& s = steps_[m];
    const auto recent = static_cast<size_t>(
        std::count_if(s.begin(), s.end(), [&](int64_t at) { return at > step - every_; }));
    const bool sparse = filled && !s.empty() && recent < kMinSteps;
    // Whose speed changed since the last check is judged on its steps since then.
    if (plan::drop_steps_before_speed_change(window_[m], recent, sparse ? 1 : plan::kMinSpeedSteps))
      s.erase(s.begin(), s.end() - static_cast<std::ptrdiff_t>(recent));
    if (window_[m].wall_s.size() < kMinSteps && !sparse) return {};
  }
  std::vector<plan::RankMeasure> measured(first_.ranks.size());
  for (size_t m = 0; m < window_.size(); ++m) measured[static_cast<size_t>(world_rank_of_[m])] = window_[m];
  const plan::Rebalance d = decide_(plan::with_shares(first_, shares), measured);
  // A replica left no sample would be an idle one, which a re-split by shares alone does
  // not make (the ranks would have to leave the reduction).
  const std::vector<int64_t>& next = d.plan.layout.samples;
  if (!d.changed || d.relayout || next == shares ||
      std::any_of(next.begin(), next.end(), [](int64_t n) { return n < 1; }) ||
      d.plan.layout.micro_batches != plan::with_shares(first_, next).layout.micro_batches)
    return {};
  // The steps measured so far ran the old shares; so do those until the record carrying
  // these is applied (which restarts the windows again): none of them counts.
  restart(shares, step);
  return next;
}

}  // namespace ht::runtime
