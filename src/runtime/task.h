// A Task ties a model to its data: it builds the model, serves training batches by
// stream position (so any consumer can take any share of a global batch, and a
// resumed run picks up exactly where it stopped), defines the loss, and evaluates.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "nn/block.h"
#include "nn/block_shape.h"

namespace ht::runtime {

struct Batch {
  Tensor inputs;   // images (n, 1, 28, 28) float32, or token ids (n, T) int32
  Tensor targets;  // labels (n) int32, or next-token ids (n, T) int32
};

struct EvalResult {
  std::vector<std::pair<std::string, double>> metrics;  // e.g. {"test_accuracy", 0.89}
  std::string line;                                      // one human-readable line
};

class Task {
 public:
  virtual ~Task() = default;

  // The device the task's batches are made on: the run's device, given at make_task.
  Backend& device() const { return device_; }

  virtual nn::Sequential build_model(uint64_t seed) const = 0;
  // Training samples in one epoch (turns train.epochs into steps).
  virtual int64_t train_size() const = 0;
  // Predictions per sample the loss averages over: 1 for a label, T for a sequence.
  virtual int64_t predictions_per_sample() const = 0;
  // The samples at stream positions [first, first + count) of the stream seeded by
  // train.seed: a pure function of the positions, so any consumer can take any share.
  virtual Batch train_batch(int64_t first, int64_t count) = 0;
  // The held-out set (capped by train.eval_max_samples), in eval_batch_size chunks, which
  // ranks holding the same weights may share (runtime/trainer_evaluation.cpp): how many
  // chunks there are;
  virtual int64_t eval_chunks() const = 0;
  // chunks [first, end)'s sums, eval_sums_per_chunk() of them a chunk, in chunk order;
  virtual std::vector<double> evaluate_chunks(const nn::Sequential& model, int64_t first, int64_t end) const = 0;
  virtual size_t eval_sums_per_chunk() const = 0;
  // and the metrics of every chunk's sums, in chunk order, added up in that order: the
  // same figures, to the bit, however the chunks were shared out.
  virtual EvalResult eval_result(const std::vector<double>& sums) const = 0;
  // The whole held-out set, on this process.
  EvalResult evaluate(const nn::Sequential& model) const {
    return eval_result(evaluate_chunks(model, 0, eval_chunks()));
  }

 protected:
  explicit Task(Backend& device) : device_(device) {}

 private:
  Backend& device_;
};

// A task that is trained and never evaluated (the tests' and benchmarks' workloads): its
// held-out set is empty.
class TrainingOnlyTask : public Task {
 public:
  int64_t eval_chunks() const override { return 0; }
  std::vector<double> evaluate_chunks(const nn::Sequential&, int64_t, int64_t) const override { return {}; }
  size_t eval_sums_per_chunk() const override { return 1; }
  EvalResult eval_result(const std::vector<double>&) const override { return {}; }

 protected:
  using Task::Task;
};

// The config's model (MLP, CNN or GPT) with fresh weights from `seed`, built without
// touching any data: the tasks build theirs with it, and so do the golden fixtures.
nn::Sequential build_model(const config::Config& cfg, uint64_t seed);

// The config's model described from its config alone, without a weight allocated or
// any data read: equal to nn::shape_of(build_model(cfg, seed)) for every seed, and what
// the planner plans from, so a model larger than this machine's memory can be planned.
// Throws ht::Error where build_model would (an image pooled below 2x2, say).
nn::ModelShape describe_model(const config::Config& cfg);

// Loads the data named by the config and returns the matching task, whose batches are
// made on `device` (the run's device; the CPU where only the model is wanted).
std::unique_ptr<Task> make_task(const config::Config& cfg, Backend& device);

// Cross-entropy summed over every prediction in the batch: logits (..., C) against
// int32 targets of the leading shape. Summing (not averaging) lets unequal shares of
// a global batch combine exactly; the caller divides by the global prediction count.
Tensor summed_loss(const Tensor& logits, const Tensor& targets);

}  // namespace ht::runtime
