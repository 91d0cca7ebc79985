// The records a training run writes to metrics.jsonl (besides the rebalancing checks',
// runtime/rebalancer.h), and the per-rank figures the ranks exchange at every log step
// to make them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/guard.h"
#include "runtime/task.h"

namespace ht::runtime {

// One rank's figures over the steps since the last log step.
struct Window {
  double loss_sum = 0, compute_s = 0, comm_s = 0, wall_s = 0;
  int64_t loss_samples = 0;  // the samples loss_sum is over (StepResult::loss_samples)
  int stop_signal = 0;  // the signal that asked this rank to stop, 0: none
  std::string checksum;  // of the rank's parameters after the window's last step
  // The bad-node guard's events in the window's steps, each with its step (1-based).
  std::vector<std::pair<int64_t, GuardEvent>> guard;
  std::string to_text() const;
  static Window from_text(const std::string& text);
};

// The slowest rank's seconds in a log window: what its samples/s are over.
double window_wall_s(const std::vector<Window>& ranks);

// {"type": "train", step, loss, lr, samples_per_s over the slowest rank's window,
// wall_s since the start}, plus each rank's compute, communication and idle seconds when
// there is more than one rank.
std::string train_record(int64_t step, float lr, double loss, const std::vector<Window>& ranks,
                         int64_t steps, int64_t batch_size, double elapsed_s);

// {"type": "eval", step, and the evaluation's metrics}.
std::string eval_record(int64_t step, const EvalResult& r);

// Throws ht::Error where a metric of the evaluation is not finite: a diverged model
// (weights finite but so large that the forward overflows) whose every later update the
// guard skipped, which ended the run with "success" and a NaN loss. `what` starts the
// message ("training diverged by step 20", "checkpoint X").
// What to change where training diverged: the learning rates that move the weights (under
// local the outer step's too: parallel.outer_lr 1e30 was blamed on the inner rate), or clipping.
std::string divergence_advice(bool local);
void check_finite_eval(const EvalResult& r, const std::string& what,
                       const std::string& advice = divergence_advice(false));

}  // namespace ht::runtime
