#include "runtime/deadline_sync.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/allocator.h"
#include "core/error.h"
#include "plan/deadline_plan.h"
#include "runtime/guard.h"

namespace ht::runtime {

DeadlineSync::DeadlineSync(comm::Communicator& group, std::vector<int> world_rank_of, std::vector<int64_t> shares,
                           const std::vector<nn::NamedTensor>& params, optim::Optimizer& optimizer,
                           nn::Sequential& model, int block_begin, int block_end,
                           const config::ParallelConfig& parallel, double predicted_step_s, int64_t first_step,
                           ExtraReplicaState extra, std::unique_ptr<DeadlineRebalancer> rebalancer)
    : world_rank_of_(std::move(world_rank_of)), params_(params), optimizer_(optimizer), model_(model),
      block_begin_(block_begin), block_end_(block_end), extra_(std::move(extra)), rebalancer_(std::move(rebalancer)) {
  comm::DeadlineOptions o;
  // A plan without a prediction (one made by hand) starts from a tenth of a second; the
  // budget adapts to the measured steps from the third on.
  o.predicted_step_s = predicted_step_s > 0 ? predicted_step_s : 0.1;
  o.slack = parallel.deadline_slack;
  o.max_staleness = parallel.max_staleness;
  o.peer_timeout_s = parallel.peer_timeout_s;
  if (rebalancer_) {
    o.on_report = [this](int member, int64_t step, std::span<const double> row) {
      rebalancer_->report(member, step, row, reduce_->shares());
    };
    o.reshare = [this](int64_t step, const std::vector<int64_t>& shares) { return rebalancer_->decide(step, shares); };
  }
  for (int b = block_begin_; b < block_end_; ++b) offsets_.push_back(model_.block(static_cast<size_t>(b)).random_offset());
  // A catch-up goes as one message (MPI counts are int): the stage's parameters and its
  // float optimiser state, plus room for the step records that ride with it. Refused
  // here, before the first step, rather than at the first catch-up hours in.
  int64_t floats = 0;
  for (const auto& [name, p] : params_) floats += p.numel();
  for (const auto& [name, t] : optimizer_.state())
    if (t.dtype() == DType::f32) floats += t.numel();
  HT_CHECK(static_cast<double>(floats) * 4 <= plan::kDeadlineCatchUpMaxBytes, "parallel.sync deadline: stage of blocks ",
           block_begin_, "..", block_end_ - 1, " holds ", floats, " float32 values of parameters and optimiser state (",
           floats * 4, " bytes), which a catch-up sends as one message; expected at most ",
           static_cast<int64_t>(plan::kDeadlineCatchUpMaxBytes),
           " bytes (an MPI message's 2^31 - 1, less room for its step records): use more pipeline stages, or "
           "parallel.sync sync");
  reduce_ = std::make_unique<comm::DeadlineReduce>(
      group, o, std::move(shares), first_step, [this] { return save(); },
      [this](const comm::ReplicaState& s) { load(s); });
}

DeadlineSync::~DeadlineSync() = default;

comm::ReplicaState DeadlineSync::save() const {
  comm::ReplicaState s;
  for (const auto& [name, p] : params_) {
    const std::vector<float> v = p.to_vector();
    s.floats.insert(s.floats.end(), v.begin(), v.end());
  }
  for (const auto& [name, t] : optimizer_.state()) {
    if (t.dtype() == DType::f32) {
      const std::vector<float> v = t.to_vector();
      s.floats.insert(s.floats.end(), v.begin(), v.end());
    } else {
      for (int32_t k : t.to_ints()) s.ints.push_back(k);
    }
  }
  for (uint64_t o : offsets_) s.ints.push_back(static_cast<int64_t>(o));
  if (extra_.save) {  // after the streams, to the end
    const std::vector<int64_t> more = extra_.save();
    s.ints.insert(s.ints.end(), more.begin(), more.end());
  }
  return s;
}

void DeadlineSync::load(const comm::ReplicaState& s) {
  size_t f = 0, i = 0;
  auto floats = [&](int64_t n) {
    HT_CHECK(f + static_cast<size_t>(n) <= s.floats.size(), "deadline catch-up: the state holds ", s.floats.size(),
             " values; this rank's parameters and optimiser state need more");
    const float* at = s.floats.data() + f;
    f += static_cast<size_t>(n);
    return at;
  };
  for (const auto& [name, p] : params_)
    p.backend().copy_from_host(p.raw(), floats(p.numel()), static_cast<size_t>(p.numel()) * 4);
  // The optimiser state in transit is host staging: the optimiser copies it into its own
  // slots, and beside them it would need a second copy of every slot under the rank's
  // memory cap, which a plan that fills the cap does not leave (a rank at 100% of 8 MiB ran
  // out of memory taking its first catch-up).
  Allocator::HostStaging staging;
  std::vector<nn::NamedTensor> state;
  for (const auto& [name, t] : optimizer_.state()) {
    if (t.dtype() == DType::f32) {
      const float* at = floats(t.numel());
      state.emplace_back(name, Tensor::from_vector(std::vector<float>(at, at + t.numel()), t.shape(), t.backend()));
    } else {
      std::vector<int32_t> v;
      for (int64_t k = 0; k < t.numel(); ++k, ++i) {
        HT_CHECK(i < s.ints.size(), "deadline catch-up: the state's counters end early at '", name, "'");
        v.push_back(static_cast<int32_t>(s.ints[i]));
      }
      state.emplace_back(name, Tensor::from_ints(v, t.shape(), t.backend()));
    }
  }
  optimizer_.load_state(state);
  for (int b = block_begin_; b < block_end_; ++b, ++i) {
    HT_CHECK(i < s.ints.size(), "deadline catch-up: the state has no dropout stream for block ", b);
    model_.block(static_cast<size_t>(b)).set_random_offset(static_cast<uint64_t>(s.ints[i]));
    offsets_[static_cast<size_t>(b - block_begin_)] = static_cast<uint64_t>(s.ints[i]);
  }
  if (extra_.load) {
    HT_CHECK(i <= s.ints.size(), "deadline catch-up: the state's counters end early");
    extra_.load(s.ints.data() + i, s.ints.size() - i);
    i = s.ints.size();
  }
  HT_CHECK(f == s.floats.size() && i == s.ints.size(), "deadline catch-up: the state holds ", s.floats.size(),
           " values and ", s.ints.size(), " counters; this rank's stage takes ", f, " and ", i);
}

void DeadlineSync::mark_step_start() {
  for (int b = block_begin_; b < block_end_; ++b)
    offsets_[static_cast<size_t>(b - block_begin_)] = model_.block(static_cast<size_t>(b)).random_offset();
}

void DeadlineSync::catch_up(bool take) {
  mark_step_start();
  if (take) reduce_->take_waiting_catch_up();
  else reduce_->serve_between_steps();
}

DeadlineStep DeadlineSync::align_to(int64_t target) {
  mark_step_start();
  const comm::DeadlineOutcome o = reduce_->align_to(target);
  DeadlineStep d;
  d.caught_up = o.caught_up;
  d.ended = o.ended;
  d.record.step = -1;
  for (const comm::StepRecord& r : o.missed) d.missed.push_back(in_world_ranks(r));
  return d;
}

comm::StepRecord DeadlineSync::in_world_ranks(comm::StepRecord r) const {
  auto world = [this](int m) { return m >= 0 && m < static_cast<int>(world_rank_of_.size()) ? world_rank_of_[static_cast<size_t>(m)] : m; };
  r.leader = world(r.leader);
  for (comm::Contribution& c : r.contributors) c.rank = world(c.rank);
  return r;
}

DeadlineStep DeadlineSync::reduce(std::vector<Tensor>& grads, int64_t samples, double loss_sum,
                                  std::chrono::steady_clock::time_point start, int64_t global_batch,
                                  int64_t verdict) {
  const comm::DeadlineOutcome o = reduce_->reduce(grads, samples, loss_sum, start, verdict);
  DeadlineStep d;
  d.caught_up = o.caught_up;
  d.ended = o.ended;
  d.budget_s = o.budget_s;
  if (!o.ended) {
    d.verdicts.assign(world_rank_of_.size(), 0);
    for (const comm::Contribution& c : o.record.contributors)
      if (c.staleness == 0 && c.rank >= 0 && c.rank < static_cast<int>(d.verdicts.size()))
        d.verdicts[static_cast<size_t>(c.rank)] = c.verdict;
  }
  d.record = o.ended ? comm::StepRecord{} : in_world_ranks(o.record);
  for (const comm::StepRecord& r : o.missed) d.missed.push_back(in_world_ranks(r));
  if (!o.ended) rescale_to_kept(grads, global_batch, static_cast<double>(o.record.samples));
  return d;
}

std::vector<comm::StepRecord> DeadlineSync::finish(comm::DeadlineReduce::FinishReason why) {
  mark_step_start();  // a final catch-up carries the streams as the last step left them
  std::vector<comm::StepRecord> out;
  for (const comm::StepRecord& r : reduce_->finish(why)) out.push_back(in_world_ranks(r));
  return out;
}

std::string DeadlineLog::add(const comm::StepRecord& r) {
  // A step this rank recorded already (it applied a step that a catch-up then replaced):
  // its first record stands, so that there is one per step.
  if (r.step <= last_step_) return "";
  last_step_ = r.step;
  ++steps_;
  closed_short_ += r.closed_short ? 1 : 0;
  samples_dropped_ += r.samples_dropped;
  stale_ += r.staleness_applied;
  for (const comm::Contribution& c : r.contributors)
    if (c.staleness > 0) stale_samples_ += c.samples;
  led_elsewhere_ += r.leader != 0 ? 1 : 0;
  window_loss_ += r.loss_sum;
  window_samples_ += r.fresh_samples;
  last_loss_sum_ = r.loss_sum;
  last_loss_samples_ = r.fresh_samples;
  last_short_ = r.closed_short;
  nlohmann::json contributors = nlohmann::json::array();
  for (const comm::Contribution& c : r.contributors) contributors.push_back({c.rank, c.samples, c.staleness});
  const std::string line = nlohmann::json{{"type", "contributions"},
                                          {"step", r.step + 1},
                                          {"leader", r.leader},
                                          {"term", r.term},
                                          {"contributors", contributors},
                                          {"samples", r.samples},
                                          {"samples_dropped", r.samples_dropped},
                                          {"closed_short", r.closed_short},
                                          {"stale_contributions", r.staleness_applied}}
                               .dump();
  return line;
}

std::optional<double> DeadlineLog::take_window_loss(int64_t predictions_per_sample) {
  std::optional<double> mean;
  if (window_samples_ > 0) mean = window_loss_ / static_cast<double>(window_samples_ * predictions_per_sample);
  window_loss_ = 0;
  window_samples_ = 0;
  return mean;
}

std::string DeadlineLog::short_line(const comm::StepRecord& r) const {
  if (!r.closed_short || last_short_ || r.step <= last_step_) return "";
  std::string in;
  for (const comm::Contribution& c : r.contributors)
    if (c.staleness == 0) in += (in.empty() ? "" : ", ") + std::to_string(c.rank);
  return "step " + std::to_string(r.step + 1) + ": closed short at its budget with ranks " + in + " (" +
         std::to_string(r.samples_dropped) + " samples left out; the gradient is the mean over those that arrived)";
}

std::string DeadlineLog::summary() const {
  return nlohmann::json{{"steps", steps_},
                        {"steps_closed_short", closed_short_},
                        {"samples_dropped", samples_dropped_},
                        {"stale_contributions", stale_},
                        {"steps_led_by_a_backup", led_elsewhere_},
                        {"catch_ups", catch_ups_},
                        {"replica_alignments", alignments_}}
      .dump();
}

}  // namespace ht::runtime
