// `hetrain plan CONFIG`: plan the split of a config's training over a cluster and show it
// before any compute is spent: the table, and on request the plan file, an SVG picture
// and the predicted timeline as a Chrome trace.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/planning.h"
#include "cli/whole_number.h"
#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "config/config.h"
#include "core/error.h"
#include "plan/cluster_model.h"
#include "plan/plan_json.h"
#include "plan/local_plan.h"
#include "plan/planner.h"
#include "plan/what_if.h"
#include "report/local_sync_text.h"
#include "report/plan_svg.h"
#include "report/plan_table.h"
#include "report/trace.h"
#include "report/what_if_svg.h"
#include "report/what_if_text.h"
#include "runtime/atomic_file.h"
#include "runtime/task.h"

namespace hetrain_cli {

namespace {

struct PlanArgs {
  std::string config, cluster, catalogue, json, svg, trace;
  int dump = -1;
  CLI::Option* dump_option = nullptr;
  std::vector<std::string> what_if;
  int64_t what_if_steps = ht::plan::kDefaultWhatIfSteps;
};

// The planner's "what-if event SPEC: ..." as the option the user typed: "--what-if SPEC: ...".
ht::config::ConfigError as_option_error(const ht::config::ConfigError& e) {
  const std::string what = e.what(), prefix = "what-if event ";
  return ht::config::ConfigError("--what-if " + (what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what));
}

// --what-if specs, parsed before any probe or search; a bad one names the option.
std::vector<ht::plan::WhatIfEvent> parse_what_if(const std::vector<std::string>& specs) {
  std::vector<ht::plan::WhatIfEvent> events;
  for (const std::string& spec : specs) {
    try {
      events.push_back(ht::plan::parse_what_if_event(spec));
    } catch (const ht::config::ConfigError& e) {
      throw as_option_error(e);
    }
  }
  return events;
}

// --what-if events against the cluster: ranks in it, join devices in the catalogue.
void check_what_if(const std::vector<ht::plan::WhatIfEvent>& events, size_t world, const std::string& catalogue_path) {
  const bool joins = std::any_of(events.begin(), events.end(),
                                 [](const ht::plan::WhatIfEvent& e) { return e.kind == ht::plan::WhatIfKind::join; });
  try {
    ht::plan::check_what_if_events(events, world, joins ? ht::plan::read_catalogue(catalogue_path) : ht::plan::Catalogue{});
  } catch (const ht::config::ConfigError& e) {
    throw as_option_error(e);
  }
}

std::string catalogue_path(const std::string& arg) {
  return arg.empty() ? ht::plan::default_catalogue_path() : arg;
}

// An output of the command, written once everything is computed: a failure on the way
// leaves none of them half done.
struct Output {
  std::string path, text;
  const char* what;
};

// Each sync policy's plan over the same planner input as the plan shown, played over
// --what-if-steps steps under the events, as one table; with `svg`, the picture of it.
void print_what_if(const ht::config::Config& cfg, const ht::plan::ClusterModel& cluster, const ht::plan::Plan& shown,
                   const std::string& catalogue, std::vector<ht::plan::WhatIfEvent> events, int64_t steps,
                   const std::string& svg, std::vector<Output>& outputs) {
  ht::plan::WhatIfInput in;
  in.model = ht::runtime::describe_model(cfg);
  in.planner = ht::plan::planner_input_for(cfg, in.model, cluster);
  in.plans = {shown};
  in.optimizer = cfg.train.optimizer;
  in.catalogue_path = catalogue_path(catalogue);
  in.steps = steps;
  in.checkpoint_every = cfg.checkpoint.every;
  in.log_every = cfg.train.log_every;
  in.deadline_slack = cfg.parallel.deadline_slack;
  in.local_steps = cfg.parallel.local_steps;
  in.rebalance_every = cfg.parallel.rebalance_every;
  in.peer_timeout_s = cfg.parallel.peer_timeout_s;
  in.events = std::move(events);
  const auto start = std::chrono::steady_clock::now();
  const ht::plan::WhatIfResult result = ht::plan::run_what_if(in);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s", ht::report::what_if_text(result, in.events).c_str());
  std::printf("what-if simulated in %.3f s (each policy planned, re-planned after failures and joins, and played)\n",
              took);
  if (!svg.empty())
    outputs.push_back({svg,
                       ht::report::what_if_to_svg(result, in.events,
                                                  cfg.name + ": what if, over " + std::to_string(steps) +
                                                      " steps, per sync policy"),
                       "what-if timeline"});
}

// --dump RANK names a rank of the planned world (a negative one is refused as the option
// is read).
void check_dump_rank(int rank, size_t world) {
  if (static_cast<size_t>(rank) >= world)
    throw ht::config::ConfigError("--dump " + std::to_string(rank) + ": no such rank; expected 0 to " +
                                  std::to_string(world - 1) + " (the cluster has " + std::to_string(world) + " ranks)");
}

// The rank's instruction list for one step, as the executor runs it and the simulator
// times it: a header line, then one instruction per line (plan/schedule.h's to_text).
void print_schedule(const ht::plan::Plan& plan, int rank) {
  if (plan.local) {  // its group's sub-plan every step, the outer synchronisation every H
    const int g = ht::plan::group_of_rank(plan, rank);
    ht::plan::Schedule inner;
    int64_t samples = 0;
    if (g >= 0) {
      const std::vector<int> ranks = ht::plan::group_ranks(plan, g);
      const auto at = static_cast<size_t>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
      // Sized as the executor sizes the round's first inner step (its group's samples
      // over its steps, micro-batches as large as memory holds), not at the nominal
      // global batch, whose list showed 24 micro-batches where the step runs 27 of 11.
      ht::plan::Plan sub = ht::plan::group_plan(plan, g);
      samples = ht::plan::inner_step_samples(plan, g, 0);
      ht::plan::size_group_step(sub, plan, g, samples);
      inner = ht::plan::plan_schedules(sub)[at];
    }
    const ht::plan::Schedule outer = ht::plan::outer_sync_schedules(plan)[static_cast<size_t>(rank)];
    const std::string of_group =
        g >= 0 ? " of group " + std::to_string(g) + " (the round's first, " + std::to_string(samples) + " samples; " +
                     std::to_string(plan.local->group_steps[static_cast<size_t>(g)]) + " a round), peers numbered within it"
               : "";
    std::printf("instructions of rank %d, one inner step%s (%zu):\n%s", rank, of_group.c_str(),
                inner.size(), inner.empty() ? "(none: the plan leaves this rank idle)\n" : ht::plan::to_text(inner).c_str());
    // OuterSyncFinish (the round before's exchange, and its outer step) after job step D
    // of a round, OuterSyncStart after its last (local_sync.h).
    std::printf("each round of %d job steps (%zu):\n", plan.local->inner_steps, outer.size());
    for (const ht::plan::Instruction& in : outer)
      std::printf("%s after job step %d\n", ht::plan::to_text(in).c_str(),
                  in.op == ht::plan::Op::outer_sync_finish ? plan.local->outer_delay : plan.local->inner_steps);
    return;
  }
  const ht::plan::Schedule sched = ht::plan::plan_schedules(plan)[static_cast<size_t>(rank)];
  std::printf("instructions of rank %d, one step (%zu):\n%s", rank, sched.size(),
              sched.empty() ? "(none: the plan leaves this rank idle)\n" : ht::plan::to_text(sched).c_str());
}

void write(const std::vector<Output>& outputs) {
  for (const Output& o : outputs) {
    ht::runtime::write_file_atomically(o.path, o.text, o.what);
    std::printf("%s written to %s\n", o.what, o.path.c_str());
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand("plan", "Plan the split of a training run over a cluster and show it");
  cmd->add_option("config", args->config, "Config file (JSON); see configs/")->required()->check(non_empty_path());
  cmd->add_option("--cluster", args->cluster,
                  "A `hetrain probe --json` file, or synth:COUNTxDEVICE,...[@LINK] from the device "
                  "catalogue (default: quick-probe this job's ranks)")
      ->check(non_empty_path());
  cmd->add_option("--catalogue", args->catalogue, "Device catalogue for synth: clusters")
      ->default_str("$HETRAIN_DEVICES, else configs/devices.json of this build")
      ->check(non_empty_path());
  CLI::Option* json_option = cmd->add_option("--json", args->json, "Write the plan here (for `hetrain train --plan`)");
  CLI::Option* svg_option = cmd->add_option("--svg", args->svg,
                  "Draw the plan here: per-rank timeline and memory bars (with --what-if: the job as each policy "
                  "played it, the events marked)");
  CLI::Option* trace_option =
      cmd->add_option("--trace", args->trace, "Write the predicted timeline here (Chrome trace JSON)");
  args->dump_option = cmd->add_option(
      "--dump", args->dump,
      "After the plan, print rank RANK's instruction list for one step, one instruction per line: the list the "
      "executor runs and the simulator times (where a stage's replicas compute with its hub's weights in shared "
      "memory, the executor runs ShareWeights/AwaitWeights in place of GatherWeights)");
  args->dump_option->transform(whole_number<int>(0, 1000000))->type_name("RANK");
  cmd->add_option("--what-if", args->what_if,
                  "Predict the job under an event, for each sync policy (repeatable, combinable): "
                  "stall:rank=R,at=T,for=S  slow:rank=R,at=T,factor=F  fail:rank=R,at=T  "
                  "link:ranks=A-B,at=T,latency=MS,bandwidth=MB_PER_S  join:device=ID,at=T (T and S in seconds of "
                  "job time)")
      ->type_name("EVENT")
      ->allow_extra_args(false);  // one event a flag: the config may follow it
  CLI::Option* what_if_option = cmd->get_option("--what-if");
  cmd->add_option("--what-if-steps", args->what_if_steps, "Steps the what-if simulator plays")
      ->needs(what_if_option)
      ->default_val(ht::plan::kDefaultWhatIfSteps)
      ->transform(whole_number<int64_t>(1, ht::plan::kMaxWhatIfSteps))
      ->type_name("N");
  refuse_option_names_as_values(cmd);
  cmd->callback([args, json_option, svg_option, trace_option] {
    for (const CLI::Option* o : {json_option, svg_option, trace_option})
      check_given_path(o->get_name(), o->count() > 0, o->as<std::string>());
    const std::vector<std::pair<std::string, std::string>> inputs{
        {"the config", args->config},
        {"the cluster file", args->cluster.rfind("synth:", 0) == 0 ? std::string() : args->cluster},
        {"the device catalogue", args->catalogue.empty() ? ht::plan::default_catalogue_path() : args->catalogue}};
    check_not_an_input("--json", args->json, inputs);
    check_not_an_input("--svg", args->svg, inputs);
    check_not_an_input("--trace", args->trace, inputs);
    check_outputs({{"--json", args->json}, {"--svg", args->svg}, {"--trace", args->trace}});
    const ht::config::Config cfg = ht::config::load_config(args->config);
    const bool dump = args->dump_option->count() > 0;
    std::vector<ht::plan::WhatIfEvent> events = parse_what_if(args->what_if);
    ht::comm::set_blocking_call_limit(std::chrono::duration<double>(cfg.parallel.peer_timeout_s));
    ht::comm::Communicator& world = ht::comm::world();
    // Every rank takes part in a probe; only rank 0 plans and prints.
    const ht::plan::ClusterModel cluster = cluster_for(args->cluster, args->catalogue, cfg, world, false);
    if (world.rank() != 0) return;
    if (dump) check_dump_rank(args->dump, cluster.ranks.size());
    check_what_if(events, cluster.ranks.size(), catalogue_path(args->catalogue));
    const Planned planned = plan_for(cfg, cluster);
    const ht::plan::Plan& plan = planned.plan;
    std::printf("%s", ht::report::format_plan(plan).c_str());
    std::printf("%s", ht::report::local_sync_text(plan).c_str());
    std::printf("planned in %.3f s (model description %.3f s, costs and search %.3f s)\n",
                planned.model_s + planned.search_s, planned.model_s,
                planned.search_s);
    std::vector<Output> outputs;
    if (!args->json.empty()) outputs.push_back({args->json, ht::plan::plan_to_json(plan), "plan"});
    if (dump) print_schedule(plan, args->dump);
    const bool what_if = !events.empty();
    if (what_if)
      print_what_if(cfg, cluster, plan, args->catalogue, std::move(events), args->what_if_steps, args->svg, outputs);
    if ((!args->svg.empty() && !what_if) || !args->trace.empty()) {
      // A local plan's ranks run their groups' lists and the outer one, not the layout's.
      const ht::plan::SimResult sim = plan.local ? ht::plan::simulate_local_round(plan, planned.costs, cluster)
                                                 : ht::plan::simulate_plan(plan, planned.costs, cluster);
      if (!args->svg.empty() && !what_if)
        outputs.push_back({args->svg, ht::report::plan_to_svg(plan, sim.timeline), "plan picture"});
      if (!args->trace.empty())
        outputs.push_back({args->trace,
                           ht::report::to_chrome_trace(sim.timeline, "hetrain plan " + cfg.name +
                                                                         (plan.local ? " (predicted, one local round)"
                                                                                     : " (predicted)")),
                           "predicted timeline"});
    }
    write(outputs);
  });
}

}  // namespace hetrain_cli
