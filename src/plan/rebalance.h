// Rebalancing while training: what every rank measured over a window of steps becomes
// calibrated costs, a new split of the global batch over the replicas, and the
// simulator's prediction for it. The layout stays (ranks, stages, layer ranges,
// micro-batch counts, memory strategies); only the replicas' shares move, so parameters
// stay where they are and the step's gradient is still the global batch's mean.
//
// Why: a probe measures each block alone for a fraction of a second; in the job the same
// rank runs another batch size beside other processes, and under a CPU quota its speed
// depends on how long it waits between bursts. LB-BSP's observation holds here: the
// shares that balance a real job are found by measuring the job.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"

namespace ht::plan {

// A change is undone when the measured step got this much slower, and a micro-batch
// count is kept when its steps measured this much faster per sample.
inline constexpr double kRebalanceMinGain = 0.03;
// A re-split is taken when the simulator, calibrated on the window, predicts at least
// this gain; a re-split back to the shares the last one left needs kRebalanceMinGain, so
// that noise does not move samples back and forth. Calibrated on CPU time, a rank's
// work is steady to about 1% (the CNN's 0.8 rank: 37.9-39.0 ms over 39 steps), and at
// 3% the CNN's job settled on 69/32/14/13 with the 0.2 ranks 2-4 ms idle a step, where
// 68/32/14/14 was predicted 1.3% faster.
inline constexpr double kResplitMinGain = 0.01;
// After undoing a change that made the step slower, this many checks pass before the
// next change is tried: each try costs a window at the slower split.
inline constexpr int kSettleChecks = 5;
// A change is not undone for a slower step when some rank's own time per sample (its
// calibrated cost) moved by more than this since the change: the rank's speed changed
// (a card throttled, a rank was slowed), which the next re-split follows. Undone, a
// re-split made just before a rank slowed 3x was blamed for the slow-down, and the
// shares moved off the slowed rank five checks late (docs/architecture.md). Likewise
// the checks of settling after an undone change end early when a speed moved so.
inline constexpr double kSpeedChange = 0.25;
// Where the cluster's CPU ranks share cores (DeviceModel::cores_shared), a re-split is
// taken only when two checks in a row asked for it, each replica's share moving the same
// way in both: the scheduler slows one rank and then another for tens of steps at a
// time, and a check's window sees whichever it slowed. Taken at the first check, four
// equal data-parallel ranks of the MLP on a 2-core machine made 73-78 changes in 100
// checks and ended at shares such as 57/19/26/26 (docs/architecture.md).
inline constexpr int kSharedCoreChecks = 2;
// Ranks the plan left idle are tried once, at the first check, when the plan over all
// ranks was predicted at most this much slower: the quick probe behind that choice is
// short and noisy (twice it left two CNN ranks idle on CPU quotas 0.8/0.4/0.2/0.2, and the
// job ran 1.4-1.6x the equal split on two ranks against about 2x on all four).
inline constexpr double kIdleTrialMargin = 0.25;
// The fewest samples a micro-batch trial leaves in a micro-batch (see ShareTuner).
inline constexpr int64_t kMinMicroBatchSamples = 8;
// The fewest steps of each count that judge a micro-batch trial (see ShareTuner).
inline constexpr int kMinTrialSteps = 3;

// One rank's steps in a window, each figure per step (empty: nothing measured, e.g. an
// idle rank). Medians over the steps are used: a rank under a CPU quota has steps that
// land in a stopped stretch of its period and take far longer than the rest.
struct RankMeasure {
  std::vector<double> work_s;       // loading, forward, backward and recomputation
  std::vector<double> optimizer_s;  // the optimiser step
  std::vector<double> wall_s;       // the whole step
  std::vector<double> reduce_s;     // ReduceGrads
  std::vector<double> work_cpu_s;       // CPU seconds of the process in the work
  std::vector<double> optimizer_cpu_s;  // and in the optimiser step (empty: not measured)
  std::vector<double> comm_cpu_s;       // and in the communication (empty: not measured)
  std::vector<double> micro_batches;    // the rank's micro-batch count (empty: not recorded)
};

// `costs` with every measured active rank's row scaled so that its stage's forward +
// backward per sample takes what it measured (median step), and its optimiser step likewise (spread
// over the stage's blocks by parameter count where the model had no step times). A rank
// under a CPU quota q (`cluster`) is charged at least its CPU time / q: a share small
// enough to fit in one burst of its period runs at a whole core's speed, which it cannot
// sustain (the MLP's 0.4 rank measured as fast as the 0.8 one and was given more samples
// than it, at a step of 9.6 ms against 5.5 planned). Likewise the CPU such a rank spends
// in its communication (copying messages in and out) is time its quota does not give its
// work: comm_overhead_seconds = median CPU / q, a fixed cost of its every step. A rank
// without a quota waits out its copies inside the measured all-reduce instead.
// Errors (ht::Error): a measurement per rank missing, or a cluster of another size.
BlockCosts calibrated_costs(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                            const std::vector<RankMeasure>& measured);

// `plan` with the global batch re-split over its replicas by their throughput and fixed
// costs per step under `costs` (a replica runs at its slowest stage; its fixed cost is
// its communication overhead and its calls' fixed part), each share capped at
// what every rank of the replica holds in memory. Micro-batch counts are `original`'s
// (the plan as first made), at most the share.
Plan resplit(const Plan& plan, const Plan& original, const BlockCosts& costs);

// `original` with the replicas' shares set to `shares` (one per replica, summing to the
// global batch), micro-batch counts as there (at most the share): the plan a re-split
// carried by shares alone (parallel.sync deadline's records) runs. Errors (ht::Error):
// another count of shares, another sum, or a share under 1.
Plan with_shares(const Plan& original, const std::vector<int64_t>& shares);

// `plan` with the shares (one per replica) and micro-batch counts that a checkpoint's
// run stepped by, predicted over `costs` and `cluster`: what a resumed job starts from,
// so that it need not find them again. Each count is at least the plan's (a kept
// micro-batch trial's finer count) and at most its share, and every rank of each replica
// must hold its share in memory. A share under kMinMicroBatchSamples (where the plan's
// is not) is refused: at a few samples a rank's step is its fixed costs, which the
// calibration takes for its speed per sample, so the checks never give it samples back
// (a rank re-split to 1 sample while slowed 4x, resumed unslowed, kept 1 sample for 240
// steps). Errors (ht::Error, naming what does not fit): as with_shares, or a count or
// share outside those bounds.
Plan with_resumed_shares(const Plan& plan, const std::vector<int64_t>& shares, const std::vector<int>& micro_batches,
                         const BlockCosts& costs, const ClusterModel& cluster);

// Each rank's forward + backward seconds per sample under `costs` over its stage's blocks
// (0 for an idle rank).
std::vector<double> seconds_per_sample_of(const Plan& plan, const BlockCosts& costs);

// The window's step: the slowest rank's median step (ranks' steps are not aligned in
// time, so a per-step maximum would add up their noise).
double measured_step_seconds(const std::vector<RankMeasure>& measured);

// A rank whose speed changed inside a window (a card throttled, a rank was slowed or
// freed): when the median work of its last `recent` steps is more than kSpeedChange
// away from the median of its steps before them, those earlier steps are dropped from
// every series, so that the check sees the new speed alone. A window of three checks
// otherwise still held two checks of the old speed at the first check after a 3x
// slow-down, its median the old one, and the shares moved a check later. The steps
// before need kMinSpeedSteps, the recent ones `least` (a rank too slow to send more
// under parallel.sync deadline sends fewer). Returns whether steps were dropped.
inline constexpr size_t kMinSpeedSteps = 3;
bool drop_steps_before_speed_change(RankMeasure& m, size_t recent, size_t least = kMinSpeedSteps);

// Per stage: what ReduceGrads took, measured. Ranks wait in it for the group's last
// member, so a step's cost is the least time any member spent in it; the median over
// the window's steps. -1 for a stage without measurements.
std::vector<double> measured_reduce_seconds(const Plan& plan, const std::vector<RankMeasure>& measured);

struct Rebalance {
  Plan plan;                  // to run next
  bool changed = false;       // the plan differs from the current one (shares, micro-batches, ranks)
  bool reverted = false;      // back to the shares before the last change
  double current_step_s = 0;  // the simulator's step for the current plan, calibrated
  double measured_step_s = 0; // the window's, see measured_step_seconds
  bool relayout = false;      // other ranks are active: the job moves its state to them
  // A micro-batch trial judged at this check: its replica's measured work per sample in
  // the steps of the count before and of the count tried (seconds, -1: too few steps).
  std::vector<double> trial_seconds_per_sample;
};

// The checks of one job. Each calibrates the costs (compute and ReduceGrads from the
// measurements), predicts the current plan with them and, when `move_shares` and there
// is more than one replica, takes the re-split if predicted kResplitMinGain faster (where
// cores are shared, at the kSharedCoreChecks-th check in a row that asks for it).
// A change that made the measured step kRebalanceMinGain slower is undone at the next check,
// never tried again, and no other change follows for kSettleChecks checks: the
// simulator cannot see everything (a rank under a CPU quota that finishes its share
// early answers the all-reduce at once; balanced, it answers late).
//
// `all_ranks`, the planner's best plan over every rank when `original` leaves some idle,
// is tried at the first check under the same rule (kept unless the measured step got
// slower), when both replicate the whole model (replicates_whole_model) and it was
// predicted within kIdleTrialMargin of `original`; the shares then move within it.
//
// Micro-batch trials (one-stage plans, when shares move): a rank's time per sample
// depends on how many samples a call carries, and not only through the fixed cost per
// call that the model knows: buffers that grow with the call leave the caches (before
// conv2d unfolded its columns in chunks, a 0.8 rank alone ran the CNN 11% faster in 8
// micro-batches of 16 than in one of 128). The block profile cannot see that (it fits
// a straight line through two batch sizes), so the tuner measures it: at a
// check where the shares stay, the replica with the most samples per micro-batch (at
// least 2 x kMinMicroBatchSamples) runs in 4x as many micro-batches (2x where 4x would
// leave fewer than kMinMicroBatchSamples), within its memory, in every other step, the
// old count in the rest (PipelineLayout::alternate_micro_batches). At the next check it
// keeps the new count if its steps measured kRebalanceMinGain faster per sample than the
// old count's (the medians of each, at least kMinTrialSteps of each; the shares then
// follow its new speed, and later checks may try smaller still), else it goes back; after
// 4x, 2x is tried once more, after 2x that replica is not tried again. Alternating step
// by step compares the two counts within the same seconds: this host's speed drifts by
// 5-10% between windows of 10 steps, as much as the gain a trial looks for, so a trial
// judged window against window was kept or undone by the drift. The gradient is the
// same sum in another order.
class ShareTuner {
 public:
  // `micro_batch_trials` off: the shares move, the micro-batch counts never.
  ShareTuner(Plan original, BlockCosts costs, ClusterModel cluster, bool move_shares,
             std::optional<Plan> all_ranks = std::nullopt, bool micro_batch_trials = true);
  Rebalance check(const Plan& current, const std::vector<RankMeasure>& measured);

 private:
  Rebalance check_once(const Plan& current, const std::vector<RankMeasure>& measured);
  // Whether some rank's calibrated time per sample moved by more than kSpeedChange from
  // per_sample_at_change_ (the last change's, or the last undoing's).
  bool speeds_moved(const Plan& current, const BlockCosts& calibrated) const;
  std::vector<int64_t> returned_;  // the shares of the last change returned
  Plan original_;
  BlockCosts costs_;
  ClusterModel cluster_;
  bool move_shares_;
  bool micro_batch_trials_;
  std::optional<Plan> all_ranks_;      // to try at the first check
  std::optional<Plan> original_before_trial_;  // original_ while all_ranks_ is tried
  std::optional<Plan> before_change_;  // the plan the last change replaced
  double step_before_change_ = 0;      // and its measured step
  std::vector<double> per_sample_at_change_;  // each rank's calibrated seconds a sample then
  std::vector<int64_t> left_;          // the shares the last re-split left
  bool cores_shared_ = false;          // some active rank's host time-slices its cores
  std::vector<int64_t> asked_;         // the re-split the last check asked for and held back
  int asked_in_a_row_ = 0;             // how many checks in a row asked for it
  std::set<std::vector<int64_t>> rejected_;
  int settle_ = 0;  // checks left before the next try
  struct MicroBatchTrial {
    size_t replica = 0;
    int micro_batches_before = 1;
  };
  std::optional<MicroBatchTrial> trial_;  // running since the last check
  std::map<size_t, int> finer_;  // per replica, the most times as many micro-batches to try next (default 4)
};

}  // namespace ht::plan
