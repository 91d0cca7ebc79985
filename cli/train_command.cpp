// `hetrain train` and `hetrain eval`: one process, from a config.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "runtime/trainer.h"

namespace hetrain_cli {

namespace {

// Multi-rank training (uneven shares, pipeline stages) is not built yet: under mpirun
// every rank would train the whole model alone into the same run directory.
void require_single_process(const char* verb) {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size && std::atoi(size) > 1)
    throw ht::Error(std::string("hetrain ") + verb + " runs as one process for now; this job has " +
                    size + " ranks. Multi-rank training is not implemented yet: run it without mpirun");
}

struct TrainArgs {
  std::string config;
  std::string run_dir;
  bool resume = false;
  int64_t steps = 0;
  int64_t stop_after = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  bool quiet = false;
};

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train from a config into a run directory");
  cmd->add_option("config", args->config, "Config file (JSON); see configs/")->required();
  cmd->add_option("--run-dir", args->run_dir, "Run directory (default: run.dir, or runs/<config name>)");
  cmd->add_flag("--resume", args->resume, "Continue from the newest valid checkpoint of the run directory");
  cmd->add_option("--steps", args->steps, "Train this many steps in total (overrides train.steps/epochs)");
  cmd->add_option("--stop-after", args->stop_after,
                  "Stop with a checkpoint after this many steps of this invocation; --resume continues");
  auto* seed = cmd->add_option("--seed", args->seed, "Override train.seed");
  cmd->add_flag("--quiet,-q", args->quiet, "No progress bar or log lines");
  cmd->callback([args, seed] {
    require_single_process("train");
    ht::config::Config cfg = ht::config::load_config(args->config);
    ht::runtime::TrainOptions opts;
    opts.resume = args->resume;
    opts.quiet = args->quiet;
    if (args->steps) opts.steps = args->steps;
    if (args->stop_after) opts.stop_after = args->stop_after;
    if (seed->count()) opts.seed = args->seed;
    if (!args->run_dir.empty()) opts.run_dir = args->run_dir;
    // Overrides are checked like the config itself: before any work starts.
    try {
      ht::runtime::apply_overrides(cfg, opts);
    } catch (const ht::Error& e) {
      throw ht::config::ConfigError(e.what());
    }
    ht::runtime::train(std::move(cfg), opts);
  });
}

void register_eval(CLI::App& app) {
  auto config = std::make_shared<std::string>();
  auto checkpoint = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("eval", "Evaluate a checkpoint on the config's held-out data");
  cmd->add_option("config", *config, "Config file (JSON) the checkpoint was trained with")->required();
  cmd->add_option("--checkpoint", *checkpoint, "Checkpoint file (.safetensors)")->required();
  cmd->callback([config, checkpoint] {
    require_single_process("eval");
    ht::config::Config cfg = ht::config::load_config(*config);
    std::printf("%s\n", ht::runtime::evaluate_checkpoint(cfg, *checkpoint).c_str());
  });
}

}  // namespace hetrain_cli
