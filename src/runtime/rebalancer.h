// Rebalancing in a running job (plan/rebalance.h): every rank records what each of its
// steps took; every `every` steps the ranks exchange those records, rank 0 asks the
// planner's decision and every rank takes rank 0's answer, so all run the same plan. The
// first step after the start and after every change is left out (allocations, caches).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "plan/plan.h"
#include "plan/rebalance.h"
#include "runtime/executor.h"

namespace ht::runtime {

// The planner's decision (plan::ShareTuner::check, bound to the job's costs, cluster and
// first plan; the runtime does not link the planner, the command that planned the job
// supplies it). Called on rank 0 only.
using RebalanceFn = std::function<plan::Rebalance(const plan::Plan& current,
                                                  const std::vector<plan::RankMeasure>& measured)>;

class Rebalancer {
 public:
  // Never runs when `decide` is empty or `every` is 0.
  Rebalancer(RebalanceFn decide, int64_t every, comm::Communicator& world);

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
  // Collective on the steps it is due (`done` a multiple of `every`, before the last
  // step): replaces `plan` with rank 0's decision. After a change the caller reshares its
  // executor, or after a relayout moves it to the new plan's ranks (stage_gather.h).
  std::optional<Outcome> maybe_run(int64_t done, int64_t total, plan::Plan& plan);

 private:
  RebalanceFn decide_;
  int64_t every_;
  comm::Communicator& world_;
  // The steps since the plan last changed, at most kWindowChecks checks' worth: a 0.2
  // rank's median step moves by about 5% between windows of 10 steps, as much as the
  // imbalance the next check should see.
  static constexpr int64_t kWindowChecks = 3;
  plan::RankMeasure window_;
  bool skip_next_ = true;
};

}  // namespace ht::runtime
