// parallel.sync: deadline in the plan (the reduction itself: comm/deadline_reduce.h).
//
// What it supports: data-parallel plans (one stage, every replica a whole model), whose
// replicas stand in for one another; hybrid plans (replicas of pipelines), where each
// stage's replicas reduce on their own deadline and a replica with a stalled rank is left
// out of every stage while the others keep stepping; and pure pipelines, which have no
// replica to stand in for a stalled stage: there the job waits for it (up to
// parallel.peer_timeout_s) and says so. Refused at plan time: optimizer-state sharding,
// where a stalled rank's shard has no stand-in that holds its part.
#pragma once

#include <vector>

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"
#include "plan/schedule.h"

namespace ht::plan {

inline constexpr double kDeadlineNoteRatio = 1.5;
// A catch-up is one message of the stage's parameters and float optimiser state (MPI
// counts are int): at most INT_MAX bytes, less room for the step records that ride with
// it. The planner refuses a deadline plan past it (auto then tries more stages), and the
// runtime a plan file that is (runtime/deadline_sync.cpp).
inline constexpr double kDeadlineRecordsRoom = 64.0 * 1024 * 1024;
inline constexpr double kDeadlineCatchUpMaxBytes = 2147483647.0 - kDeadlineRecordsRoom;

// Makes `plan` a deadline plan: sync_policy "deadline", replica 0 as the reduction's
// first leader (the cost model charges the hub reduction that the leader runs: every
// member sends it the whole gradient and takes the sum back), no hub stepping the
// optimiser, rank 0's replica first (rank 0 evaluates and checkpoints from its own
// weights, with no message from a rank that may be stalled), and the prediction redone
// on the deadline lists. Throws ht::Error naming the setting and what is supported for
// a sharded plan, one with replicas that leaves a rank idle, or one whose stage's catch-up
// (its parameters and optimiser state) exceeds kDeadlineCatchUpMaxBytes. Where the deadline step
// is over kDeadlineNoteRatio x the same layout's synchronous step, a note says that the
// leader's link sets the pace.
void apply_deadline_sync(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster);

// Throws ht::Error naming the idle ranks of a deadline plan with replicas (a plan file made
// by hand, or for another policy): the planner leaves none idle under deadline.
void check_deadline_ranks(const Plan& plan);

// The deadline instructions in every rank's list that reduces: CatchUp first (a rank that
// was left out takes the state it was sent before it computes), ReduceGradsDeadline in
// place of ReduceGrads, no ReduceStart (the deadline reduction sends the whole gradient
// at once, to one leader), and on a hybrid layout AlignReplica after OptimizerStep (the
// replica's stages agree on their step). Lists without a reduction are left as they are.
void add_deadline_sync(std::vector<Schedule>& schedules, const PipelineLayout& layout);

}  // namespace ht::plan
