#include "plan/policy_plan.h"

#include <numeric>
#include <optional>
#include <string>

#include "core/error.h"
#include "plan/block_costs.h"
#include "plan/deadline_plan.h"
#include "plan/local_plan.h"

namespace ht::plan {

using Policy = config::SyncPolicy;

PlannerInput planner_input_for(const config::Config& cfg, const nn::ModelShape& model, const ClusterModel& cluster) {
  PlannerInput in;
  in.costs = block_costs(model, cluster, cfg.train.optimizer, cfg.train.precision);
  in.costs.eval_batch = config::eval_batch(cfg.train);
  in.cluster = cluster;
  in.global_batch = cfg.train.batch_size;
  in.min_micro_batches = static_cast<int>(cfg.train.micro_batches);
  in.strategy = cfg.parallel.strategy;
  // A dynamic loss scale is agreed within one stage group (config.cpp refuses an asked
  // pipeline), so auto plans one stage.
  in.one_stage = config::dynamic_loss_scale(cfg.train);
  in.config_name = cfg.name;
  in.config_hash = config::plan_hash(cfg);
  in.flush_every = std::gcd(cfg.train.eval_every, cfg.checkpoint.every);  // gcd(x, 0) = x
  return in;
}

Plan plan_for_policy(const PlannerInput& in, Policy policy, int64_t local_steps) {
  if (policy == Policy::deadline) {
    // Every rank keeps its stage's whole optimiser state and steps it itself (a stalled
    // rank's shard, or a stalled hub, would have no stand-in), and every rank trains.
    PlannerInput own = in;
    own.may_shard_optimizer = false;
    own.hub_may_step_optimizer = false;
    own.use_every_rank = true;
    // Under auto, a data-parallel plan first: every replica holds the whole model, so any
    // rank's stall costs only its own share. Where none fits, the planner's own choice
    // over every rank (a hybrid plan survives a stalled rank too, at the cost of its
    // replica's share), then a pipeline over every rank (the planner's choice is one
    // layout, whose stage may be too large to catch up: GPT-2 350M on two rtx3060 and
    // an rtx4090 had no plan where strategy pipeline gave one), and last a pipeline over
    // some of them (it waits for a stalled stage, as under sync, and its idle ranks keep
    // with it as under sync).
    if (own.strategy == config::ParallelStrategy::automatic) {
      std::string why_not;
      // apply_deadline_sync refuses replicas beside idle ranks (check_deadline_ranks), so
      // the last attempt keeps only a single replica over some ranks.
      auto attempt = [&](const PlannerInput& pin) -> std::optional<Plan> {
        try {
          Plan p = make_plan(pin);
          apply_deadline_sync(p, pin.costs, pin.cluster);
          return p;
        } catch (const Error& e) {
          // Attempts refused for one reason (a world larger than the batch) say it once.
          if (why_not.find(e.what()) == std::string::npos) why_not += (why_not.empty() ? "" : "; ") + std::string(e.what());
          return std::nullopt;
        }
      };
      PlannerInput data = own, pipeline = own, some = own;
      data.strategy = config::ParallelStrategy::data;
      pipeline.strategy = config::ParallelStrategy::pipeline;
      some.use_every_rank = false;
      if (auto p = attempt(data)) return std::move(*p);
      if (auto p = attempt(own)) return std::move(*p);
      if (auto p = attempt(pipeline)) return std::move(*p);
      if (auto p = attempt(some)) return std::move(*p);
      fail("parallel.sync deadline: no plan in which every rank trains and keeps its stage's whole optimizer "
           "state, nor a pipeline over some of them: ", why_not);
    }
    Plan p = make_plan(own);
    apply_deadline_sync(p, own.costs, own.cluster);
    return p;
  }
  Plan p = make_plan(in);
  if (policy == Policy::local) {
    // Within auto's bounds (a round of at most kMaxRoundSteps steps), so that what-if plays
    // rounds a job would run, not thousands of one-rank groups in a round as long.
    LocalPlanResult local = bounded_local_plan(in, p, local_steps);
    HT_CHECK(local.plan, "no local plan within a round of ", kMaxRoundSteps, " steps: ", local.problem);
    return std::move(*local.plan);
  }
  return p;
}

}  // namespace ht::plan
