// `hetrain plan CONFIG`: plan the split of a config's training over a cluster and show it
// before any compute is spent: the table, and on request the plan file, an SVG picture
// and the predicted timeline as a Chrome trace.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/planning.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "plan/cluster_model.h"
#include "plan/plan_json.h"
#include "plan/planner.h"
#include "report/local_sync_text.h"
#include "report/plan_svg.h"
#include "report/plan_table.h"
#include "report/trace.h"
#include "runtime/atomic_file.h"

namespace hetrain_cli {

namespace {

struct PlanArgs {
  std::string config, cluster, catalogue, json, svg, trace;
};

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
    ht::comm::Communicator& world = ht::comm::world();
    // Every rank takes part in a probe; only rank 0 plans and prints.
    const ht::plan::ClusterModel cluster = cluster_for(args->cluster, args->catalogue, cfg, world, false);
    if (world.rank() != 0) return;
    const Planned planned = plan_for(cfg, cluster);
    const ht::plan::Plan& plan = planned.plan;
    std::printf("%s", ht::report::format_plan(plan).c_str());
    std::printf("%s", ht::report::local_sync_text(plan).c_str());
    std::printf("planned in %.3f s (data and model %.3f s, costs and search %.3f s)\n",
                planned.data_and_model_s + planned.search_s, planned.data_and_model_s,
                planned.search_s);
    if (!args->json.empty()) write(args->json, ht::plan::plan_to_json(plan), "plan");
    if (args->svg.empty() && args->trace.empty()) return;
    const ht::plan::SimResult sim = ht::plan::simulate_plan(plan, planned.costs, cluster);
    if (!args->svg.empty()) write(args->svg, ht::report::plan_to_svg(plan, sim.timeline), "plan picture");
    if (!args->trace.empty())
      write(args->trace,
            ht::report::to_chrome_trace(sim.timeline, "hetrain plan " + cfg.name + " (predicted)"),
            "predicted timeline");
  });
}

}  // namespace hetrain_cli
