// The executor's replica synchronisation (runtime/executor.h): the gradient reduction
// block by block during Backward and the bad-node guard's verdicts on it, ReduceGrads
// (synchronous or deadline-bounded), the optimiser step with global-norm clipping, and
// the weights' way back to the replicas (GatherWeights, or the hub's shared weights and
// its word that they are updated). executor.cpp holds the construction, the step's
// dispatch and the stage pass.
#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/shared_memory.h"
#include "comm/weighted_allreduce.h"
#include "core/error.h"
#include "core/stop_signal.h"
#include "ops/ops.h"
#include "optim/grad_clip.h"

namespace ht::runtime {

namespace {

constexpr int kTagWeightsUpdated = 13;  // apart from executor.cpp's activation and grad tags

}  // namespace

// The hub's weights go into shared memory, where the stage's other replicas compute
// with them: each step they need not travel to every replica (which took 4% of a
// throttled replica's CPU in the CNN), only word that they are updated (ShareWeights and
// AwaitWeights in the lists, pass_weights_word).
// Where that memory cannot be had (ranks on several hosts, emulated links, a memory cap
// that must count the weights), the weights travel as before.
void Executor::share_weights() {
  std::vector<size_t> at;
  size_t bytes = 0;
  for (const auto& [name, p] : params_) {
    at.push_back(bytes);
    bytes += (static_cast<size_t>(p.numel()) * dtype_size(p.dtype()) + 63) / 64 * 64;  // cache-line aligned
  }
  if (bytes == 0) return;
  Backend& be = params_.front().second.backend();
  const bool willing = be.kind() == DeviceKind::cpu && be.allocator().cap() == 0;
  const int hub = plan_.layout.reduce_owner;
  std::shared_ptr<std::byte> memory = comm::map_shared(*stage_group_, hub, bytes, willing, peer_timeout_, &weights_apart_);
  if (!memory) return;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].second.move_to(memory.get() + at[i], memory, replica_ == hub);
  weights_apart_.clear();
  shared_weights_ = true;
  weights_loaded();
}

void Executor::weights_loaded() {
  if (!shared_weights_) return;
  // An allgather, not a barrier: on a timeout it names the replicas not heard from.
  (void)stage_group_->allgather({}, peer_timeout_,
                                 "stage " + std::to_string(stage_) + "'s replicas to share the hub's weights");
}

// The last step's sums may still be on their way to slower replicas, or word of the
// updated weights; after an error the job is ending anyway (see ~OverlappedAllreduce).
// --inject nan: one element of the first gradient among parameters [begin, end) becomes
// NaN, as a faulty device's arithmetic would make it; --inject scale: every gradient
// among them is multiplied by the factor (finite garbage). Both before anything checks
// or sends them.
void Executor::corrupt_gradient(size_t begin, size_t end) {
  const float scale = static_cast<float>(faults_->gradient_scale());
  bool poison = faults_->poison_gradient();
  for (size_t i = begin; i < end; ++i) {
    const Tensor& p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    HT_CHECK(g.backend().kind() == DeviceKind::cpu, "fault injection: rank ", me(),
             "'s gradients are not in host memory; expected a CPU rank for this testing aid");
    if (!g.is_contiguous()) {
      g = clone(g);
      p.set_grad(g);
    }
    float* d = g.data();
    if (scale != 1)
      for (int64_t k = 0; k < g.numel(); ++k) d[k] *= scale;
    if (poison) d[0] = std::numeric_limits<float>::quiet_NaN();
    poison = false;
  }
}

// Parameters [begin, end) of this stage join the all-reduce: their gradients as
// contiguous tensors that the parameters hold (zeros for one this step did not reach),
// reduced in place.
// The bad-node guard (runtime/guard.h) judges the group before any of it leaves this
// rank; unsharded, its counts travel as one more tensor of the same all-reduce, so they
// add no round of messages.
void Executor::add_to_reduce(size_t begin, size_t end) {
  std::vector<Tensor> grads = final_grads(begin, end);
  for (size_t i = begin; i < end; ++i) reduce_order_.push_back(i);
  judge(grads, begin, end);
  if (shards_.empty()) grads.push_back(counts_.back());
  reduce_->add(std::move(grads));
}

std::vector<Tensor> Executor::final_grads(size_t begin, size_t end) {
  std::vector<Tensor> grads;
  for (size_t i = begin; i < end; ++i) {
    const Tensor& p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) {
      g = Tensor::zeros(p.shape(), p.backend());
    } else if (!g.is_contiguous()) {
      g = clone(g);
    }
    p.set_grad(g);
    grads.push_back(g);
  }
  return grads;
}

// This rank's verdict on parameters [begin, end)'s gradients `grads`; a contribution left
// out becomes zeros. Its counts: [samples kept, then one verdict per member of the
// stage group, this rank's in its own slot, then 1 where this rank asks to stop
// (set_stop_request), then 1 where it was asked with SIGTERM], so that their sum tells
// every member the samples kept, each member's verdict, whether any asked to stop and
// with which signal (two counts, not the signals' sum: a sum of signal numbers does
// not say which were given).
void Executor::judge(std::vector<Tensor>& grads, size_t begin, size_t end) {
  const int members = stage_group_->size(), me = stage_group_->rank();
  const int64_t samples = layout_.samples[static_cast<size_t>(replica_)];
  Verdict v = Verdict::quarantined;
  if (!quarantine_ || !quarantine_->quarantined(me)) {
    double sum_squares = 0;
    for (const Tensor& g : grads) sum_squares += sum_of_squares(g);
    // Under a loss scale the history holds the true norms, and a non-finite gradient is
    // an overflow while a smaller scale can still cure it (runtime/loss_scale.h).
    v = guard_.judge(begin, sum_squares / (step_scale_ * step_scale_), samples, plan_.global_batch);
    if (v == Verdict::non_finite && loss_scale_ && step_scale_ > loss_scale_->min_scale()) v = Verdict::overflow;
  }
  if (v != Verdict::kept) {
    if (verdict_ == Verdict::kept) verdict_ = v;
    for (size_t k = 0; k < grads.size(); ++k) {
      const Tensor& p = params_[begin + k].second;
      grads[k] = Tensor::zeros(p.shape(), p.backend());
      p.set_grad(grads[k]);
    }
  }
  Tensor c = Tensor::zeros({3 + members}, cpu_backend());  // host: written through data() here
  c.data()[0] = v == Verdict::kept ? static_cast<float>(samples) : 0.f;
  c.data()[1 + me] = static_cast<float>(static_cast<int>(v));
  const int asked = stop_requested_ ? stop_requested_() : 0;
  c.data()[1 + members] = asked != 0 ? 1.f : 0.f;
  c.data()[2 + members] = asked == SIGTERM ? 1.f : 0.f;
  counts_.push_back(c);
  groups_.emplace_back(begin, end);
}

// After the reduction every member holds the same counts: each group's sums become the
// mean over its kept samples, and every member records the same verdicts, so all agree
// on who is quarantined. One member (the group's first) reports the events.
void Executor::settle_guard() {
  const int members = stage_group_->size();
  if (!shards_.empty() && members > 1)  // the sharded all-reduce leaves only this rank's parts summed
    if (stage_group_->allreduce_sum(counts_, peer_timeout_) != comm::WaitStatus::done)
      fail_as<comm::PeerTimeout>(comm::peer_timeout_message(
          me(), comm::absent_after(*stage_group_, peer_timeout_), "stage " + std::to_string(stage_) + "'s guard counts", peer_timeout_));
  std::vector<Verdict> verdicts(static_cast<size_t>(members), Verdict::kept);
  for (size_t g = 0; g < counts_.size(); ++g) {
    const float* c = counts_[g].data();
    if (c[0] <= 0) skip_update_ = true;
    // Every member reads the same sums; only where the group is the whole world does the
    // request reach every rank in this step.
    if (c[1 + members] > 0 && members == world_.size()) stop_signal_ = c[2 + members] > 0 ? SIGTERM : SIGINT;
    std::vector<Tensor> sums;
    for (size_t i = groups_[g].first; i < groups_[g].second; ++i) sums.push_back(params_[i].second.grad());
    rescale_to_kept(sums, plan_.global_batch, c[0]);
    for (size_t m = 0; m < verdicts.size(); ++m)
      if (verdicts[m] == Verdict::kept) verdicts[m] = static_cast<Verdict>(std::lround(c[1 + m]));
  }
  record_verdicts(verdicts, true);
}

// Every member records the same verdicts, so all agree on the quarantine and keep one
// loss scale (only an overflow moves it: at the least scale a non-finite gradient is the
// guard's affair). The group's first member reports the quarantines and, with
// `exclusions`, the contributions left out.
void Executor::record_verdicts(const std::vector<Verdict>& verdicts, bool exclusions) {
  const std::vector<int> quarantined = quarantine_ ? quarantine_->record(verdicts) : std::vector<int>{};
  if (loss_scale_)
    loss_scale_->update(std::any_of(verdicts.begin(), verdicts.end(), [](Verdict v) { return v == Verdict::overflow; }));
  if (stage_group_->rank() != 0) return;
  // The plan's ranks are the executor's communicator's (a local group numbers its own from
  // 0): the events name world ranks.
  auto world_rank = [this](int m) {
    return world_.world_rank(plan_.layout.replicas[static_cast<size_t>(m)][static_cast<size_t>(stage_)]);
  };
  for (size_t m = 0; exclusions && m < verdicts.size(); ++m)
    if (verdicts[m] != Verdict::kept)
      events_.push_back({world_rank(static_cast<int>(m)), stage_, verdicts[m], layout_.samples[m], 0});
  for (int m : quarantined) events_.push_back({world_rank(m), stage_, Verdict::quarantined, 0, guard_cfg_.quarantine_steps});
}

void Executor::restore_loss_scale(double scale, int64_t clean) {
  if (loss_scale_) loss_scale_->restore(scale, clean);
}

void Executor::set_guard(const config::GuardConfig& guard) {
  guard_cfg_ = guard;
  guard_ = ContributionGuard(guard);
  quarantine_.reset();
}

// What the last Backward did not start (nothing when it overlapped), then the wait. A
// sharded stage's all-reduce stops at the sums of this rank's parts; GatherWeights (or the
// hub's word) ends it.
void Executor::reduce_grads() {
  if (!reduce_) return;  // the only replica of its stage
  if (reduce_->added() == 0) add_to_reduce(0, params_.size());
  comm::WaitStatus s = reduce_->finish(peer_timeout_);
  std::vector<int> missing = s == comm::WaitStatus::done ? std::vector<int>{} : reduce_->waiting_on();
  if (s == comm::WaitStatus::done) settle_guard();
  if (draining_ && s == comm::WaitStatus::done) {
    s = draining_->drain(peer_timeout_);
    if (s != comm::WaitStatus::done) missing = draining_->waiting_on();
  }
  for (int& m : missing) m = stage_group_->world_rank(m);
  draining_.reset();
  if (shards_.empty()) draining_ = std::move(reduce_);  // its sums go out while the next step runs
  if (s != comm::WaitStatus::done) {
    // A member waited for may itself have been waiting, for the one that stalled (rank 0
    // named ranks 1 and 2 where rank 2 alone had stopped).
    fail_as<comm::PeerTimeout>(comm::peer_timeout_message(
        me(), comm::stalled_among(*stage_group_, missing, peer_timeout_),
        "stage " + std::to_string(stage_) + "'s gradient sums (ReduceGrads)", peer_timeout_));
  }
}

void Executor::optimizer_step(float lr) {
  if (counts_.empty() && !deadline_) {  // the only replica of its stage: the guard judges its gradient here, alone
    std::vector<Tensor> grads = final_grads(0, params_.size());
    judge(grads, 0, params_.size());
    settle_guard();
  }
  if (loss_scale_ && !deadline_) {  // by the scale the backward used (settle_guard has updated it for the next step)
    std::vector<Tensor> grads;
    for (const auto& [name, p] : params_)
      if (p.grad().defined()) grads.push_back(p.grad());
    unscale_gradients(grads, step_scale_);
  }
  if (!shards_.empty())  // the summed gradients of this rank's parts
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor g = params_[i].second.grad();
      const Tensor& part = shard_params_[i].second;
      part.set_grad(g.view_as(part.shape(), {1}, g.offset() + (part.offset() - params_[i].second.offset())));
    }
  if (train_.grad_clip > 0) {
    // This rank's sum of squares, summed over the stage's parts when sharded and over
    // the stages: every rank clips by the whole model's norm.
    auto sum_over = [this](comm::Communicator& group, double local) {
      std::vector<Tensor> t{Tensor::from_vector({static_cast<float>(local)}, {1}, cpu_backend())};
      if (group.allreduce_sum(t, peer_timeout_) != comm::WaitStatus::done)
        fail_as<comm::PeerTimeout>(
            comm::peer_timeout_message(me(), comm::absent_after(group, peer_timeout_), "the gradient norm's sum", peer_timeout_));
      return static_cast<double>(t[0].item());
    };
    std::function<double(double)> global;
    if (!shards_.empty() || stages_ > 1)
      global = [this, sum_over](double local) {
        if (!shards_.empty()) local = sum_over(*stage_group_, local);
        return stages_ > 1 ? sum_over(*replica_group_, local) : local;
      };
    optim::clip_grad_norm(shards_.empty() ? params_ : shard_params_, train_.grad_clip, global);
  }
  if (skip_update_) return;  // every contribution left out: nothing to step with (clipped all the same, collectively)
  opt_->set_lr(lr);
  opt_->step();
}

void Executor::use_deadline(const config::ParallelConfig& parallel, int64_t first_step,
                            std::function<float(int64_t)> lr_at, DeadlineResplits resplits) {
  if (!active() || stage_group_->size() < 2) return;
  HT_CHECK(shards_.empty() && !shared_weights_, "executor: parallel.sync deadline on stage ", stage_,
           ", whose optimizer state is sharded or whose weights are the hub's; the planner refuses such plans");
  std::vector<int> world_rank_of;
  for (const auto& replica : plan_.layout.replicas) world_rank_of.push_back(replica[static_cast<size_t>(stage_)]);
  // The quarantine travels with a catch-up: a rank that missed steps takes the
  // quarantines they decided, so that every member goes on agreeing on them.
  // So does the loss scale, which every member updates from the same verdicts.
  ExtraReplicaState guard{[this] { return deadline_guard_state(); },
                          [this](const int64_t* ints, size_t n) { restore_deadline_guard_state(ints, n); }};
  // Re-splits on one stage only: a hybrid plan's stages reduce on chains of their own,
  // which would have to agree on the step a replica's share changes.
  std::unique_ptr<DeadlineRebalancer> rebalancer;
  if (resplits.decide && resplits.replace_plan && parallel.rebalance_every > 0 && stages_ == 1) {
    rebalancer = std::make_unique<DeadlineRebalancer>(std::move(resplits.decide), parallel.rebalance_every, plan_,
                                                      world_rank_of, resplits.total_steps);
    replace_plan_ = std::move(resplits.replace_plan);
  }
  deadline_ = std::make_unique<DeadlineSync>(*stage_group_, std::move(world_rank_of), plan_.layout.samples, params_,
                                             *opt_, model_, rank_plan_.block_begin, rank_plan_.block_end, parallel,
                                             plan_.predicted.step_seconds, first_step, std::move(guard),
                                             std::move(rebalancer));
  lr_at_ = std::move(lr_at);
  reduce_.reset();
}

bool Executor::take_deadline_shares() {
  if (!deadline_ || !deadline_->rebalances() || deadline_->shares() == plan_.layout.samples) return false;
  replace_plan_(deadline_->plan_for_shares());
  take_shares();
  return true;
}

std::vector<comm::StepRecord> Executor::finish_deadline(comm::DeadlineReduce::FinishReason why) {
  return deadline_ ? deadline_->finish(why) : std::vector<comm::StepRecord>{};
}

// The guard judges this rank's contribution first (one left out goes as zeros with no
// samples); the sum that comes back is already the mean over the samples that arrived.
void Executor::reduce_grads_deadline(StepResult& r, std::chrono::steady_clock::time_point start) {
  HT_CHECK(deadline_, "executor: rank ", me(), " runs ReduceGradsDeadline on stage ", stage_,
           " without a deadline reduction; the trainer enables it (use_deadline) for a deadline plan");
  std::vector<Tensor> grads = final_grads(0, params_.size());
  judge(grads, 0, params_.size());
  const auto samples = static_cast<int64_t>(counts_.back().data()[0]);
  // A contribution left out takes its loss out with its samples: the step's loss is the
  // mean over the samples it kept.
  const double loss = verdict_ != Verdict::kept ? 0 : loss_sum_;
  // Under a loss scale the contribution goes out unscaled (exact: the scales are powers
  // of two), so that a stale one, computed under an earlier scale, adds in true units
  // too; optimizer_step then has nothing to unscale.
  if (loss_scale_ && verdict_ == Verdict::kept) unscale_gradients(grads, step_scale_);
  r.deadline = deadline_->reduce(grads, samples, loss, start, plan_.global_batch, static_cast<int64_t>(verdict_));
  skip_update_ = !r.deadline->ended && r.deadline->record.samples == 0;
  if (!r.deadline->ended) settle_deadline_guard(*r.deadline);
}

// Op::align_replica, on a hybrid plan under deadline, after OptimizerStep. Each stage's
// replicas reduce on their own deadline, so a rank of a replica that its pipeline held
// (one of its ranks stalled) may be caught up by its stage's leader to another step
// than its replica's other ranks: their next step would feed one step's data through
// another's weights. So the replica's ranks tell one another the step they are at next;
// those behind take their stage's state at the step of the one ahead (DeadlineSync::
// align_to) until all are at one. In the steady state that is one small message to each
// of the replica's other ranks. The word also carries each stage's loss of the step: a
// pipeline's loss is its last stage's, and rank 0, a first stage, records it. And it
// carries a stop request (a signal): the replica's ranks stop after the same step, so
// that none waits on a stage that stopped alone (its other stages did, up to the peer
// timeout, and a chain ended there read as the end of training).
void Executor::align_replica(StepResult& r) {
  HT_CHECK(deadline_ && r.deadline && replica_group_, "executor: rank ", me(),
           " runs AlignReplica without a deadline reduction on stage ", stage_,
           " (a hybrid plan under parallel.sync deadline has one on every rank)");
  DeadlineStep& d = *r.deadline;
  const auto began = std::chrono::steady_clock::now();
  // Stage-local losses mean nothing for a pipeline: only an agreed step's last stage's counts.
  auto forget_loss = [](std::vector<comm::StepRecord>& records) {
    for (comm::StepRecord& rec : records) rec.loss_sum = 0, rec.fresh_samples = 0;
  };
  forget_loss(d.missed);
  // Read once: every round of this agreement sends the same request, and a signal that
  // comes after it is the next step's to agree on.
  const int stop_asked = stop_requested_ ? stop_requested_() : 0;
  int stop = 0;
  for (int round = 0;; ++round) {
    char word[112];
    std::snprintf(word, sizeof word, "%" PRId64 " %d %a %" PRId64 " %d", deadline_->step(), d.ended ? 1 : 0,
                  d.record.loss_sum, d.record.fresh_samples, stop_asked);
    const std::vector<std::string> items =
        replica_group_->allgather(word, peer_timeout_, "the replica's step agreement (AlignReplica)");
    int64_t target = -1;
    bool equal = true, ended = false;
    double last_loss = 0;
    int64_t last_fresh = 0;
    std::vector<int64_t> steps(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const char* p = items[i].c_str();
      char* end = nullptr;
      const int64_t step = std::strtoll(p, &end, 10);
      const long over = std::strtol(end, &end, 10);
      const double loss = std::strtod(end, &end);
      const int64_t fresh = std::strtoll(end, &end, 10);
      const long asked = std::strtol(end, &end, 10);
      HT_CHECK(end && *end == '\0' && end != p, "executor: AlignReplica on rank ", me(), ": stage ", i,
               " of replica ", replica_, " sent '", items[i], "'; expected its step, ended, loss, samples and stop");
      HT_CHECK(asked == 0 || asked == SIGINT || asked == SIGTERM, "executor: AlignReplica on rank ", me(),
               ": stage ", i, " of replica ", replica_, " asked to stop with signal ", asked,
               "; expected 0, SIGINT or SIGTERM");
      stop = stronger_stop(stop, static_cast<int>(asked));
      steps[i] = step;
      equal = equal && (target < 0 || step == target);
      target = std::max(target, step);
      ended = ended || over != 0;
      last_loss = loss, last_fresh = fresh;  // the last stage's, in stage order
    }
    if (ended) {  // one stage was caught up to the end: the replica ends its loop together
      d.ended = true;
      return;
    }
    if (equal) {
      d.record.loss_sum = round == 0 ? last_loss : 0;
      d.record.fresh_samples = round == 0 ? last_fresh : 0;
      stop_signal_ = stop;  // at one step: every rank of the replica stops after it
      return;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - began) > peer_timeout_) {
      // Every stage answered, so none is silent: those still short of the target hold the rest.
      std::string behind;
      for (size_t i = 0; i < steps.size(); ++i)
        if (steps[i] < target)
          behind += (behind.empty() ? "" : ", ") + std::to_string(replica_group_->world_rank(static_cast<int>(i))) +
                    " (at step " + std::to_string(steps[i]) + ")";
      fail_as<comm::PeerTimeout>("rank ", me(), ": replica ", replica_, "'s stages did not reach one step within ",
                                 peer_timeout_.count(), " s (AlignReplica): step ", target, " is ahead of rank",
                                 behind.find(',') != std::string::npos ? "s " : " ", behind);
    }
    if (deadline_->step() < target) {
      DeadlineStep a = deadline_->align_to(target);
      forget_loss(a.missed);
      d.caught_up = true;
      d.passed.insert(d.passed.end(), a.missed.begin(), a.missed.end());
      d.ended = d.ended || a.ended;
    }
  }
}

std::vector<std::string> Executor::replica_allgather(const std::string& mine, std::string_view what) const {
  HT_CHECK(replica_group_, "executor: rank ", me(), " is in no replica; it has no replica group");
  return replica_group_->allgather(mine, peer_timeout_, what);
}

// [the quarantine's count of values, its values, then under a loss scale its exponent and
// clean steps].
std::vector<int64_t> Executor::deadline_guard_state() {
  std::vector<int64_t> q = ensure_quarantine().state();
  q.insert(q.begin(), static_cast<int64_t>(q.size()));
  if (loss_scale_) q.insert(q.end(), {loss_scale_->log2_scale(), loss_scale_->clean_steps()});
  return q;
}

void Executor::restore_deadline_guard_state(const int64_t* ints, size_t n) {
  const size_t scale = loss_scale_ ? 2 : 0;
  HT_CHECK(n >= 1 + scale && ints[0] >= 0 && static_cast<size_t>(ints[0]) == n - 1 - scale,
           "deadline catch-up: the guard's state holds ", n, " values", n ? " announcing " + std::to_string(ints[0]) : "",
           "; expected the quarantine's", loss_scale_ ? " and the loss scale's 2" : "");
  ensure_quarantine().restore(ints + 1, n - 1 - scale);
  if (loss_scale_) loss_scale_->restore(std::ldexp(1.0, static_cast<int>(ints[n - 2])), ints[n - 1]);
}

std::string Executor::guard_state() const {
  nlohmann::json norms = nlohmann::json::array();
  for (const auto& [key, h] : guard_.history()) norms.push_back({key, std::vector<double>(h.begin(), h.end())});
  nlohmann::json j{{"norms", std::move(norms)}};
  if (quarantine_) j["quarantine"] = quarantine_->state();
  return j.dump();  // doubles as their shortest exact text: they read back bit for bit
}

void Executor::restore_guard_state(const std::string& text) {
  std::map<size_t, std::deque<double>> history;
  std::vector<int64_t> quarantine;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    for (const nlohmann::json& e : j.at("norms")) {
      const auto h = e.at(1).get<std::vector<double>>();
      history[e.at(0).get<size_t>()] = std::deque<double>(h.begin(), h.end());
    }
    if (j.contains("quarantine")) quarantine = j["quarantine"].get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    fail("guard state: ", e.what(), "; expected {\"norms\": [[key, [norms]]...], \"quarantine\": [integers]}");
  }
  for (const auto& [key, h] : history)
    for (double v : h)
      HT_CHECK(std::isfinite(v) && v >= 0, "guard state: group ", key, " holds the norm ", v,
               "; expected finite norms >= 0");
  if (!quarantine.empty()) ensure_quarantine().restore(quarantine.data(), quarantine.size());
  guard_.restore_history(std::move(history));
}

Quarantine& Executor::ensure_quarantine() {
  if (!quarantine_) quarantine_ = std::make_unique<Quarantine>(guard_cfg_, stage_group_->size());
  return *quarantine_;
}

// Under deadline the verdicts come in the step's record, which every rank that applies the
// step reads alike (a rank that caught up took the quarantine with the weights), as
// settle_guard's reduced counts make them agree under sync. The contributions left out
// rank 0 (the group's first) reports from the records (Run::write_deadline_record), those
// of steps it caught up past included.
void Executor::settle_deadline_guard(const DeadlineStep& d) {
  std::vector<Verdict> verdicts;
  for (int64_t v : d.verdicts) verdicts.push_back(static_cast<Verdict>(v));
  ensure_quarantine();
  record_verdicts(verdicts, false);
}

// ShareWeights on the hub, AwaitWeights on the others: the hub updated the weights in
// place, and tells the replicas that compute with them so.
void Executor::pass_weights_word(bool from_hub) {
  const int hub = plan_.layout.reduce_owner;
  HT_CHECK(shared_weights_ && reduce_ && (replica_ == hub) == from_hub, "executor: rank ", me(), " runs ",
           from_hub ? "ShareWeights" : "AwaitWeights", " but is ", replica_ == hub ? "" : "not ", "the hub of stage ",
           stage_, (shared_weights_ ? "" : ", whose weights are not shared"), " (an inconsistent schedule)");
  reduce_->end_without_gather();
  reduce_.reset();
  if (from_hub) {
    static const char kUpdated = 1;
    std::erase_if(updated_, [](comm::Request& r) { return r.test(); });
    for (int j = 0; j < stage_group_->size(); ++j)
      if (j != hub) updated_.push_back(stage_group_->isend_bytes(&kUpdated, 1, j, kTagWeightsUpdated));
    return;
  }
  char word = 0;
  comm::Request r = stage_group_->irecv_bytes(&word, 1, hub, kTagWeightsUpdated);
  if (r.wait(peer_timeout_) != comm::WaitStatus::done)
    fail_as<comm::PeerTimeout>(comm::peer_timeout_message(
        me(), {stage_group_->world_rank(hub)},
        "word of stage " + std::to_string(stage_) + "'s updated weights from its hub", peer_timeout_));
}

// Round 2 of a sharded stage's all-reduce, carrying the updated weights of each part.
void Executor::gather_weights() {
  HT_CHECK(!shared_weights_ && reduce_ && !shards_.empty(), "executor: rank ", me(),
           " runs GatherWeights on stage ", stage_, ", which ",
           shared_weights_ ? "shares its hub's weights" : "is not sharded", " (an inconsistent schedule)");
  std::vector<Tensor> weights;
  for (size_t i : reduce_order_) weights.push_back(params_[i].second);
  reduce_->gather(std::move(weights));
  if (reduce_->finish(peer_timeout_) != comm::WaitStatus::done) {
    std::vector<int> missing = reduce_->waiting_on();
    for (int& m : missing) m = stage_group_->world_rank(m);
    fail_as<comm::PeerTimeout>(comm::peer_timeout_message(
        me(), missing, "stage " + std::to_string(stage_) + "'s updated weights (GatherWeights)", peer_timeout_));
  }
  draining_ = std::move(reduce_);  // this rank's part goes out while the next step runs
}

}  // namespace ht::runtime
