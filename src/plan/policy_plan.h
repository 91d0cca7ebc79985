// The plans `hetrain plan`, `hetrain train` and the what-if simulator make from a config:
// one PlannerInput from the config's model shapes, and one plan per sync policy on it, so
// that what-if plays the plans the job would run.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "nn/block_shape.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"
#include "plan/planner.h"

namespace ht::plan {

// What the planner plans from: the config's model (its shapes) over `cluster`.
PlannerInput planner_input_for(const config::Config& cfg, const nn::ModelShape& model, const ClusterModel& cluster);

// The plan of one sync policy on `in`: sync, the planner's plan; deadline, its
// data-parallel plan (under strategy auto) made a deadline plan; local, the local plan
// within auto's bounds (bounded_local_plan, plan/local_plan.h). Throws ht::Error saying
// why a policy has no plan (deadline on a hybrid plan, local where a rank cannot hold the
// whole model or no round of at most kMaxRoundSteps steps serves, ...).
Plan plan_for_policy(const PlannerInput& in, config::SyncPolicy policy, int64_t local_steps);

}  // namespace ht::plan
