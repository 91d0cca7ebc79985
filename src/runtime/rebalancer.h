// Rebalancing in a running job (plan/rebalance.h): every rank records what each of its
// steps took; every `every` steps the ranks send those records to rank 0, which asks the
// planner's decision, and every rank takes rank 0's answer, so all run the same plan. The
// exchange spans a step (comm::Communicator::consult): the records go out after the
// check's step, the answer comes after the next one and applies from the step after that,
// so no rank waits at the check for the others to end their step. The first step after
// the start and after every change is left out (allocations, caches).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "plan/plan.h"
#include "plan/rebalance.h"
#include "runtime/deadline_rebalance.h"
#include "runtime/executor.h"

namespace ht::runtime {

// RebalanceFn (runtime/deadline_rebalance.h): called on rank 0 only.

class Rebalancer {
 public:
  // Never runs when `decide` is empty or `every` is 0. A check's exchange waits up to
  // `peer_timeout` (parallel.peer_timeout_s) for the others.
  Rebalancer(RebalanceFn decide, int64_t every, comm::Communicator& world, comm::Timeout peer_timeout);

  void record(const StepResult& r);  // after every step

  struct Outcome {
    bool changed = false, reverted = false, relayout = false;  // see plan::Rebalance
    std::vector<int64_t> before, after;      // the replicas' shares
    std::vector<int> micro_before, micro_after;  // and their micro-batch counts
    std::vector<int64_t> ranks_before, ranks_after;  // the first stage's rank of each replica
    std::optional<plan::Plan> replaced;          // with relayout: the plan the executor runs
    double predicted_step_s = 0;             // calibrated, for `after`
    double measured_step_s = 0;              // the window's, for `before`
    double before_predicted_step_s = 0;      // calibrated, for `before`
    std::vector<double> seconds_per_sample;  // per rank, measured (0 for idle ranks)
    std::vector<double> comm_cpu_s;          // per rank, median CPU seconds a step in communication
    bool trial_started = false;              // a micro-batch trial runs from the next step
    std::vector<double> trial_s_per_sample;  // a judged trial's: see plan::Rebalance

    std::string record(int64_t step) const;  // the metrics.jsonl line (JSON, type "rebalance")
    std::string line(int64_t step) const;    // for people, after a change
  };
  // After step `done`, on every rank: when a check is due (`done` a multiple of `every`,
  // two steps or more left, so that its answer has a step to apply to, and a step
  // recorded since the last change), sends this rank's records toward rank 0.
  void start_check(int64_t done, int64_t total);
  // After the step that follows a started check, on every rank (nullopt when none is
  // started): replaces `plan` with rank 0's decision, made here on rank 0 from the
  // records up to the check (Outcome's per-rank figures are rank 0's only). After a change
  // the caller reshares its executor, or after a relayout moves it to the new plan's
  // ranks (stage_gather.h).
  std::optional<Outcome> finish_check(plan::Plan& plan);
  // The step of the check finish_check answers.
  int64_t check_step() const { return check_step_; }

 private:
  RebalanceFn decide_;
  int64_t every_;
  comm::Communicator& world_;
  comm::Timeout peer_timeout_;
  std::unique_ptr<comm::Consultation> pending_;   // started, not answered
  std::unique_ptr<comm::Consultation> answered_;  // kept until the next: see Consultation
  int64_t check_step_ = 0;
  // The steps since the plan last changed, at most kWindowChecks checks' worth: a 0.2
  // rank's median step moves by about 5% between windows of 10 steps, as much as the
  // imbalance the next check should see.
  static constexpr int64_t kWindowChecks = 3;
  plan::RankMeasure window_;
  bool skip_next_ = true;
};

}  // namespace ht::runtime
