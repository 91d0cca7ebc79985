// The simulator's cost model for a plan (plan/simulator.h's CostModel), built from the
// same block costs and cluster the planner used, plus a closed-form estimate of the step
// that the search uses to rank layouts before simulating the best few.
#pragma once

#include <memory>
#include <utility>
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

// Link tiers of a cluster: ranks whose links are interchangeable, the same latency and
// bandwidth to and from every third rank and the same both ways between the two (the
// link part of device_classes, cluster_model.h). The links are then constant over
// every pair of tiers and within a tier, so the all-reduce below prices a group tier by
// tier: O(members + tiers^2), where pricing every pair was O(members^2) (at 4,096 ranks
// most of the planner's time). Tiers are numbered in the order of their lowest rank.
// Found over the links' sites (Links::tiers): O(ranks + sites^2 x tiers), one site for a
// synthetic cluster, a site per rank for a probe file's; a cluster whose links are not
// symmetric gets a tier per rank.
struct LinkTiers {
  std::vector<int> tier;    // [position]: of rank ranks[position] (of every rank: position = rank)
  std::vector<int> first;   // [tier] its lowest world rank
  std::vector<int> second;  // [tier] its next world rank, -1 when it has one rank
};
LinkTiers link_tiers(const ClusterModel& cluster);
// The tiers of `ranks` alone (world ranks), their links to one another only.
LinkTiers link_tiers(const ClusterModel& cluster, const std::vector<int>& ranks);

// `order` (world ranks, fastest first) with the ranks behind slow links moved last: those
// whose link cost (the median over the others of 4 MB's latency and transfer) is within
// twice the cheapest keep their places; the others follow, cheapest first. Both planners
// try leaving the moved ranks idle. `kept`, where given, is set to how many kept their
// places (the order's size when no rank is behind a slow link).
std::vector<int> link_last_order(const ClusterModel& cluster, const std::vector<int>& order,
                                 size_t* kept = nullptr);

// Ranks the planner may swap for one another without changing a figure: the classes of
// device_classes (cluster_model.h), found as the same link tier and alike devices (their
// DeviceModel and profile rows), split further where the block costs differ (a
// calibrated communication overhead). [rank] -> class, numbered in the order of their
// lowest rank.
std::vector<int> cost_classes(const ClusterModel& cluster, const BlockCosts& costs, const LinkTiers& tiers);

// The executor's all-reduce (comm/weighted_allreduce.h) of `bytes` over `group` (world
// ranks), member i owning the fraction `parts[i]`: two rounds, each as long as its
// slowest member, who sends and receives max(1 - f_i, (n - 1) f_i) x bytes over its
// slowest link to a member it exchanges with (one of the two owns a part), plus the
// worst latency among those pairs, plus the longest
// wake_seconds of the owners (f_i > 0) for round 1 and of every member for round 2. A
// member that owns nothing posts its sends as its backward ends, awake, so round 1 never
// waits for it to wake; it does wake late for the sums, and its next step starts that
// much later. Measured under the 4-rank quotas (CNN, 64/34/15/15): the 0.8 rank's
// ReduceGrads waits 5-7 ms a step with parts by share, 2-3 ms with that rank owning
// every part. 0 for n <= 1. A link of bandwidth 0 (none measured) adds its latency only.
// `tiers`: link_tiers of the whole cluster, where the caller has them; without them the
// group's own are found (O(members^2) compares, once per call).
double weighted_allreduce_seconds(const ClusterModel& cluster, const std::vector<int>& group,
                                  const std::vector<double>& parts, double bytes,
                                  const LinkTiers* tiers = nullptr);
// The same, round by round: round 1 (sums to the owners, with the owners' wake) and round
// 2 (the owners' parts to every member, with every member's wake). Their sum is the above.
using AllreduceRounds = std::pair<double, double>;
AllreduceRounds weighted_allreduce_rounds(const ClusterModel& cluster, const std::vector<int>& group,
                                          const std::vector<double>& parts, double bytes,
                                          const LinkTiers* tiers = nullptr);

// The PipelineLayout::reduce_owner that makes the plan's ReduceGrads cheapest: the
// largest replica as the hub, when that is predicted faster than parts by share and its
// ranks have memory for the other replicas' gradients (it holds them all at once), else -1.
// The seconds are every stage's ReduceGrads summed, each way (hub: 0 when it does not fit).
struct ReduceChoice {
  int owner = -1;
  double by_share_seconds = 0, hub_seconds = 0;
};
ReduceChoice cheapest_reduce_owner(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                                   const LinkTiers* tiers = nullptr);

// comm/deadline_reduce's copies of stage `s`'s gradient on a step's critical path, at each
// rank's memory bandwidth (0: not counted), for a parallel.sync deadline plan: the
// slowest member's two (its gradient into the message before it sends, the received sum
// back into its gradients after: a read and a write of the gradient bytes each), and the
// leader's between the last arrival and its sends (its own gradient gathered, the sum
// zeroed, each of the n contributions read into it, the sum encoded: 5 + 3n). The leader
// is the replica of layout.reduce_owner (apply_deadline_sync sets 0). A throttled rank
// copies at its quota's share of the memory bandwidth, so these copies, not the
// transfers, are most of a small model's reduction there.
double deadline_copy_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs, size_t s);
// One member's two of them (replica `k`; 0 for the leader's): the what-if charges each
// present member its own, so a stopped member's copies leave the steps it misses.
double deadline_member_copy_seconds(const Plan& plan, const PipelineLayout& layout, const BlockCosts& costs, size_t s,
                                    size_t k);

// Per-rank figures of a plan that both the cost model and the estimate use.
struct PlanCostTable {
  std::vector<double> stage_seconds_per_sample;  // [rank] forward + backward of its blocks
  std::vector<double> pass_overhead_seconds;     // [rank] per Forward / Backward call
                                                 // (half the stage's call_seconds)
  std::vector<double> load_seconds_per_sample;   // [rank]
  std::vector<double> optimizer_step_seconds;    // [rank]
  std::vector<double> comm_overhead_seconds;     // [rank] charged to its first Forward
  std::vector<double> reduce_seconds;            // [stage] ReduceGrads (round 1 when sharded)
  std::vector<double> gather_seconds;            // [stage] GatherWeights (sharded: round 2)
  std::vector<double> activation_bytes;          // [rank] per micro-batch (largest)
  std::vector<double> checkpoint_bytes;          // [rank] per micro-batch (largest)
  std::vector<double> workspace_bytes;           // [rank] per micro-batch (largest)
};
PlanCostTable plan_cost_table(const Plan& plan, const BlockCosts& costs,
                              const ClusterModel& cluster, const LinkTiers* tiers = nullptr);

// The model reads `cluster`, which must outlive it (a probe file's cluster holds dense
// link matrices, not worth a copy per model).
CostModel plan_cost_model(const Plan& plan, std::shared_ptr<const PlanCostTable> table,
                          const ClusterModel& cluster);

// Closed-form step estimate: per replica, its largest communication overhead, then
// micro-batch 0 crosses every stage and back, then the slowest stage (with its transfers)
// paces the other M - 1; plus the slowest reduction and optimiser step. Used only to rank
// candidate layouts.
double estimate_step_seconds(const Plan& plan, const PlanCostTable& table,
                             const ClusterModel& cluster);

}  // namespace ht::plan
