#include "runtime/local_sync.h"

#include <algorithm>
#include <chrono>

#include "backend/allocator.h"
#include "comm/shared_allreduce.h"
#include "comm/weighted_allreduce.h"
#include "core/cpu_time.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/wall_time.h"
#include "ops/ops.h"
#include "plan/local_plan.h"
#include "runtime/checkpoint.h"

namespace ht::runtime {

namespace {

// The outer state (theta, momentum, anchor, delta) lives in host memory on every rank, and
// every rank runs the same host loops over it, so a GPU rank's outer weights come out
// bit-identical to a CPU rank's; only the parameters themselves may be on a device, and
// cross through their backend's copies (twice a round). It is host staging: outside an
// emulated device cap, as the plan counts it (plan/memory_fit.h's outer_state is host
// memory), on a CPU rank too.
Tensor host_copy(const Tensor& t) {
  Allocator::HostStaging staging;
  return Tensor::from_vector(t.to_vector(), t.shape(), cpu_backend());
}

bool on_host(const Tensor& t) { return t.backend().kind() == DeviceKind::cpu; }

// `t`'s values where a host loop can read and write them: its own memory on the CPU, else
// `scratch`, filled from the device.
float* host_view(const Tensor& t, std::vector<float>& scratch) {
  if (on_host(t)) return t.data();
  scratch.resize(static_cast<size_t>(t.numel()));
  t.backend().copy_to_host(scratch.data(), t.data(), static_cast<size_t>(t.numel()) * 4);
  return scratch.data();
}

// After host_view's loop wrote into the scratch: back onto the device.
void write_back(const Tensor& t, const float* view) {
  if (!on_host(t)) t.backend().copy_from_host(t.data(), view, static_cast<size_t>(t.numel()) * 4);
}

void copy_into(const Tensor& dst, const Tensor& src) {  // src: host
  if (on_host(dst)) std::copy(src.data(), src.data() + src.numel(), dst.data());
  else write_back(dst, src.data());
}

// The outer exchange's parts: each member's part of a round's samples, in member order.
std::vector<double> member_weights(const plan::Plan& plan) {
  const std::vector<double> all = plan::round_weights(plan);
  std::vector<double> out;
  for (int r : plan::outer_members(plan)) out.push_back(all[static_cast<size_t>(r)]);
  return out;
}

}  // namespace

std::unique_ptr<LocalGroup> LocalGroup::make(const plan::Plan& plan, comm::Communicator& world,
                                             comm::Timeout timeout) {
  plan::check_local_plan(plan);
  auto g = std::make_unique<LocalGroup>();
  g->group = plan::group_of_rank(plan, world.rank());
  if (g->group < 0) {  // idle: a plan of itself alone, in which it is idle too
    g->plan = plan;
    g->plan.world_size = 1;
    g->plan.ranks = {plan.ranks[static_cast<size_t>(world.rank())]};
    g->plan.ranks[0].rank = 0;
    g->plan.layout = plan::PipelineLayout{};
    g->plan.local.reset();
    g->plan.sync_policy = plan::SyncPolicy::synchronous;
    g->comm = world.split(static_cast<int>(plan.local->groups.size()) + world.rank(), 0, timeout, "the local groups");
    return g;
  }
  g->plan = plan::group_plan(plan, g->group);
  const std::vector<int> ranks = plan::group_ranks(plan, g->group);
  int key = 0;
  while (ranks[static_cast<size_t>(key)] != world.rank()) ++key;
  g->comm = world.split(g->group, key, timeout, "the local groups");
  return g;
}

LocalSync::LocalSync(const plan::Plan& plan, std::vector<nn::NamedTensor> params, comm::Communicator& world,
                     const config::ParallelConfig& cfg, bool shared_memory)
    : plan_(plan),
      params_(std::move(params)),
      // One group has nothing to average: its delta is taken as it is, so that local on
      // ranks that all fall in one synchronous group trains as sync does. outer_lr's
      // reason (the groups' mean moves less than their runs of steps) is between groups.
      lr_(plan.local->groups.size() == 1 ? 1.0f : static_cast<float>(cfg.outer_lr)),
      mu_(plan.local->groups.size() == 1 ? 0.0f : static_cast<float>(cfg.outer_momentum)),
      timeout_s_(cfg.peer_timeout_s),
      inner_steps_(plan.local->inner_steps),
      outer_delay_(plan.local->outer_delay),
      world_rank_(world.rank()),
      outer_list_(plan::outer_sync_schedules(plan)[static_cast<size_t>(world.rank())]) {
  const std::vector<int> members = plan::outer_members(plan);
  member_ = std::find(members.begin(), members.end(), world_rank_) != members.end();
  weights_ = member_weights(plan);
  outer_ = world.split(member_ ? 0 : 1, world.rank(), timeout(), "the outer exchange");
  resplit_ = cfg.rebalance_every > 0;
  cpu_rank_ = !params_.empty() && params_.front().second.backend().kind() == DeviceKind::cpu;
  stats_cpu_at_ = process_cpu_seconds();
  Allocator::HostStaging staging;  // the outer state, as host_copy says
  stats_ = Tensor::zeros({2 * static_cast<int64_t>(plan.ranks.size())}, cpu_backend());  // host: seconds written through data()
  if (shared_memory && member_ && outer_->size() > 1) {  // collective over the members
    std::vector<int64_t> sizes;
    for (const auto& [name, p] : params_) sizes.push_back(p.numel());
    sizes.push_back(stats_.numel());
    board_ = comm::SharedAllreduce::make(*outer_, sizes, timeout());
  }
  for (const auto& [name, p] : params_) {
    HT_CHECK(p.is_contiguous() && p.dtype() == DType::f32, "local sync: parameter '", name,
             "' is not a dense float32 tensor");
    momentum_.push_back(Tensor::zeros(p.shape(), cpu_backend()));
    if (!board_) delta_.push_back(Tensor::zeros(p.shape(), cpu_backend()));
  }
  reset_to_weights();
}

LocalSync::~LocalSync() = default;

void LocalSync::reset_to_weights() {
  checksum_.clear();
  theta_.clear();
  anchor_.clear();
  for (const auto& [name, p] : params_) {
    theta_.push_back(host_copy(p));
    anchor_.push_back(host_copy(p));
  }
  steps_in_round_ = 0;
}

void LocalSync::begin_at(int64_t start) {
  steps_in_round_ = 0;
  round_from_ = static_cast<int>(start % inner_steps_);
  start_measuring_round();
  partial_ = round_from_ != 0;
}

namespace {

// One element of the outer step (Nesterov): m = mu m + d; theta -= lr (d + mu m). At
// mu 0, plain averaging, m is not touched: a throttled rank feels every pass over it.
inline void outer_step_one(float& theta, float& m, float d, float lr, float mu) {
  if (mu == 0) {
    theta -= lr * d;
    return;
  }
  m = mu * m + d;
  theta -= lr * (d + mu * m);
}

// The outer step alone, momentum a compile-time case so that the loop vectorises
// (round_pass below says why).
template <bool kMomentum>
void outer_update_as(float* theta, float* m, const float* d, int64_t n, float lr, float mu) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) outer_step_one(theta[i], m[i], d[i], lr, kMomentum ? mu : 0.0f);
}

// The round end's pass over one tensor (start_round): the outer step with `sums` where
// given, this round's delta into `d` (weighed), and the new anchor into `a` and `y`.
// `sums` and `d` may be one array (over messages): each element's sum is read before its
// contribution overwrites it, which a vector lane keeps too. The arguments are copied
// into locals and the cases made separate loops so that each vectorises: written through
// the members, every store could alias lr and mu, and a throttled rank paid for the
// scalar loop in every round.
template <bool kStep, bool kMomentum>
void round_pass_as(float* th, float* m, const float* sums, float* a, float* y, float* d, int64_t n, float lr,
                   float mu, float weight) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    if constexpr (kStep) outer_step_one(th[k], m[k], sums[k], lr, kMomentum ? mu : 0.0f);
    const float delta = a[k] - y[k];  // this round's progress, negated
    d[k] = weight * delta;
    a[k] = y[k] = th[k] - delta;
  }
}

void round_pass(float* th, float* m, const float* sums, float* a, float* y, float* d, int64_t n, float lr, float mu,
                float weight) {
  if (sums == nullptr) round_pass_as<false, false>(th, m, sums, a, y, d, n, lr, mu, weight);
  else if (mu == 0) round_pass_as<true, false>(th, m, sums, a, y, d, n, lr, mu, weight);
  else round_pass_as<true, true>(th, m, sums, a, y, d, n, lr, mu, weight);
}

// rebase_on_outer's pass over one tensor, on locals so that it vectorises.
void rebase_pass(const float* th, float* a, float* y, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const float own = y[k] - a[k];  // progress since the anchor
    a[k] = th[k];
    y[k] = th[k] + own;
  }
}

}  // namespace

void LocalSync::rebase_on_outer() {
  // The weights stand at the anchor plus this round's progress so far, the anchor being
  // the old outer weights plus the last round's own progress: the step just taken
  // replaces that own progress with everyone's, and the progress since carries over.
  for (size_t i = 0; i < params_.size(); ++i) {
    const float* th = theta_[i].data();
    float* a = anchor_[i].data();
    float* y = host_view(params_[i].second, scratch_);
    rebase_pass(th, a, y, anchor_[i].numel());
    write_back(params_[i].second, y);
  }
}

void LocalSync::outer_update(float* theta, float* m, const float* d, int64_t n, float lr, float mu) {
  if (mu == 0) outer_update_as<false>(theta, m, d, n, lr, mu);
  else outer_update_as<true>(theta, m, d, n, lr, mu);
}

bool LocalSync::in_flight() const { return exchange_ || (board_ && board_->posted() > exchanges_finished_); }

const float* LocalSync::sums_of(size_t i) const { return board_ ? board_->sums(exchanges_, i) : delta_[i].data(); }

float* LocalSync::contribution_of(size_t i) const {
  return board_ ? board_->contribution(exchanges_ + 1, i) : delta_[i].data();
}

void LocalSync::advance() {
  if (board_) board_->progress();
  else if (exchange_)
    while (exchange_->progress()) {
    }
}

void LocalSync::start_exchange(bool with_stats) {
  ++exchanges_;
  stats_in_flight_ = with_stats;
  if (board_) {
    float* st = board_->contribution(exchanges_, params_.size());
    if (with_stats) std::copy(stats_.data(), stats_.data() + stats_.numel(), st);
    board_->post(exchanges_, weights_);
    return;
  }
  if (draining_) {
    const auto t0 = std::chrono::steady_clock::now();
    if (draining_->drain(timeout()) != comm::WaitStatus::done)
      fail_exchange(*draining_, "the outer exchange's sums reaching every member");
    draining_.reset();
    waited_s_ += seconds_since(t0);  // a wait on the peers' receives, not this rank's work
  }
  exchange_ = std::make_unique<comm::OverlappedAllreduce>(*outer_, weights_);
  exchange_->add(delta_);
  if (with_stats) exchange_->add({stats_});
  advance();
}

void LocalSync::fail_exchange(const comm::OverlappedAllreduce& x, const std::string& what) const {
  std::vector<int> missing;  // the message names world ranks
  for (int j : x.waiting_on()) missing.push_back(outer_->world_rank(j));
  fail_as<comm::PeerTimeout>(
      comm::peer_timeout_message(world_rank_, comm::stalled_among(*outer_, missing, timeout()), what, timeout()));
}

void LocalSync::finish_exchange() {
  if (board_) {
    if (board_->finish(timeout()) != comm::WaitStatus::done)
      fail_as<comm::PeerTimeout>(comm::peer_timeout_message(
          world_rank_, comm::stalled_among(*outer_, board_->missing(), timeout()),
          "the outer exchange of round " + std::to_string(outer_steps_ + 1) + " (shared memory)", timeout()));
    exchanges_finished_ = exchanges_;
  } else {
    if (exchange_->finish(timeout()) != comm::WaitStatus::done)
      fail_exchange(*exchange_, "the sums of the outer exchange of round " + std::to_string(outer_steps_ + 1));
    draining_ = std::move(exchange_);
  }
  sums_ready_ = true;
  if (stats_in_flight_) take_stats();
  stats_in_flight_ = false;
}

void LocalSync::take_stats() {
  if (skip_rounds_ > 0) {
    --skip_rounds_;
    return;
  }
  const float* s = board_ ? board_->sums(exchanges_, params_.size()) : stats_.data();
  const size_t groups = plan_.local->groups.size();
  std::vector<double> inner(groups, 0.0), pass(groups, 0.0);
  for (const plan::RankPlan& rp : plan_.ranks) {
    const int g = plan::group_of_rank(plan_, rp.rank);
    if (g < 0) continue;
    const double in = s[2 * rp.rank], out = s[2 * rp.rank + 1];
    if (in < 0) return;  // a partial round (after a flush): not comparable
    inner[static_cast<size_t>(g)] = std::max(inner[static_cast<size_t>(g)], in);
    pass[static_cast<size_t>(g)] = std::max(pass[static_cast<size_t>(g)], out);
  }
  window_inner_.push_back(std::move(inner));
  window_pass_.push_back(std::move(pass));
  if (static_cast<int>(window_inner_.size()) < plan::kResplitRounds) return;
  pending_ = plan::resplit_from_measured(plan_, plan::window_medians(window_inner_), plan::window_medians(window_pass_));
  window_inner_.clear();
  window_pass_.clear();
}

void LocalSync::apply_split(const plan::RoundSplit& split) {
  resume_split(split);
  // The round whose stats arrive at the next round's end ran under the old split.
  skip_rounds_ = 1;
  window_inner_.clear();
  window_pass_.clear();
}

void LocalSync::resume_split(const plan::RoundSplit& split) {
  plan::Plan next = plan_;  // checked before it replaces the split: a refused one changes nothing
  next.local->group_steps = split.steps;
  next.local->round_samples = split.samples;
  plan::check_local_plan(next);
  plan_ = std::move(next);
  weights_ = member_weights(plan_);
}

std::optional<plan::RoundSplit> LocalSync::take_resplit() {
  std::optional<plan::RoundSplit> out;
  out.swap(taken_);
  return out;
}

void LocalSync::take_outer_step() {
  if (!sums_ready_) return;
  for (size_t i = 0; i < theta_.size(); ++i)
    outer_update(theta_[i].data(), momentum_[i].data(), sums_of(i), theta_[i].numel(), lr_, mu_);
  sums_ready_ = false;
  ++outer_steps_;
  checksum_.clear();
}

void LocalSync::poll() {
  if (!in_flight()) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Polls run at every block edge; only a CPU rank's stats use the CPU clock.
  const double cpu0 = cpu_rank_ ? process_cpu_seconds() : 0;
  advance();
  const double s = seconds_since(t0);
  outer_work_s_ += s;
  polled_s_ += s;
  if (cpu_rank_) outer_cpu_s_ += process_cpu_seconds() - cpu0;
}

double LocalSync::after_step(int64_t done, double inner_seconds) {
  if (!member_) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_seconds();
  inner_s_ += std::max(0.0, inner_seconds - polled_s_);
  polled_s_ = 0;
  advance();
  ++steps_in_round_;
  // Where this job step falls in its round, 1..H: OuterSyncFinish runs after step D,
  // OuterSyncStart after step H (at D = H both, in the list's order).
  const int64_t at = done % inner_steps_ == 0 ? inner_steps_ : done % inner_steps_;
  const bool round_end = at == inner_steps_;
  if (round_end) steps_in_round_ = 0;
  double waited = 0;  // for the exchange's sums: another rank's lateness, not this one's work
  for (const plan::Instruction& in : outer_list_) switch (in.op) {
      case plan::Op::outer_sync_finish: {
        if (at != outer_delay_ || !in_flight()) break;
        const auto tf = std::chrono::steady_clock::now();
        finish_exchange();
        waited = seconds_since(tf);
        // At the round's end the pass below takes the step; inside the round it is taken
        // here, and this round's progress so far moves onto the new outer weights.
        if (!round_end) {
          take_outer_step();
          rebase_on_outer();
        }
        break;
      }
      case plan::Op::outer_sync_start:
        if (!round_end) break;
        outer_work_s_ += seconds_since(t0) - waited;
        waited_s_ += waited;
        outer_cpu_s_ += process_cpu_seconds() - cpu0;  // the wait's CPU with it: it sleeps
        start_round();
        break;
      default:
        fail("local sync: rank ", world_rank_, " met ", plan::op_name(in.op),
             " in its outer list; expected OuterSyncFinish and OuterSyncStart only");
    }
  if (!round_end) {
    // Moving the exchange along, and the outer step where it landed: this round's work.
    outer_work_s_ += seconds_since(t0) - waited;
    waited_s_ += waited;
    outer_cpu_s_ += process_cpu_seconds() - cpu0;
    return seconds_since(t0);
  }
  if (pending_) {  // from the next round on, on every rank at once (the same sums decided it)
    apply_split(*pending_);
    taken_ = pending_;
    pending_.reset();
  }
  outer_work_s_ += seconds_since(stats_at_);  // the exchange's start: the next round's work
  outer_cpu_s_ += process_cpu_seconds() - stats_cpu_at_;
  return seconds_since(t0);
}

void LocalSync::count_wait(double wall_s, double cpu_s) {
  waited_s_ += wall_s;
  outer_cpu_s_ += cpu_s;  // as the sums' wait's: not the inner steps'
}

void LocalSync::start_measuring_round() {
  inner_s_ = outer_work_s_ = outer_cpu_s_ = waited_s_ = 0;
  stats_at_ = std::chrono::steady_clock::now();
  stats_cpu_at_ = process_cpu_seconds();
}

void LocalSync::start_round() {
  // One pass over the model (round_pass): the outer step with the sums OuterSyncFinish
  // took (where it took any), then this round's delta and the new anchor. It is
  // memory-bound, and on a throttled rank it costs a good part of an inner step.
  const auto pass_t0 = std::chrono::steady_clock::now();
  const double pass_cpu0 = process_cpu_seconds();
  const bool step = sums_ready_;
  // By this rank's world rank (weights_ is in member order, which skips idle ranks), over
  // the samples the groups took since the round began or since the flush or resume that
  // left off inside it.
  const auto weight = static_cast<float>(plan::segment_weight(plan_, world_rank_, round_from_, inner_steps_));
  round_from_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    float* th = theta_[i].data();
    float* m = momentum_[i].data();
    float* a = anchor_[i].data();
    // Over messages both are delta_[i]: each element's sum is read before its
    // contribution overwrites it.
    const float* sums = step ? sums_of(i) : nullptr;
    float* d = contribution_of(i);
    float* y = host_view(params_[i].second, scratch_);
    round_pass(th, m, sums, a, y, d, anchor_[i].numel(), lr_, mu_, weight);
    write_back(params_[i].second, y);
  }
  if (step) {
    sums_ready_ = false;
    ++outer_steps_;
    checksum_.clear();
  }
  // The round's outer work: the exchange moved along between steps, this round end's own
  // part before the pass (the wait for the sums left out), and the pass.
  outer_work_s_ += seconds_since(pass_t0);
  const double cpu_now = process_cpu_seconds();
  outer_cpu_s_ += cpu_now - pass_cpu0;
  double inner = inner_s_, outer = outer_work_s_;
  // By CPU time (plan::cpu_round_seconds) where the caller reported inner steps (none
  // reported: nothing measured, as by wall clock); a device's inner steps are not the
  // host's CPU time.
  if (cpu_rank_ && inner_s_ > 0) {
    const plan::RoundSeconds r =
        plan::cpu_round_seconds(cpu_now - stats_cpu_at_, outer_cpu_s_, seconds_since(stats_at_), waited_s_);
    inner = r.inner;
    outer = r.outer;
  }
  float* st = stats_.data();
  std::fill(st, st + stats_.numel(), 0.0f);
  st[2 * world_rank_] = partial_ ? -1.0f : static_cast<float>(inner);
  st[2 * world_rank_ + 1] = static_cast<float>(outer);
  start_measuring_round();
  partial_ = false;
  start_exchange(resplit_);
}

void LocalSync::flush() {
  if (!member_) return;
  if (in_flight()) {
    finish_exchange();
    take_outer_step();
    rebase_on_outer();
  }
  if (steps_in_round_ > 0) {
    // Weighed by the samples each group took since the round began or the last flush.
    const float partial = static_cast<float>(
        plan::segment_weight(plan_, world_rank_, round_from_, round_from_ + steps_in_round_));
    for (size_t i = 0; i < params_.size(); ++i) {
      const float* a = anchor_[i].data();
      const float* y = host_view(params_[i].second, scratch_);
      float* d = contribution_of(i);
      for (int64_t k = 0, n = anchor_[i].numel(); k < n; ++k) d[k] = partial * (a[k] - y[k]);
    }
    start_exchange(false);
    finish_exchange();
    take_outer_step();
  }
  if (draining_) {
    if (draining_->drain(timeout()) != comm::WaitStatus::done)
      fail_exchange(*draining_, "the outer exchange's sums reaching every member");
    draining_.reset();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    copy_into(params_[i].second, theta_[i]);
    copy_into(anchor_[i], theta_[i]);
  }
  round_from_ += steps_in_round_;
  steps_in_round_ = 0;
  // The round in progress is measured from here: not a whole round's inner steps.
  start_measuring_round();
  partial_ = true;
}

std::vector<nn::NamedTensor> LocalSync::outer_state() const {
  std::vector<nn::NamedTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back("outer.momentum." + params_[i].first, momentum_[i]);
  return out;
}

void LocalSync::load_outer_state(const Checkpoint& c) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto it = c.table.find("outer.momentum." + params_[i].first);
    if (it == c.table.end()) continue;  // a checkpoint of a synchronous run: momentum starts at 0
    HT_CHECK(it->second.shape == momentum_[i].shape(), "checkpoint ", c.path, ": 'outer.momentum.", params_[i].first,
             "' has shape ", to_string(it->second.shape), "; expected ", to_string(momentum_[i].shape()));
    copy_into(momentum_[i], c.get(it->first));
  }
}

const std::string& LocalSync::outer_checksum() {
  if (member_ && checksum_.empty()) {
    uint32_t crc = 0;
    for (const Tensor& t : theta_) crc = crc32_update(crc, t.data(), static_cast<size_t>(t.numel()) * 4);
    checksum_ = crc32_hex(crc);
  }
  return checksum_;
}

void check_outer_identical(const std::vector<std::string>& checksums, int64_t step) {
  if (!checksums.empty() && checksums[0].empty()) return;  // not compared at this log step
  for (size_t r = 1; r < checksums.size(); ++r)
    // Empty: a rank that holds no outer weights (idle, outside the exchange).
    HT_CHECK(checksums[r].empty() || checksums[r] == checksums[0], "outer weights diverged by step ", step,
             ": checksum ", checksums[0], " on rank 0 but ", checksums[r], " on rank ", r,
             "; expected bit-identical outer weights on every rank (a lost outer exchange)");
}

}  // namespace ht::runtime
