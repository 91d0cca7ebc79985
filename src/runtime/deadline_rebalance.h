// Rebalancing under parallel.sync deadline, on a one-stage plan. The steps never wait
// for every rank, so no exchange may gather the measures as Rebalancer's consult does:
// each member's contributions carry the measures of its last step (comm::DeadlineOptions::
// on_report), the leader keeps a window per member of the steps it ran at its current
// share, and every `every` steps, once every member has kMinSteps in its window, asks
// the decision made under sync (plan::ShareTuner, with no micro-batch trials and no
// ranks brought in, bound by the command). A re-split goes out in the next step's record
// and every rank runs it from the step after (comm::DeadlineReduce applies it to its
// chain; the executor takes it). A window keeps its member's last kWindowChecks checks'
// worth of steps (those since the last check alone where its speed moved:
// plan::drop_steps_before_speed_change); one whose member has sent none for that span
// of steps (stopped) is emptied, and no re-split is made while a window is short: a
// stop is for the deadline to ride out, not a change of speed (nor is the row of the
// step a stop fell in, longer than that span, kept, unless the member's next row is as
// long: then it is that slow), and the windows start afresh when it sends again. Rows
// count from the step they arrive in. A member too slow to be
// waited for still sends its measures with its late contributions, and is re-split: on
// fewer than kMinSteps rows, once the windows have had 2 x kMinSteps steps to fill.
// Windows start afresh when the shares change (whoever
// decided it) and when this rank leads again after another has.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "plan/rebalance.h"

namespace ht::runtime {

// The planner's decision (plan::ShareTuner::check, bound to the job's costs, cluster and
// first plan; the runtime does not link the planner, the command that planned the job
// supplies it).
using RebalanceFn = std::function<plan::Rebalance(const plan::Plan& current,
                                                  const std::vector<plan::RankMeasure>& measured)>;

class DeadlineRebalancer {
 public:
  // Steps of a member measured at its current share that a check needs.
  static constexpr size_t kMinSteps = 3;
  // `first`: the plan as the job started (its micro-batch counts stay); `world_rank_of[m]`
  // is member m's world rank; `total_steps`: the job's, past which no re-split would run.
  DeadlineRebalancer(RebalanceFn decide, int64_t every, plan::Plan first, std::vector<int> world_rank_of,
                     int64_t total_steps);

  // One step's measures as a member sends them: its work (loading, forward, backward),
  // optimiser step, whole step and reduction in seconds, its CPU seconds in the work, the
  // optimiser step and the communication, its micro-batches and samples.
  static std::vector<double> row(double work_s, double optimizer_s, double wall_s, double reduce_s, double work_cpu_s,
                                 double optimizer_cpu_s, double comm_cpu_s, int micro_batches, int64_t samples);
  // On the leader: member `member`'s row, sent with its contribution to `step`; kept when
  // it ran at its share in `shares` (the shares in force), else dropped (a step of the
  // shares before a re-split). It counts from the step this rank closes next, where it
  // arrived (a slow member's contribution, and its row, may arrive many steps late).
  void report(int member, int64_t step, std::span<const double> row, const std::vector<int64_t>& shares);
  // On the leader, after closing step `step` (`shares` in force from the next): the
  // shares from step + 2 on, or nothing to keep them (always nothing within three steps
  // of the end: a re-split needs a step to run in).
  std::vector<int64_t> decide(int64_t step, const std::vector<int64_t>& shares);
  // The job's first plan with `shares` (its micro-batch counts, at most each share).
  plan::Plan plan_with(const std::vector<int64_t>& shares) const { return plan::with_shares(first_, shares); }

 private:
  RebalanceFn decide_;
  int64_t every_;
  int64_t total_steps_;
  plan::Plan first_;
  std::vector<int> world_rank_of_;
  void restart(const std::vector<int64_t>& shares, int64_t step);  // empty windows, of `shares`, from `step`
  std::vector<plan::RankMeasure> window_;  // per member
  void keep(size_t member, std::span<const double> row);  // into the member's window
  std::vector<std::vector<int64_t>> steps_;  // per member, the step each row arrived in
  std::vector<std::vector<double>> held_;    // per member, a row past the stop bound, until its next
  std::vector<bool> away_;                   // per member, its window emptied as away, until it sends again
  std::vector<int64_t> window_shares_;       // the shares the windows' rows ran
  int64_t last_close_ = -2;                  // the last step this rank closed
  int64_t restarted_at_ = 0;                 // the step the windows last started afresh at
  static constexpr size_t kRecentWalls = 32;
  std::vector<double> recent_walls_;         // the wall of the last rows kept, any member's
};

}  // namespace ht::runtime
