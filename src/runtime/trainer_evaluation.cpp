// Rank 0's evaluation of the whole model during and after training, and the check before
// the first step that it fits rank 0's memory cap.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/graph.h"
#include "core/units.h"
#include "plan/block_costs.h"
#include "runtime/stage_gather.h"
#include "runtime/trainer_run.h"

namespace ht::runtime::trainer_run {

namespace {

// Rank 0's model for the scope of an evaluation: blocks whose weights are in host memory
// (other stages', nn::Sequential::stream_weights_to) run on `device` with a copy of them.
class Streamed {
 public:
  Streamed(nn::Sequential& model, Backend& device) : model_(model) { model_.stream_weights_to(&device); }
  ~Streamed() { model_.stream_weights_to(nullptr); }
  Streamed(const Streamed&) = delete;
  Streamed& operator=(const Streamed&) = delete;

 private:
  nn::Sequential& model_;
};

}  // namespace

// Rank 0 evaluates the whole model in batches of train.eval_batch_size, which under a
// memory cap can need far more than a training step (at 1000 samples the CNN's first
// convolution's output alone is 100 MB). So before the first step it refuses a cap that
// the evaluation would exceed, with the largest batch that fits, instead of failing at
// the first evaluation. What it needs beside the state it holds is the larger of two
// figures, each linear in the batch: the planner's (plan::eval_bytes_per_sample, exact
// per sample on the CPU, so a plan that says the evaluation fits is not refused here),
// and no-grad forwards of 4 and 8 samples measured here (their inputs included) with the
// batch's targets, for what a device's libraries allocate beyond the planner's figure.
void Run::check_evaluation_fits() {
  Backend& device = task_->device();
  Allocator& memory = device.allocator();
  if (memory.cap() == 0) return;
  const int64_t batch = config::eval_batch(cfg_.train);
  const nn::Block& first = model_.block(0);
  auto forward_bytes = [&](int64_t n) {
    Shape shape = first.sample_input_shape();
    shape.insert(shape.begin(), n);
    const size_t before = memory.live_bytes();
    memory.reset_peak();
    NoGradGuard no_grad;
    Tensor h = first.input_dtype() == DType::i32
                   ? Tensor::from_ints(std::vector<int32_t>(numel(shape), 0), shape, device)
                   : Tensor::zeros(shape, device);
    h = model_.forward(h);  // streamed as evaluate() does
    return static_cast<double>(memory.peak_bytes() - before);
  };
  Streamed streamed(model_, device);
  model_.set_training(false);
  double at4 = 0, per_sample = 0;
  // A batch of at most 8 is measured itself, and from 1 sample where at most 4, so that
  // what fits is known below it too (a message said 8 samples for an eval_batch_size of 1).
  const int64_t small = batch <= 4 ? 1 : 4, second = std::min<int64_t>(batch, 8);
  int64_t trying = small;
  try {
    at4 = forward_bytes(small);
    trying = second;
    per_sample = second > small ? (forward_bytes(second) - at4) / static_cast<double>(second - small) : 0;
  } catch (const OutOfMemory& e) {
    fail("rank 0 cannot evaluate the whole model in batches of even ", trying, " samples under its cap (", e.what(),
         "); ",
         trying == small ? std::string("give rank 0 more memory")
                         : "set train.eval_batch_size to " + std::to_string(small) + " or give rank 0 more memory");
  }
  model_.set_training(true);
  const nn::ModelShape shape = nn::shape_of(model_);
  const double targets = 4 * plan::predictions_per_sample(shape);  // int32 each
  // need(n) = in_use + max(a + b n) over the two figures.
  const double described = plan::eval_bytes_per_sample(shape, device.kind() != DeviceKind::cpu);
  const std::pair<double, double> lines[] = {{plan::BlockCosts::kEvalFixedBytes, described},
                                             {at4 - per_sample * static_cast<double>(small), per_sample + targets}};
  // What the requests may take: blocks larger than their requests may hold the rest.
  const double in_use = static_cast<double>(memory.live_bytes()), whole = static_cast<double>(memory.cap()),
               cap = static_cast<double>(memory.cap() - Allocator::slack_allowance(memory.cap()));
  double need = 0, fits = std::numeric_limits<double>::infinity();
  for (const auto& [a, b] : lines) {
    need = std::max(need, in_use + a + b * static_cast<double>(batch));
    if (b > 0) fits = std::min(fits, std::floor((cap - in_use - a) / b));
  }
  if (need <= cap) return;
  fail("rank 0 would run out of memory evaluating the whole model in batches of ", batch, ": about ",
       format_bytes(need), " with the ", format_bytes(in_use), " it holds for training, ", format_bytes(need - cap),
       " more than the ", format_bytes(cap), " its cap of ", format_bytes(whole),
       " leaves for them (a 64th is kept for the allocator's blocks); ",
       fits >= 1 ? "set train.eval_batch_size to at most " + std::to_string(static_cast<int64_t>(fits))
                 : std::string("even one sample does not fit: give rank 0 more memory"));
}


// Collective. Rank 0 evaluates the whole model (gathered from the stages); others get
// nothing.
std::optional<EvalResult> Run::evaluate() {
  if (local_) local_->flush();  // every rank then holds the outer weights
  else if (multi()) gather_to_root(plan_, *executor_, model_, world_, cfg_.train.optimizer, false, peer_timeout(), "the evaluation gather");
  if (!root_) return std::nullopt;
  model_.set_training(false);
  EvalResult r;
  try {
    NoGradGuard no_grad;
    Streamed streamed(model_, task_->device());  // the blocks of other stages, from host memory
    r = task_->evaluate(model_);
  } catch (const OutOfMemory& e) {  // not the plan's to fix: say what is
    const int64_t batch = config::eval_batch(cfg_.train);
    fail("rank 0 ran out of memory evaluating the whole model in batches of ", batch, " (", e.what(),
         "); set train.eval_batch_size below ", batch);
  }
  model_.set_training(true);
  return r;
}

}  // namespace ht::runtime::trainer_run
