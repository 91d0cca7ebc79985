// The evaluation of the whole model during and after training (rank 0's, with a part of
// the held-out set on each rank that holds the same weights), and the check before the
// first step that it fits the memory caps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/graph.h"
#include "core/units.h"
#include "plan/block_costs.h"
#include "plan/local_plan.h"
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
std::string Run::evaluation_misfit() {
  Backend& device = task_->device();
  Allocator& memory = device.allocator();
  if (memory.cap() == 0) return "";
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
    model_.set_training(true);
    return "rank 0 cannot evaluate the whole model in batches of even " + std::to_string(trying) +
           " samples under its cap (" + e.what() + "); " +
           (trying == small ? std::string("give rank 0 more memory")
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
  if (need <= cap) return "";
  return "rank 0 would run out of memory evaluating the whole model in batches of " + std::to_string(batch) +
         ": about " + format_bytes(need) + " with the " + format_bytes(in_use) + " it holds for training, " +
         format_bytes(need - cap) + " more than the " + format_bytes(cap) + " its cap of " + format_bytes(whole) +
         " leaves for them (a 64th is kept for the allocator's blocks); " +
         (fits >= 1 ? "set train.eval_batch_size to at most " + std::to_string(static_cast<int64_t>(fits))
                    : std::string("even one sample does not fit: give rank 0 more memory"));
}

// Collective, before the first step. Every rank that holds the whole model's weights at
// an evaluation, the same as rank 0's, takes a part of the held-out set's chunks (of
// train.eval_batch_size samples), by its share of the training (its speed, as the plan
// has it): under local every rank of a group (the flush gives each the outer weights),
// and under sync the replicas of a one-stage plan without optimiser shards
// (bit-identical, as every log step checks; a shard's owner alone holds its newest
// weights until the next step gathers them). Rank 0 alone under deadline (a member may
// be steps behind when rank 0 evaluates), on a pipeline, and in one process. A rank
// whose memory cap the evaluation would exceed leaves its part to the others; rank 0's
// misfit ends the job, naming the batch that would fit. Each chunk is computed as one
// process computes it and rank 0 adds the chunks' sums up in chunk order, so the
// figures do not depend on how the chunks were shared out.
void Run::share_evaluation() {
  eval_parts_.clear();
  eval_able_.clear();
  eval_comm_.reset();
  if (!multi()) {
    if (const std::string misfit = evaluation_misfit(); !misfit.empty()) fail(misfit);
    return;
  }
  const int me = world_.rank();
  const bool holds = eval_weights()[static_cast<size_t>(me)] > 0;
  // Measured only where the rank holds the whole model (another stage's rank has let
  // the other blocks' weights go).
  const std::string misfit = root_ || holds ? evaluation_misfit() : "";
  const std::vector<std::string> able = world_.allgather(holds && misfit.empty() ? "1" : "0", peer_timeout(),
                                                         "whether each rank can evaluate a part of the held-out set");
  if (root_ && !misfit.empty()) fail(misfit);
  for (const std::string& a : able) eval_able_.push_back(a == "1");
  if (std::find(eval_able_.begin() + 1, eval_able_.end(), true) == eval_able_.end()) {
    eval_able_.clear();  // rank 0 alone, as gathered
    return;
  }
  const bool member = root_ || eval_able_[static_cast<size_t>(me)];
  eval_comm_ = world_.split(member ? 0 : 1, me, peer_timeout(), "the ranks that share the evaluation");
  if (!member) eval_comm_.reset();
  plan_evaluation();
}

// Each world rank's share of the training where it holds the whole model's weights at an
// evaluation under the current plan (share_evaluation), else 0.
std::vector<double> Run::eval_weights() const {
  std::vector<double> weights(static_cast<size_t>(world_.size()), 0.0);
  if (local_) {
    weights = plan::round_weights(plan_);
  } else if (plan_.sync_policy == plan::SyncPolicy::synchronous && plan::replicates_whole_model(plan_)) {
    for (const plan::RankPlan& rp : plan_.ranks)
      if (rp.replica >= 0)
        weights[static_cast<size_t>(rp.rank)] = static_cast<double>(plan_.layout.samples[static_cast<size_t>(rp.replica)]);
  }
  weights.resize(static_cast<size_t>(world_.size()), 0.0);
  return weights;
}

// eval_parts_ from the current plan, among the ranks that could evaluate when the job
// started; again after a relayout, on every rank alike, so that a rank the new plan
// leaves idle (its weights no longer kept up) evaluates nothing. Each chunk in turn goes
// to the rank that would end it first at its share's pace (the lowest rank of a tie), so
// that sharing never ends later than rank 0 alone would: the two chunks of 2,000 images
// at 0.8/0.4/0.2/0.2 stay on rank 0, where a split by share alone gave one to the rank
// at 0.4, which took as long over it as rank 0 over both. The counts then become
// consecutive ranges, in rank order.
void Run::plan_evaluation() {
  eval_parts_.clear();
  if (eval_able_.empty()) return;
  std::vector<double> weights = eval_weights();
  const size_t n = weights.size();
  for (size_t r = 0; r < n; ++r)
    if (!eval_able_[r]) weights[r] = 0;
  std::vector<int64_t> count(n, 0);
  const int64_t chunks = task_->eval_chunks();
  for (int64_t c = 0; c < chunks; ++c) {
    size_t best = n;
    double best_end = 0;
    for (size_t r = 0; r < n; ++r) {
      if (weights[r] <= 0) continue;
      const double end = static_cast<double>(count[r] + 1) / weights[r];
      if (best == n || end < best_end) best = r, best_end = end;
    }
    if (best == n) return;  // no rank holds the weights: rank 0 alone, as gathered
    ++count[best];
  }
  if (count[0] == chunks) return;  // rank 0 alone
  eval_parts_.assign(n + 1, 0);
  for (size_t r = 0; r < n; ++r) eval_parts_[r + 1] = eval_parts_[r] + count[r];
}

// Collective. Rank 0 evaluates the whole model (gathered from the stages), with the
// ranks share_evaluation chose each taking its part; others get nothing.
std::optional<EvalResult> Run::evaluate() {
  if (local_) local_->flush();  // every rank then holds the outer weights
  else if (multi()) gather_to_root(plan_, *executor_, model_, world_, cfg_.train.optimizer, false, peer_timeout(), "the evaluation gather");
  const int me = world_.rank();
  const bool shared = !eval_parts_.empty();
  const int64_t first = shared ? eval_parts_[static_cast<size_t>(me)] : 0,
                end = shared ? eval_parts_[static_cast<size_t>(me) + 1] : task_->eval_chunks();
  if (!root_ && !shared) return std::nullopt;
  std::vector<double> sums;
  if (end > first) {
    model_.set_training(false);
    try {
      NoGradGuard no_grad;
      Streamed streamed(model_, task_->device());  // the blocks of other stages, from host memory
      sums = task_->evaluate_chunks(model_, first, end);
    } catch (const OutOfMemory& e) {  // not the plan's to fix: say what is
      const int64_t batch = config::eval_batch(cfg_.train);
      fail("rank ", me, " ran out of memory evaluating the whole model in batches of ", batch, " (", e.what(),
           "); set train.eval_batch_size below ", batch);
    }
    model_.set_training(true);
  }
  if (!shared) return task_->eval_result(sums);
  if (!eval_comm_) return std::nullopt;  // no part (plan_evaluation gives parts to members alone)
  std::string mine;
  char text[40];
  for (double v : sums) {
    std::snprintf(text, sizeof text, "%a ", v);  // exact: the chunks' sums as computed
    mine += text;
  }
  const std::vector<std::string> parts =
      eval_comm_->allgather(mine, peer_timeout(), "the evaluation's parts of the held-out set");
  if (!root_) return std::nullopt;
  // The members' parts in world-rank order, which is chunk order: the ranks outside
  // the communicator have no part.
  std::vector<double> all;
  for (size_t i = 0; i < parts.size(); ++i) {
    const char* p = parts[i].c_str();
    for (;;) {
      while (*p == ' ') ++p;
      char* next = nullptr;
      const double v = std::strtod(p, &next);
      if (next == p) break;
      all.push_back(v);
      p = next;
    }
    HT_CHECK(*p == '\0', "rank ", eval_comm_->world_rank(static_cast<int>(i)), " sent '", parts[i],
             "' for its part of the evaluation; expected its chunks' sums");
  }
  const size_t expected = static_cast<size_t>(task_->eval_chunks()) * task_->eval_sums_per_chunk();
  HT_CHECK(all.size() == expected, "the ranks sharing the evaluation sent ", all.size(), " sums; expected ",
           expected, " (", task_->eval_sums_per_chunk(), " for each of ", task_->eval_chunks(), " chunks)");
  return task_->eval_result(all);
}

}  // namespace ht::runtime::trainer_run
