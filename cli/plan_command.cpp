// `hetrain plan CONFIG`: plan the split of a config's training over a cluster and show it
// before any compute is spent: the table, and on request the plan file, an SVG picture
// and the predicted timeline as a Chrome trace.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan_json.h"
#include "plan/planner.h"
#include "probe/probe.h"
#include "report/plan_svg.h"
#include "report/plan_table.h"
#include "report/trace.h"
#include "runtime/atomic_file.h"
#include "runtime/task.h"

namespace hetrain_cli {

namespace {

struct PlanArgs {
  std::string config, cluster, catalogue, json, svg, trace;
};

// The cluster to plan for: the given file or synth: spec, else a quick probe of this job's
// ranks with the config's blocks profiled (every rank takes part; only rank 0 goes on).
std::optional<ht::plan::ClusterModel> cluster_for(const PlanArgs& a, const ht::config::Config& cfg) {
  if (!a.cluster.empty()) return ht::plan::load_cluster_model(a.cluster, a.catalogue);
  ht::probe::ProbeOptions opts;
  opts.quick = true;
  opts.model = cfg;
  ht::comm::Communicator& world = ht::comm::world();
  ht::probe::ClusterFingerprint fp = ht::probe::run_probe(world, opts);
  if (world.rank() != 0) return std::nullopt;
  ht::plan::ClusterModel c = ht::plan::cluster_from_probe(fp);
  c.source = "quick probe of this job (" + std::to_string(c.ranks.size()) + " ranks)";
  return c;
}

void write(const std::string& path, const std::string& text, const char* what) {
  ht::runtime::write_file_atomically(path, text, what);
  std::printf("%s written to %s\n", what, path.c_str());
}

}  // namespace

void register_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand("plan", "Plan the split of a training run over a cluster and show it");
  cmd->add_option("config", args->config, "Config file (JSON); see configs/")->required();
  cmd->add_option("--cluster", args->cluster,
                  "A `hetrain probe --json` file, or synth:COUNTxDEVICE,...[@LINK] from the device "
                  "catalogue (default: quick-probe this job's ranks)");
  cmd->add_option("--catalogue", args->catalogue, "Device catalogue for synth: clusters")
      ->default_str("configs/devices.json of this build");
  cmd->add_option("--json", args->json, "Write the plan here (for `hetrain train --plan`)");
  cmd->add_option("--svg", args->svg, "Draw the plan here: per-rank timeline and memory bars");
  cmd->add_option("--trace", args->trace, "Write the predicted timeline here (Chrome trace JSON)");
  cmd->callback([args] {
    const ht::config::Config cfg = ht::config::load_config(args->config);
    if (args->catalogue.empty()) args->catalogue = ht::plan::default_catalogue_path();
    const std::optional<ht::plan::ClusterModel> cluster = cluster_for(*args, cfg);
    if (!cluster) return;  // ranks other than 0 after the probe

    const auto start = std::chrono::steady_clock::now();
    const std::unique_ptr<ht::runtime::Task> task = ht::runtime::make_task(cfg);
    const ht::nn::Sequential model = task->build_model(cfg.train.seed);
    const auto searching = std::chrono::steady_clock::now();
    ht::plan::PlannerInput in;
    in.costs = ht::plan::block_costs(model, *cluster, cfg.train.optimizer);
    in.cluster = *cluster;
    in.global_batch = cfg.train.batch_size;
    in.min_micro_batches = static_cast<int>(cfg.train.micro_batches);
    in.strategy = cfg.parallel.strategy;
    in.config_name = cfg.name;
    in.config_hash = ht::config::config_hash(cfg);
    const ht::plan::Plan plan = ht::plan::make_plan(in);
    const auto done = std::chrono::steady_clock::now();
    auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };

    std::printf("%s", ht::report::format_plan(plan).c_str());
    std::printf("planned in %.3f s (data and model %.3f s, costs and search %.3f s)\n",
                seconds(start, done), seconds(start, searching), seconds(searching, done));
    if (!args->json.empty()) write(args->json, ht::plan::plan_to_json(plan), "plan");
    if (args->svg.empty() && args->trace.empty()) return;
    const ht::plan::SimResult sim = ht::plan::simulate_plan(plan, in.costs, in.cluster);
    if (!args->svg.empty()) write(args->svg, ht::report::plan_to_svg(plan, sim.timeline), "plan picture");
    if (!args->trace.empty())
      write(args->trace,
            ht::report::to_chrome_trace(sim.timeline, "hetrain plan " + cfg.name + " (predicted)"),
            "predicted timeline");
  });
}

}  // namespace hetrain_cli
