// parallel.sync: deadline in the executor: the replica state that a catch-up carries, and
// the two instructions the planner emits under deadline (plan/deadline_plan.h), run over a
// data-parallel stage's group with comm::DeadlineReduce.
//   CatchUp (first in the list): marks the step's start (the dropout streams a catch-up
//     must carry are those before this step's Forwards) and takes a catch-up that a
//     leader already sent, so that a rank back from a stall does not compute on old
//     weights when the new ones are waiting.
//   ReduceGradsDeadline: the bounded reduction; the sum becomes the sample-weighted mean
//     over the samples that arrived (runtime/guard.h's rescale_to_kept, shared with the
//     bad-node guard's left-out contributions).
// The replica state is the stage's parameters, its optimiser state (per-parameter step
// counters included) and the dropout streams of its blocks: all that the next step's
// result depends on, so a rank that takes it is bit-identical to the leader.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/deadline_reduce.h"
#include "config/config.h"
#include "nn/block.h"
#include "optim/optimizer.h"
#include "runtime/deadline_rebalance.h"

namespace ht::runtime {

// One step of a deadline reduction as the trainer records it; ranks are world ranks.
struct DeadlineStep {
  comm::StepRecord record;               // the step applied (record.step -1 when ended)
  std::vector<comm::StepRecord> missed;  // steps this rank caught up past, in order
  // Steps caught up past after the one applied, by AlignReplica (a hybrid plan's rank
  // moved on to its replica's other stages), in order.
  std::vector<comm::StepRecord> passed;
  bool caught_up = false;
  // Caught up to the end of training (no step to apply when record.step is -1), or, on a
  // hybrid plan, another stage of the replica was: every rank of it ends its loop.
  bool ended = false;
  double budget_s = 0;
  // Per member (the stage group's rank) of the step applied: the verdict (runtime::Verdict)
  // of its contribution to that step, 0 (kept) for one that did not arrive or came late.
  std::vector<int64_t> verdicts;
};

// State that a catch-up carries beside the weights and the optimiser's (the executor's
// quarantine): given as integers, taken back from them.
struct ExtraReplicaState {
  std::function<std::vector<int64_t>()> save;
  std::function<void(const int64_t* ints, size_t count)> load;
};

class DeadlineSync {
 public:
  // `group`: the stage's replicas in replica order; `world_rank_of[m]` is member m's world
  // rank; `shares[m]` its samples of the global batch. Every member constructs one with
  // the same first_step (the step the run starts at).
  DeadlineSync(comm::Communicator& group, std::vector<int> world_rank_of, std::vector<int64_t> shares,
               const std::vector<nn::NamedTensor>& params, optim::Optimizer& optimizer, nn::Sequential& model,
               int block_begin, int block_end, const config::ParallelConfig& parallel, double predicted_step_s,
               int64_t first_step, ExtraReplicaState extra = {},
               std::unique_ptr<DeadlineRebalancer> rebalancer = nullptr);
  ~DeadlineSync();

  // Op::catch_up: the step's start. `take`: a catch-up already sent is taken now (on one
  // stage); a hybrid plan's ranks leave it to the step's reduction, since the replica's
  // other stages are not moved with it (AlignReplica moves them together).
  void catch_up(bool take = true);
  // Op::reduce_grads_deadline over `grads` (the parameters' contiguous gradients, in
  // order); on return they hold the sample-weighted mean over what arrived.
  // `verdict`: this rank's on its contribution (runtime::Verdict; samples 0 unless kept).
  DeadlineStep reduce(std::vector<Tensor>& grads, int64_t samples, double loss_sum,
                      std::chrono::steady_clock::time_point start, int64_t global_batch, int64_t verdict = 0);
  // Op::align_replica on a rank behind its replica's other stages, after OptimizerStep:
  // this stage's state at step `target` (or later), the records passed in world ranks.
  DeadlineStep align_to(int64_t target);
  // After the last step: one chain on every member, everything drained.
  std::vector<comm::StepRecord> finish(comm::DeadlineReduce::FinishReason why);
  int64_t step() const { return reduce_->step(); }  // the next step to run
  // The members' shares of the global batch for step() (a re-split moves them: see
  // DeadlineRebalancer), in member order.
  const std::vector<int64_t>& shares() const { return reduce_->shares(); }
  // This rank's measures of its last step (DeadlineRebalancer::row), sent with its next
  // contributions; nothing without a rebalancer.
  void set_report(std::vector<double> row) {
    if (rebalancer_) reduce_->set_report(std::move(row));
  }
  bool rebalances() const { return rebalancer_ != nullptr; }
  // With a rebalancer: the plan that runs shares() (DeadlineRebalancer::plan_with).
  plan::Plan plan_for_shares() const { return rebalancer_->plan_with(shares()); }

 private:
  comm::ReplicaState save() const;
  void load(const comm::ReplicaState& state);
  comm::StepRecord in_world_ranks(comm::StepRecord r) const;
  // The dropout streams as they stand now, for a state sent between steps: after
  // OptimizerStep they are the next step's start.
  void mark_step_start();

  std::vector<int> world_rank_of_;
  std::vector<nn::NamedTensor> params_;
  optim::Optimizer& optimizer_;
  nn::Sequential& model_;
  int block_begin_, block_end_;
  std::vector<uint64_t> offsets_;  // the blocks' dropout streams at this step's start
  ExtraReplicaState extra_;
  std::unique_ptr<DeadlineRebalancer> rebalancer_;  // before reduce_, whose hooks call it
  std::unique_ptr<comm::DeadlineReduce> reduce_;
};

// What the trainer records of a deadline run: one metrics record per step (who
// contributed and with how many samples), the counts for the summary, and the loss over
// the samples that arrived.
class DeadlineLog {
 public:
  // Counts `r` and returns its metrics.jsonl line (type "contributions"); "" for a step
  // already recorded.
  std::string add(const comm::StepRecord& r);
  void caught_up() { ++catch_ups_; }
  void aligned() { ++alignments_; }  // moved on to its replica's other stages (AlignReplica)
  // The mean loss per prediction over the fresh samples since the last call, and the
  // window starts afresh. None where none arrived: on a hybrid plan the steps rank 0
  // caught up past, or realigned its replica to, bring it no loss (Executor::align_replica),
  // and a window can hold only those.
  std::optional<double> take_window_loss(int64_t predictions_per_sample);
  double last_loss_sum() const { return last_loss_sum_; }
  int64_t last_loss_samples() const { return last_loss_samples_; }  // the fresh samples it is over
  // A line for people when a step closes short after one that did not, else "".
  std::string short_line(const comm::StepRecord& r) const;
  std::string summary() const;  // a JSON object: the counts
  int64_t samples_dropped() const { return samples_dropped_; }
  // The samples of late contributions applied (max_staleness): counted as dropped by the
  // step they were late for, trained by the step that applied them.
  int64_t stale_samples() const { return stale_samples_; }

 private:
  int64_t steps_ = 0, closed_short_ = 0, samples_dropped_ = 0, stale_ = 0, catch_ups_ = 0, led_elsewhere_ = 0;
  int64_t alignments_ = 0, stale_samples_ = 0;
  double window_loss_ = 0, last_loss_sum_ = 0;
  int64_t last_loss_samples_ = 0;
  int64_t window_samples_ = 0;
  bool last_short_ = false;
  int64_t last_step_ = -1;
};

}  // namespace ht::runtime
