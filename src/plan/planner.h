// The planner: from a model's block costs and a cluster to a Plan that keeps every device
// busy and inside its memory.
//
// Search. A layout is S stages x R replicas with S x R = the ranks it uses: all of them,
// and under auto also the fastest ranks up to each step down in speed, and where a count
// holds more replicas of S stages than the global batch has samples, the fastest
// S x batch ranks (every replica needs a sample; the others idle). Ranks are sorted by
// their whole-model throughput and cut into S groups of R consecutive ranks; group g runs
// one stage in every replica, so a stage's replicas sit on like devices and the shared
// layer ranges suit them all (a stage's weights must be the same in every replica for
// ReduceGrads). Groups are tried in three pipeline orders (fastest first, slowest first,
// largest memory first) and with M = S, 2S, 4S micro-batches. For each candidate:
//  - layer ranges: stage_partition's DP over the group's mean block times and smallest
//    memory;
//  - shares: split_batch over the replicas' bottleneck throughputs;
//  - memory: every rank that does not hold its share gets, in this order and only as far
//    as needed, recomputation, more micro-batches for its replica, then optimiser-state
//    sharding over its stage's group in proportion to free memory (plan/stage_memory.h);
//  - a hub: when one replica summing all gradients is predicted cheaper than parts by
//    share, and the plan uses every rank, the hub may also step the optimiser for all
//    (it holds the sums; the others keep no optimiser state and receive the weights),
//    taken when predicted faster: a slow rank's step then costs it nothing;
//  - time: a closed-form estimate ranks all candidates, the best few are simulated on
//    their real schedules and the fastest simulated one wins.
// Device classes (cluster_model.h) keep the search small on big clusters: the shapes tried
// depend on the classes' speed steps and on S <= blocks, not on the world size; orders
// that put the same classes in the same places are tried once; and only the plans that
// may still be simulated are kept while searching. Evaluating one candidate costs time
// and memory in proportion to its ranks (its all-reduce is priced per link tier,
// plan_costs.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"
#include "plan/simulator.h"

namespace ht::plan {

struct LinkTiers;  // plan_costs.h

// The planner tries the fastest ranks alone too, and takes such a plan only when it is
// predicted this much faster than the best with more ranks: a margin for the model's
// error, since using every rank is what a user expects of a job started on them.
inline constexpr double kIdleMinGain = 0.10;

struct PlannerInput {
  BlockCosts costs;
  ClusterModel cluster;
  int64_t global_batch = 0;
  int min_micro_batches = 1;      // train.micro_batches: the least accumulation asked for
  config::ParallelStrategy strategy = config::ParallelStrategy::automatic;
  // Whether a plan that uses every rank and sums on a hub may let the hub step the
  // optimiser for all (see build in planner.cpp). Off for the all-ranks plan of the
  // idle-rank trial: a running job moves only replicas that each step their own.
  bool hub_may_step_optimizer = true;
  // Whether a rank short of memory may shard its stage's optimiser state over the stage's
  // replicas. Off under parallel.sync deadline, where a stalled rank's shard has no stand-in.
  bool may_shard_optimizer = true;
  // Whether every rank must train (auto otherwise tries the fastest ranks alone too).
  // On under parallel.sync deadline, where a slow rank is left out of the steps it is
  // late for anyway, and an idle rank would have no step to pace it to the job's end.
  bool use_every_rank = false;
  // Plans of one stage only (no pipeline): a dynamic loss scale is agreed within one
  // stage group (train.loss_scale, runtime/executor_sync.cpp).
  bool one_stage = false;
  // The job steps between the run's evaluations and checkpoints (their gcd; 0: neither
  // comes during training), which a local plan's rounds end at where they can
  // (plan/local_plan.h, H).
  int64_t flush_every = 0;
  std::string config_name, config_hash;
};

// Throws ht::Error, naming the ranks, devices and numbers, when nothing fits (every
// layout and strategy tried), when strategy data or equal needs more replicas than
// samples (auto plans a subset instead), or on inconsistent input.
Plan make_plan(const PlannerInput& in);

// Fills the plan's prediction (step, samples/s, bubble, every rank's busy fraction, and
// where it has a baseline the speed-up over it: set_speedup) and the layout's cost
// estimates that order each rank's communication, by simulating it.
// `reduce_seconds[stage]`, where given and >= 0, replaces the modelled ReduceGrads.
// `tiers`: link_tiers(cluster) where the caller has them (plan_costs.h).
void predict_plan(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                  const std::vector<double>& reduce_seconds = {}, const LinkTiers* tiers = nullptr);

// plan.speedup from the baseline's predicted step and the plan's, where both are set:
// every step that predicts a made plan again (deadline's reduction, a local plan's
// rounds) keeps the printed speed-up the plan's own.
void set_speedup(Plan& plan);

// The plan's predicted step on its schedules (what `hetrain plan` shows and draws).
SimResult simulate_plan(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster);

}  // namespace ht::plan
