// Single-process training from a config into a run directory: the loop, evaluation,
// metrics, progress, checkpoints and resume. The multi-rank executor reuses its
// pieces (task, checkpoints, run directory, metrics).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"
#include "core/error.h"

namespace ht::runtime {

struct TrainOptions {
  bool resume = false;              // continue from the newest valid checkpoint
  std::optional<int64_t> steps;     // overrides train.steps / train.epochs
  std::optional<uint64_t> seed;     // overrides train.seed
  std::optional<std::string> run_dir;  // overrides run.dir
  bool quiet = false;               // no progress bar or log lines
  // Stop (with a checkpoint) after this many steps of this invocation; the schedule
  // still spans the whole run, so --resume continues it as if never stopped.
  std::optional<int64_t> stop_after;
};

// Ctrl-C during training: a checkpoint was written at the step boundary it stopped at.
class Interrupted : public Error {
 public:
  using Error::Error;
};

struct TrainSummary {
  int64_t steps = 0;
  double wall_s = 0;
  std::string run_dir;
};

// Applies the overrides to the config (validating them like the config itself).
void apply_overrides(config::Config& cfg, const TrainOptions& opts);

TrainSummary train(config::Config cfg, const TrainOptions& opts);

// Evaluates the model of `cfg` with the parameters in `checkpoint`; returns the
// result as a JSON object (text) and prints a line unless quiet.
std::string evaluate_checkpoint(const config::Config& cfg, const std::string& checkpoint);

}  // namespace ht::runtime
