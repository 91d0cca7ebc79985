#include "cli/planning.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "backend/registry.h"
#include "core/crc32.h"
#include "core/shape.h"
#include "plan/local_plan.h"
#include "plan/planner.h"
#include "plan/policy_plan.h"
#include "probe/probe.h"
#include "runtime/task.h"

namespace hetrain_cli {

ht::plan::ClusterModel cluster_for(const std::string& arg, const std::string& catalogue,
                                   const ht::config::Config& cfg, ht::comm::Communicator& world,
                                   bool check_world_size) {
  if (!arg.empty()) {
    ht::plan::ClusterModel c =
        ht::plan::load_cluster_model(arg, catalogue.empty() ? ht::plan::default_catalogue_path() : catalogue,
                                     check_world_size ? std::optional<int>(world.size()) : std::nullopt);
    if (c.block_seconds.empty()) return c;
    const ht::nn::ModelShape model = ht::runtime::describe_model(cfg);
    bool other = !c.model_signature.empty() && c.model_signature != model_signature(model);
    for (const auto& row : c.block_seconds) other = other || (!row.empty() && row.size() != model.size());
    if (other) {
      // Another model's timings would misplace every share (by 70x, a 64-wide MLP's for a
      // 4096-wide one's); the file's sgemm and bandwidth still describe the hardware.
      if (world.rank() == 0)
        std::fprintf(stderr, "hetrain: note: %s profiled another model's blocks (%s); planning from its measured "
                             "rates instead (probe with --model of this config for its blocks' times)\n",
                     arg.c_str(), c.model_signature.empty() ? "its block count differs" : "its signature differs");
      c.block_seconds.clear();
      c.block_step_seconds.clear();
      c.block_call_seconds.clear();
      for (ht::plan::DeviceModel& d : c.ranks) d.gradient_bandwidth = 0;  // measured at that model's size
    }
    return c;
  }
  ht::probe::ProbeOptions opts;
  opts.quick = true;
  opts.peer_timeout_s = std::max(cfg.parallel.peer_timeout_s, ht::probe::kJobProbeLeastTimeoutS);
  opts.model = cfg;
  // Each rank probes the device it trains on (train selects it first; plan leaves the CPU).
  opts.backend = &ht::run_device();
  if (opts.backend->kind() == ht::DeviceKind::cuda) opts.gpu_index = ht::device_of(*opts.backend).second;
  opts.build_model = [](const ht::config::Config& c) {
    return ht::runtime::make_task(c, ht::cpu_backend())->build_model(c.train.seed);
  };
  ht::plan::ClusterModel c = ht::plan::cluster_from_probe(ht::probe::run_probe(world, opts));
  c.source = "quick probe of this job (" + std::to_string(c.ranks.size()) + " ranks)";
  return c;
}

std::string model_signature(const ht::nn::ModelShape& model) {
  std::string text;
  for (const ht::nn::BlockShape& b : model.blocks)
    text += b.kind + " " + std::to_string(b.params) + " " + std::to_string(b.flops_per_sample) + " " +
            std::to_string(b.activation_bytes_per_sample) + " " + ht::to_string(b.sample_input_shape) + " " +
            ht::to_string(b.sample_output_shape) + ";";
  return ht::crc32_hex(ht::crc32_update(0, text.data(), text.size()));
}

Planned plan_for(const ht::config::Config& cfg, const ht::plan::ClusterModel& cluster, bool all_ranks) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const auto start = Clock::now();
  // The model's shapes from the config alone: planning allocates no weight and reads no
  // data, so it answers for models larger than this machine's memory.
  const ht::nn::ModelShape model = ht::runtime::describe_model(cfg);
  const auto searching = Clock::now();
  ht::plan::PlannerInput in = ht::plan::planner_input_for(cfg, model, cluster);
  const bool deadline = cfg.parallel.sync == ht::config::SyncPolicy::deadline;
  Planned out{ht::plan::plan_for_policy(in, deadline ? ht::config::SyncPolicy::deadline : ht::config::SyncPolicy::sync, 0),
              in.costs, 0, 0, std::nullopt};
  // Under deadline the leaders' re-splits move shares alone (runtime/deadline_rebalance.h):
  // no idle rank is tried.
  if (deadline) all_ranks = false;
  if (auto local = ht::plan::local_plan_for(in, out.plan, cfg.parallel.sync, cfg.parallel.local_steps)) {
    ht::plan::apply_outer_delay(*local, in.costs, in.cluster, cfg.parallel.outer_delay);
    out.plan = std::move(*local);
    all_ranks = false;  // no rebalancing under local: each group's share is set by the plan
  }
  out.model_s = seconds(start, searching);
  out.search_s = seconds(searching, Clock::now());
  if (all_ranks && ht::plan::has_idle_ranks(out.plan)) {
    in.strategy = ht::config::ParallelStrategy::data;
    in.hub_may_step_optimizer = false;
    try {
      out.all_ranks = ht::plan::make_plan(in);
    } catch (const ht::Error&) {  // nothing fits over every rank: nothing to try
    }
  }
  return out;
}

}  // namespace hetrain_cli
