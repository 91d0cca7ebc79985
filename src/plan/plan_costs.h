// The simulator's cost model for a plan (plan/simulator.h's CostModel), built from the
// same block costs and cluster the planner used, plus a closed-form estimate of the step
// that the search uses to rank layouts before simulating the best few.
#pragma once

#include <memory>
#include <vector>

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"
#include "plan/simulator.h"

namespace ht::plan {

// A Forward is about a third of forward + backward (see block_costs.h).
inline constexpr double kForwardFraction = 1.0 / 3.0;

// The expected delay before a busy rank under a CPU quota (DeviceModel::cpu_quota) acts
// on a message: it has used its quota for the period a fraction 1 - q of the time, and
// then waits on average half of the (1 - q) x period left, so (1 - q)^2 x period / 2.
// 0 without a quota. Measured under tools/hetero-local (10 ms period): a 4-rank
// all-reduce of the CNN's gradients with two ranks at 0.2 took 6.1 ms, this gives 6.4.
double wake_seconds(const DeviceModel& d);

// The executor's all-reduce (comm/weighted_allreduce.h) of `bytes` over `group` (world
// ranks), member i owning the fraction `parts[i]`: two rounds, each as long as its
// slowest member, who sends and receives max(1 - f_i, (n - 1) f_i) x bytes over its
// slowest link in the group, plus that round's worst latency and the group's longest
// wake_seconds. 0 for n <= 1.
double weighted_allreduce_seconds(const ClusterModel& cluster, const std::vector<int>& group,
                                  const std::vector<double>& parts, double bytes);

// Per-rank figures of a plan that both the cost model and the estimate use.
struct PlanCostTable {
  std::vector<double> stage_seconds_per_sample;  // [rank] forward + backward of its blocks
  std::vector<double> pass_overhead_seconds;     // [rank] per Forward / Backward call
                                                 // (half the stage's call_seconds)
  std::vector<double> load_seconds_per_sample;   // [rank]
  std::vector<double> optimizer_step_seconds;    // [rank]
  std::vector<double> reduce_seconds;            // [stage]
  std::vector<double> activation_bytes;          // [rank] per micro-batch (largest)
  std::vector<double> checkpoint_bytes;          // [rank] per micro-batch (largest)
};
PlanCostTable plan_cost_table(const Plan& plan, const BlockCosts& costs,
                              const ClusterModel& cluster);

CostModel plan_cost_model(const Plan& plan, std::shared_ptr<const PlanCostTable> table,
                          const ClusterModel& cluster);

// Closed-form step estimate: per replica, micro-batch 0 crosses every stage and back, then
// the slowest stage (with its transfers) paces the other M - 1; plus the slowest
// reduction and optimiser step. Used only to rank candidate layouts.
double estimate_step_seconds(const Plan& plan, const PlanCostTable& table,
                             const ClusterModel& cluster);

}  // namespace ht::plan
