// `hetrain train`: one process, or every rank of an MPI job executing a plan; and
// `hetrain eval` (one process).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/planning.h"
#include "cli/whole_number.h"
#include "comm/communicator.h"
#include "comm/launch.h"
#include "comm/watchdog.h"
#include "config/config.h"
#include "core/error.h"
#include "plan/deadline_plan.h"
#include "plan/plan_json.h"
#include "plan/policy_plan.h"
#include "plan/rebalance.h"
#include "plan/resumed_shares.h"
#include "report/local_sync_text.h"
#include "report/plan_table.h"
#include "report/plan_text.h"
#include "report/progress.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/fault_injection.h"
#include "runtime/run_dir.h"
#include "runtime/task.h"
#include "runtime/trainer.h"

namespace hetrain_cli {

namespace {

struct TrainArgs {
  std::string config;
  std::string run_dir;
  std::string plan, cluster, timeline;
  bool resume = false;
  int64_t steps = 0;
  int64_t stop_after = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  bool quiet = false;
  std::vector<std::string> inject;
};

// Under mpirun a rank's stdout is a pseudo-terminal that the launcher, its parent on
// this host, copies to the launcher's own stdout: where that goes decides between bar
// and lines. On another host the parent is the launcher's daemon, which is no terminal.
bool stdout_reaches_terminal() {
  const bool launched = ht::comm::launch().launched;
  return ht::report::reaches_terminal(
      STDOUT_FILENO, launched ? "/proc/" + std::to_string(getppid()) + "/fd/1" : std::string());
}

// Every rank must train the same config, with the same options that act on every rank
// (`options`): compare the resolved configs' hashes, and those options as written. Ranks
// started with different command lines (mpirun's `:`), one with --resume and one
// without, were found only as replicas that diverged, steps later.
void check_same_config(ht::comm::Communicator& world, const ht::config::Config& cfg, const std::string& options) {
  const std::vector<std::string> items =
      world.allgather(ht::config::config_hash(cfg) + " " + cfg.source_path + "\n" + options,
                      ht::comm::Timeout(cfg.parallel.peer_timeout_s), "the config check (every rank's config hash)");
  auto part = [](const std::string& item, bool second) {
    const size_t cut = item.find('\n');
    return second ? item.substr(cut + 1) : item.substr(0, cut);
  };
  for (size_t r = 1; r < items.size(); ++r) {
    if (part(items[r], false) != part(items[0], false))
      throw ht::config::ConfigError("the ranks disagree on the config: rank 0 has " + part(items[0], false) +
                                    " and rank " + std::to_string(r) + " has " + part(items[r], false) +
                                    " (hash and file); expected every rank to train the same config");
    if (part(items[r], true) != part(items[0], true))
      throw ht::config::ConfigError("the ranks disagree on the options: rank 0 has '" + part(items[0], true) +
                                    "' and rank " + std::to_string(r) + " has '" + part(items[r], true) +
                                    "'; expected every rank started with the same options");
  }
}

// On --resume, where the job rebalances (its shares move off the plan's as it measures):
// the shares and micro-batch counts that the checkpoint it resumes from (the newest that
// verifies, as the resume picks it) holds, where its world and stages are this plan's,
// each of its replicas is one of this plan's (a new probe may order equal ranks
// otherwise: the shares follow the ranks) and they fit (plan::with_resumed_shares), so
// that the resumed job need not find them again; else the plan's, a note saying why.
// Rank 0 verifies that checkpoint here and again in the resume (its whole file read
// twice), so that the shares are never those of a file the resume passes over.
void resume_shares(const ht::config::Config& cfg, ht::plan::Plan& plan, const ht::plan::BlockCosts& costs,
                   const ht::plan::ClusterModel& cluster) {
  // Where the checks move shares: not an equal split, nor a deadline plan of stages.
  if (plan.local || plan.layout.replicas.size() < 2 || plan.strategy == ht::plan::Strategy::equal ||
      (plan.sync_policy == ht::plan::SyncPolicy::deadline && plan.stage_ranges.size() > 1))
    return;
  std::optional<ht::runtime::Checkpoint> loaded;
  try {
    std::vector<std::string> skipped;  // the resume warns of each
    loaded = ht::runtime::CheckpointDir(cfg.run.dir + "/checkpoints").load_newest_valid(skipped, false);
  } catch (const ht::Error&) {
    return;  // none verifies: the resume says so
  }
  if (!loaded) return;
  const auto it = loaded->metadata.find("shares");
  if (it == loaded->metadata.end()) return;
  try {
    ht::plan::ResumedShares got = ht::plan::shares_for_plan(plan, it->second);
    // train.micro_batches set: its counts are the user's (a resume may lower them), not
    // the checkpoint's, which trials may have made finer.
    if (cfg.train.micro_batches != 1)
      for (size_t r = 0; r < got.samples.size(); ++r)
        got.micro_batches[r] = static_cast<int>(std::min<int64_t>(plan.layout.micro_batches[r], got.samples[r]));
    if (got.samples == plan.layout.samples && got.micro_batches == plan.layout.micro_batches) return;
    plan = ht::plan::with_resumed_shares(plan, got.samples, got.micro_batches, costs, cluster);
    std::string text;
    for (size_t r = 0; r < got.samples.size(); ++r)
      text += (r ? "/" : "") + std::to_string(got.samples[r]) +
              (got.micro_batches[r] > 1 ? " in " + std::to_string(got.micro_batches[r]) : "");
    std::fprintf(stderr,
                 "hetrain: note: resuming with the shares %s holds: %s samples per replica (in micro-batches where "
                 "more than one)\n",
                 loaded->path.c_str(), text.c_str());
  } catch (const ht::Error& e) {
    std::fprintf(stderr, "hetrain: note: the plan's shares, not those of %s: %s\n", loaded->path.c_str(), e.what());
  }
}

// The plan every rank executes: a plan file (checked against this job and config) run
// as given, or the planner's over the given or probed cluster, made on rank 0 and shared
// so that all ranks run the same one; then the job rebalances it as it measures itself
// (parallel.rebalance_every), with rank 0 deciding from the planner's costs.
struct JobPlan {
  ht::plan::Plan plan;
  ht::runtime::RebalanceFn rebalance;
};

JobPlan plan_for_job(const TrainArgs& a, const ht::config::Config& cfg, ht::comm::Communicator& world) {
  if (!a.plan.empty()) {
    ht::plan::Plan p = ht::plan::read_plan(a.plan);
    if (p.world_size != world.size())
      throw ht::config::ConfigError(a.plan + ": the plan is for " + std::to_string(p.world_size) +
                                    " ranks but this job has " + std::to_string(world.size()) +
                                    "; plan again with this job's ranks");
    const std::string hash = ht::config::plan_hash(cfg);
    if (p.config_hash != hash)
      throw ht::config::ConfigError(a.plan + ": the plan was made for config '" + p.config_name +
                                    "' (hash " + p.config_hash + ") but this run's config '" + cfg.name +
                                    "' hashes to " + hash + "; plan again for this config");
    // The hash covers the config, not the plan file's own figures: a plan edited by hand
    // must still train the config's batch, or every loss and step would be of another.
    if (p.global_batch != cfg.train.batch_size)
      throw ht::config::ConfigError(a.plan + ": global_batch is " + std::to_string(p.global_batch) +
                                    " but this run's train.batch_size is " + std::to_string(cfg.train.batch_size) +
                                    "; expected the plan of this config (plan again)");
    // Nor may it run another policy or strategy than the config asks (the hash covers the
    // config's fields, not the file's): the run's records would contradict its config.
    const ht::config::SyncPolicy asked = cfg.parallel.sync_policy();
    const bool policy_ok =
        p.sync_policy == ht::plan::SyncPolicy::deadline ? asked == ht::config::SyncPolicy::deadline
        : p.sync_policy == ht::plan::SyncPolicy::local
            ? asked == ht::config::SyncPolicy::local || !cfg.parallel.sync  // auto may take local
            : asked == ht::config::SyncPolicy::sync;
    if (!policy_ok)
      throw ht::config::ConfigError(a.plan + ": sync_policy is " + ht::plan::to_string(p.sync_policy) +
                                    " but this run's parallel.sync is " +
                                    (cfg.parallel.sync ? ht::config::to_string(asked) : std::string("not given (sync)")) +
                                    "; expected the plan of this config (plan again)");
    using PS = ht::config::ParallelStrategy;
    using S = ht::plan::Strategy;
    const PS want = cfg.parallel.strategy;
    // (auto plans data, pipeline or hybrid layouts; an equal split only when asked.)
    const bool strategy_ok = (want == PS::automatic && p.strategy != S::equal) ||
                             (want == PS::data && p.strategy == S::data) ||
                             (want == PS::pipeline && (p.strategy == S::pipeline ||  // or one rank's one stage
                                                       (p.strategy == S::data && p.stage_ranges.size() == 1))) ||
                             (want == PS::equal && p.strategy == S::equal);
    if (!strategy_ok)
      throw ht::config::ConfigError(a.plan + ": strategy is " + ht::plan::to_string(p.strategy) +
                                    " but this run's parallel.strategy is " + ht::config::to_string(want) +
                                    "; expected the plan of this config (plan again)");
    if (p.sync_policy == ht::plan::SyncPolicy::deadline) {
      try {
        ht::plan::check_deadline_ranks(p);
      } catch (const ht::Error& e) {
        throw ht::config::ConfigError(a.plan + ": " + e.what());
      }
    }
    return {std::move(p), {}};
  }
  // A probe file needs no device catalogue (only synth: specs do, and train refuses them).
  const ht::plan::ClusterModel cluster = cluster_for(a.cluster, "", cfg, world, true);
  std::string text;
  ht::plan::BlockCosts costs;  // rank 0's, the only rank that decides
  std::optional<ht::plan::Plan> all_ranks;
  if (world.rank() == 0) {
    Planned planned = plan_for(cfg, cluster, true);
    if (a.resume && cfg.parallel.rebalance_every > 0) resume_shares(cfg, planned.plan, planned.costs, cluster);
    text = ht::plan::plan_to_json(planned.plan);
    costs = std::move(planned.costs);
    all_ranks = std::move(planned.all_ranks);
  }
  // The others wait here while rank 0 plans: parallel.peer_timeout_s must cover that too.
  const std::string plan_text =
      world.broadcast(text, 0, ht::comm::Timeout(cfg.parallel.peer_timeout_s), "the plan broadcast");
  JobPlan job{ht::plan::plan_from_json(plan_text, "the plan from rank 0"), {}};
  if (cfg.parallel.rebalance_every > 0 && !job.plan.local) {
    const bool move_shares = cfg.parallel.strategy != ht::config::ParallelStrategy::equal;
    // Under deadline the step's leader decides, and any member may lead: every rank has
    // the costs. Its records carry shares alone: no micro-batch trial, no idle ranks tried.
    const bool deadline = job.plan.sync_policy == ht::plan::SyncPolicy::deadline;
    if (deadline && world.rank() != 0)
      costs = ht::plan::planner_input_for(cfg, ht::runtime::describe_model(cfg), cluster).costs;
    if (deadline) all_ranks.reset();
    auto tuner = std::make_shared<ht::plan::ShareTuner>(job.plan, std::move(costs), cluster,
                                                        move_shares, std::move(all_ranks), !deadline);
    job.rebalance = [tuner](const ht::plan::Plan& current, const std::vector<ht::plan::RankMeasure>& measured) {
      return tuner->check(current, measured);
    };
  }
  return job;
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train from a config into a run directory");
  cmd->add_option("config", args->config, "Config file (JSON); see configs/")->required()->check(non_empty_path());
  auto* run_dir = cmd->add_option("--run-dir", args->run_dir, "Run directory (default: run.dir, or runs/<config name>)");
  cmd->add_flag("--resume", args->resume, "Continue from the newest valid checkpoint of the run directory");
  constexpr int64_t kMost = std::numeric_limits<int64_t>::max();
  auto* steps = cmd->add_option("--steps", args->steps,
                                "Train this many steps in total (overrides train.steps/epochs)")
                    ->transform(whole_number<int64_t>(1, ht::config::TrainConfig::kMaxSteps));
  auto* stop_after = cmd->add_option("--stop-after", args->stop_after,
                  "Stop with a checkpoint after this many steps of this invocation; --resume continues")
                         ->transform(whole_number<int64_t>(1, kMost));
  auto* seed = cmd->add_option("--seed", args->seed, "Override train.seed")
                   ->transform(whole_number<uint64_t>(0, std::numeric_limits<uint64_t>::max()));
  cmd->add_flag("--quiet,-q", args->quiet, "No progress bar or log lines");
  cmd->add_option("--plan", args->plan, "Execute this plan (from `hetrain plan --json`)")->check(non_empty_path());
  cmd->add_option("--cluster", args->cluster,
                  "Plan over this probe file (default under mpirun: quick-probe the job)")
      ->check(non_empty_path());
  cmd->add_option("--timeline", args->timeline, "Write one step's measured timeline here (Chrome trace JSON)");
  cmd->add_option("--inject", args->inject,
                  "Testing aid, repeatable: stall:rank=R,at=STEP,for=SECONDS | nan:rank=R,at=STEP[,steps=N] | "
                  "slow:rank=R,at=STEP,factor=F[,steps=N] | scale:rank=R,at=STEP,factor=F[,steps=N] (see docs/faults.md)")
      ->allow_extra_args(false);
  refuse_option_names_as_values(cmd);
  cmd->callback([args, seed, steps, stop_after, run_dir] {
    // Training runs on the devices it is started on; a synth: cluster describes others, so
    // a plan over it would give these ranks work sized for hardware they are not.
    if (args->cluster.rfind("synth:", 0) == 0)
      throw ht::config::ConfigError(
          "--cluster " + args->cluster + ": train runs on the devices it is started on, not on a "
          "hypothetical cluster; expected a probe file (`hetrain probe --json`) or no --cluster "
          "(the job probes itself); use `hetrain plan --cluster " + args->cluster +
          "` to plan for hardware you do not have");
    ht::config::Config cfg = ht::config::load_config(args->config);
    ht::runtime::TrainOptions opts;
    opts.resume = args->resume;
    opts.quiet = args->quiet;
    opts.terminal = stdout_reaches_terminal();
    // The flags are checked like the config itself: before any work starts.
    if (steps->count() && args->steps < 1)
      throw ht::config::ConfigError("--steps " + std::to_string(args->steps) +
                                    " is out of range; expected at least 1");
    if (stop_after->count() && args->stop_after < 1)
      throw ht::config::ConfigError("--stop-after " + std::to_string(args->stop_after) +
                                    " is out of range; expected at least 1 step");
    if (steps->count()) opts.steps = args->steps;
    if (stop_after->count()) opts.stop_after = args->stop_after;
    opts.resume_hint = "continue with --resume";
    if (seed->count()) opts.seed = args->seed;
    if (run_dir->count() && args->run_dir.empty())
      throw ht::config::ConfigError("--run-dir is empty; expected a directory path");
    if (!args->run_dir.empty()) opts.run_dir = args->run_dir;
    check_outputs({{"--timeline", args->timeline}});  // written after some steps: its path is checked now
    try {
      ht::runtime::apply_overrides(cfg, opts);
    } catch (const ht::Error& e) {
      throw ht::config::ConfigError(e.what());
    }
    std::vector<std::pair<std::string, std::string>> inputs{
        {"the config", args->config},
        {"the plan file", args->plan},
        {"the cluster file", args->cluster.rfind("synth:", 0) == 0 ? std::string() : args->cluster}};
    for (const char* name : ht::runtime::RunDir::kRunFiles)
      inputs.emplace_back(std::string("the run's ") + name, cfg.run.dir + "/" + name);
    check_not_an_input("--timeline", args->timeline, inputs);
    opts.timeline = args->timeline;
    try {
      for (const std::string& spec : args->inject) opts.faults.push_back(ht::runtime::parse_fault(spec));
    } catch (const ht::config::ConfigError& e) {
      throw ht::config::ConfigError(std::string("--inject: ") + e.what());
    }
    // A fault after the last step would do nothing and say nothing (with epochs the steps
    // are known only with the data: not checked then).
    if (cfg.train.steps)
      for (const ht::runtime::Fault& f : opts.faults)
        if (f.at > *cfg.train.steps)
          throw ht::config::ConfigError("--inject " + f.spec + ": at=" + std::to_string(f.at) +
                                        " is after the run's last step " + std::to_string(*cfg.train.steps) +
                                        "; expected a step from 1 to " + std::to_string(*cfg.train.steps));
    if (!args->plan.empty() && !args->cluster.empty())
      throw ht::config::ConfigError("--cluster " + args->cluster + " with --plan " + args->plan +
                                    ": the plan was made over its own cluster, so the cluster file would be unused; "
                                    "expected one of them");
    // MPI's start-up, the communicator splits and MPI_Finalize cannot time out; they are
    // bounded by the same limit as every other wait on a peer (comm/watchdog.h).
    ht::comm::set_blocking_call_limit(std::chrono::duration<double>(cfg.parallel.peer_timeout_s));
    ht::runtime::stall_before_start(opts.faults, ht::comm::launcher_rank());
    ht::comm::Communicator& world = ht::comm::world();
    // The device first, before the data, the probe or the run directory: a config asking
    // for a GPU this machine lacks fails here, and "auto" says what it chose.
    const std::string device_note =
        ht::runtime::select_run_device(cfg, world.rank(), world.size(), world.local_rank());
    if (!device_note.empty() && !args->quiet) {
      if (world.size() > 1) std::printf("rank %d: ", world.rank());
      std::printf("%s\n", device_note.c_str());
    }
    try {
      ht::runtime::check_fault_ranks(opts.faults, world.size());
    } catch (const ht::config::ConfigError& e) {
      throw ht::config::ConfigError(std::string("--inject: ") + e.what());
    }
    if (world.size() == 1 && args->plan.empty() && args->cluster.empty()) {
      ht::runtime::train(std::move(cfg), opts);
      return;
    }
    {
      std::string options;  // those that act on every rank; --timeline and -q are rank 0's
      if (args->resume) options += " --resume";
      if (stop_after->count()) options += " --stop-after " + std::to_string(args->stop_after);
      // Whether given, not the path: a host may keep the file elsewhere.
      if (!args->plan.empty()) options += " --plan FILE";
      if (!args->cluster.empty()) options += " --cluster FILE";
      for (const std::string& spec : args->inject) options += " --inject " + spec;
      check_same_config(world, cfg, options.empty() ? options : options.substr(1));
    }
    JobPlan job = plan_for_job(*args, cfg, world);
    ht::plan::Plan& plan = job.plan;
    opts.plan_json = ht::plan::plan_to_json(plan);
    opts.rebalance = std::move(job.rebalance);
    // The groups' section too, which the table's share column points to under local.
    if (world.rank() == 0 && !args->quiet)
      std::printf("%s%s\n", ht::report::format_plan(plan).c_str(), ht::report::local_sync_text(plan).c_str());
    const ht::plan::RankPlan mine = plan.ranks[static_cast<size_t>(world.rank())];
    try {
      ht::runtime::train(std::move(cfg), opts, std::move(plan));
    } catch (const ht::OutOfMemory& e) {
      // The plan fitted the memory it was told about; this rank holds less.
      // The job's first plan: a rebalance may have moved the share since (rank 0's
      // metrics.jsonl has each).
      throw ht::Error(std::string(e.what()) + "; the plan the job started with gave this rank " +
                      std::to_string(mine.samples) + " samples in " + std::to_string(mine.micro_batches) +
                      " micro-batches (memory strategy: " + ht::report::memory_strategies_text(mine.memory_strategies) +
                      "). Plan with this rank's real memory (`hetrain probe` reads its cap) so the " +
                      "planner can choose recomputation, more micro-batches or optimizer sharding");
    }
  });
}

void register_eval(CLI::App& app) {
  auto config = std::make_shared<std::string>();
  auto checkpoint = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("eval", "Evaluate a checkpoint on the config's held-out data");
  cmd->add_option("config", *config, "Config file (JSON) the checkpoint was trained with")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--checkpoint", *checkpoint, "Checkpoint file (.safetensors)")->required()->check(non_empty_path());
  refuse_option_names_as_values(cmd);
  cmd->callback([config, checkpoint] {
    // Refused before MPI is up where the launcher says how many ranks there are: every
    // rank then exits on its own, where aborting MPI from all at once upsets the launcher.
    if (const ht::comm::Launch l = ht::comm::launch(); l.size > 1)
      throw ht::Error("hetrain eval runs as one process; this job has " + std::to_string(l.size) +
                      " ranks: run it without mpirun or srun");
    if (ht::comm::world().size() > 1)
      throw ht::Error("hetrain eval runs as one process; this job has " +
                      std::to_string(ht::comm::world().size()) + " ranks: run it without mpirun or srun");
    ht::config::Config cfg = ht::config::load_config(*config);
    std::printf("%s\n", ht::runtime::evaluate_checkpoint(cfg, *checkpoint).c_str());
  });
}

}  // namespace hetrain_cli
