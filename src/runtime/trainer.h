// Training from a config into a run directory: the loop, evaluation, metrics, progress,
// checkpoints and resume, for one process or for every rank of an MPI job. Each step is
// the executor's (runtime/executor.h) run of this rank's part of the plan; rank 0 owns
// the run directory, gathers the stages for evaluation and writes whole-model
// checkpoints, which any world size can resume from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/allocator.h"
#include "config/config.h"
#include "core/error.h"
#include "plan/plan.h"
#include "runtime/fault_injection.h"
#include "runtime/rebalancer.h"

namespace ht::runtime {

struct TrainOptions {
  bool resume = false;              // continue from the newest valid checkpoint
  std::optional<int64_t> steps;     // overrides train.steps / train.epochs
  std::optional<uint64_t> seed;     // overrides train.seed
  std::optional<std::string> run_dir;  // overrides run.dir
  bool quiet = false;               // no progress bar or log lines
  bool terminal = false;            // rank 0's stdout reaches a terminal: a bar, not lines
  // Stop (with a checkpoint) after this many steps of this invocation; the schedule
  // still spans the whole run, so --resume continues it as if never stopped.
  std::optional<int64_t> stop_after;
  // How the caller continues a stopped run, appended to the messages that say one can
  // ("continue with --resume" from the command line).
  std::string resume_hint;
  std::string timeline;   // write one step's measured Chrome trace here (rank 0)
  std::string plan_json;  // the plan as a file, kept in the run directory as plan.json
  // Rebalances the shares every parallel.rebalance_every steps when set (a job that
  // planned for itself); empty: the plan runs as given.
  RebalanceFn rebalance;
  std::vector<Fault> faults;  // --inject, a testing aid (runtime/fault_injection.h)
};

// Ctrl-C during training: a checkpoint was written at the step boundary it stopped at.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int status) : Error(what), status_(status) {}
  int status() const { return status_; }  // 128 + the signal: 130 (SIGINT), 143 (SIGTERM)

 private:
  int status_;
};
// The same where every rank of the job stopped at that step, having agreed on it through
// rank 0's answers (under deadline, by ending the reduction's chain there): each can end
// through MPI_Finalize, with no rank ending the others.
class InterruptedTogether : public Interrupted {
 public:
  using Interrupted::Interrupted;
};

struct TrainSummary {
  int64_t steps = 0;
  double wall_s = 0;
  std::string run_dir;
};

// Applies the overrides to the config (validating them like the config itself).
void apply_overrides(config::Config& cfg, const TrainOptions& opts);

// Chooses this process's device from the config's "device" (its entry for `world_rank`
// where it lists one per rank: config::device_of_rank) and its MPI local rank
// (backend/cuda/device_select.h) and makes it the run's device (backend/registry.h).
// Returns the note the choice leaves ("auto" fell back to the CPU, or which GPU "cuda"
// took), empty where there is none. Throws ht::Error, before any work, where the config
// asks for a GPU that this machine or build does not have. train() calls it too; calling
// it again with the same config changes nothing.
std::string select_run_device(const config::Config& cfg, int world_rank, int world_size, int local_rank);

// The share of the host's available memory a one-process run leaves outside its cap:
// for what is not a tensor (the data set's arrays, the libraries' buffers) and for
// other processes' growth.
inline constexpr double kHostReserve = 0.1;
// Caps the host's allocator `a` at (1 - kHostReserve) of `available` (the host's free
// memory now), where it has no cap (an emulated one stays) and `available` is known (not
// 0). Returns the cap set, 0 where none.
size_t cap_host_memory(Allocator& a, size_t available);

// Collective under MPI: every rank calls it with the same config and plan. Without a
// plan (one process only) the whole model trains in train.micro_batches micro-batches,
// its host memory capped on the CPU (cap_host_memory). Many ranks agree on Ctrl-C in the
// step's reduction where it spans every rank under sync, at a round end under local, at
// the signalled rank's step under deadline, else on the step after the next log step.
TrainSummary train(config::Config cfg, const TrainOptions& opts,
                   std::optional<plan::Plan> plan = std::nullopt);

// Evaluates the model of `cfg` with the parameters in `checkpoint`; returns the
// result as a JSON object (text) and prints a line unless quiet.
std::string evaluate_checkpoint(const config::Config& cfg, const std::string& checkpoint);

}  // namespace ht::runtime
