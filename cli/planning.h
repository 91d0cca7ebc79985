// Getting a plan for a config, shared by `hetrain plan` and `hetrain train`: the cluster
// (a file, a synth: spec, or a quick probe of this job) and the planner's run over it.
#pragma once

#include <optional>
#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/block_shape.h"
#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"

namespace hetrain_cli {

// `arg` is a probe file or synth: spec, checked against the world size when given; empty
// means a quick probe of `world` with the config's blocks profiled (collective: every
// rank takes part and gets the same cluster). An empty `catalogue` is the shipped one.
// A file's block profile is kept only when it is of this config's model (its signature,
// below, or where the file has none its block count); otherwise the plan uses the file's
// measured rates and rank 0 says why.
ht::plan::ClusterModel cluster_for(const std::string& arg, const std::string& catalogue,
                                   const ht::config::Config& cfg, ht::comm::Communicator& world,
                                   bool check_world_size);

// The config's model's blocks (kinds, parameters, FLOPs, activations, shapes) in one word,
// for a probe file to name the model it profiled.
std::string model_signature(const ht::nn::ModelShape& model);

struct Planned {
  ht::plan::Plan plan;
  ht::plan::BlockCosts costs;
  // model_s: describing the model from its config (`hetrain plan` prints it as
  // "model description"); search_s: the costs and the search.
  double model_s = 0, search_s = 0;
  // With all_ranks, when `plan` leaves ranks idle: the best data-parallel plan over every
  // rank, for the running job to try (plan::ShareTuner); empty when none fits.
  std::optional<ht::plan::Plan> all_ranks;
};

// Describes the config's model (runtime::describe_model: no weights, no data) and plans
// it over `cluster` with parallel.strategy.
Planned plan_for(const ht::config::Config& cfg, const ht::plan::ClusterModel& cluster, bool all_ranks = false);

}  // namespace hetrain_cli
