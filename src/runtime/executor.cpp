#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "autograd/graph.h"
#include "comm/clock_sync.h"
#include "comm/weighted_allreduce.h"
#include "core/cpu_time.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/wall_time.h"
#include "ops/ops.h"
#include "optim/make_optimizer.h"

namespace ht::runtime {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTagActivation = 11;
constexpr int kTagGrad = 12;  // executor_sync.cpp has 13

// Replica `part`'s elements [begin, end) of `numel` when its stage is sharded by `shards`.
std::pair<int64_t, int64_t> part_range(int64_t numel, const std::vector<double>& shards, int part) {
  const std::vector<int64_t> off = comm::part_offsets(numel, shards);
  return {off[static_cast<size_t>(part)], off[static_cast<size_t>(part) + 1]};
}

// Replica `part`'s part of `t` when its stage is sharded by `shards`: a flat view.
Tensor part_view(const Tensor& t, const std::vector<double>& shards, int part) {
  const auto [begin, end] = part_range(t.numel(), shards, part);
  return t.view_as({end - begin}, {1}, t.offset() + begin);
}

// The parameter whose slot an optimiser state entry is ("<parameter>.<slot>", float32),
// or null: a counter, or not a parameter's slot (kept whole by every part).
const Tensor* slot_parameter(const std::string& name, DType dtype, const std::map<std::string, const Tensor*>& by_name) {
  const size_t dot = name.rfind('.');
  if (dtype != DType::f32 || dot == std::string::npos) return nullptr;
  const auto it = by_name.find(name.substr(0, dot));
  return it == by_name.end() ? nullptr : it->second;
}

std::map<std::string, const Tensor*> parameters_by_name(const std::vector<nn::NamedTensor>& params) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, p] : params) by_name.emplace(name, &p);
  return by_name;
}

// A slot is sharded as a flat run of its parameter's elements: it must be that dense shape.
void check_slot_shape(const std::string& name, const Shape& shape, const Tensor& param, bool dense = true) {
  HT_CHECK(shape == param.shape() && dense, "optimizer state '", name, "' has shape ", to_string(shape),
           "; expected its parameter's ", to_string(param.shape()));
}

}  // namespace

struct Executor::MicroBatch {
  Tensor inputs, targets;  // as loaded: inputs on the first stage, targets on the last
  Tensor stage_input;      // what the stage's first block takes (a leaf after a receive)
  Tensor output;           // the stage's last block's output, detached, to send
  // Per block of the stage, its input (a leaf after the first block) and its output (the
  // summed loss x scale after the last stage's last block): the graph cut at block
  // boundaries, so that Backward runs block by block and a block's gradients can be
  // reduced while the blocks before it are still running backward.
  std::vector<std::pair<Tensor, Tensor>> segments;
  Tensor grad_output;      // received for `output`
  Tensor grad_input;       // of stage_input, to send back
  std::vector<uint64_t> offsets_before, offsets_after;  // dropout streams around Forward
};

Executor::Executor(const plan::Plan& plan, nn::Sequential& model, Task& task,
                   comm::Communicator& world, const config::TrainConfig& train, comm::Timeout peer_timeout)
    : plan_(plan), model_(model), task_(task), world_(world), train_(train), peer_timeout_(peer_timeout) {
  HT_CHECK(plan.world_size == world.size(), "the plan is for ", plan.world_size,
           " ranks but this job has ", world.size(), "; plan again for this job");
  HT_CHECK(plan.blocks == static_cast<int>(model.size()), "the plan splits ", plan.blocks,
           " blocks but the config's model has ", model.size());
  // train.precision from here on, not from device selection, so that the quick probe
  // before the plan times fp32 products. select_device has refused a reduced precision
  // on a CPU that was asked for by name; a CPU that device "auto" fell back to computes
  // in fp32 (its note said so).
  Backend& device = task_.device();
  device.set_precision(device.kind() == DeviceKind::cpu ? Precision::fp32
                                                        : parse_precision(train.precision));
  take_shares();
  stage_ = rank_plan_.stage;
  replica_ = rank_plan_.replica;
  stages_ = static_cast<int>(plan.stage_ranges.size());
  // Collective: every rank splits, idle ones joining no group.
  stage_group_ = world.split(active() ? stage_ : -1, replica_, peer_timeout_, "the stage groups");
  replica_group_ = world.split(active() ? replica_ : -1, stage_, peer_timeout_, "the replica groups");
  if (!active()) return;

  first_ = stage_ == 0;
  last_ = stage_ == stages_ - 1;
  recompute_ = rank_plan_.recompute;
  scale_ = 1.0 / static_cast<double>(plan.global_batch * task.predictions_per_sample());
  if (config::dynamic_loss_scale(train)) {
    // The replicas agree on an overflow from the verdicts of their stage group's
    // reduction (executor_sync.cpp); a pipeline's stages would need another message.
    HT_CHECK(stages_ == 1, "a dynamic loss scale (train.loss_scale, or train.precision fp16) with a plan of ", stages_,
             " pipeline stages is not built; expected a data-parallel plan (plan again with parallel.strategy "
             "\"auto\" or \"data\")");
    loss_scale_.emplace(loss_scale_config(train.loss_scale));
  }
  params_ = model.named_parameters(static_cast<size_t>(rank_plan_.block_begin),
                                   static_cast<size_t>(rank_plan_.block_end));
  // The model may sit in host staging (see Run in trainer.cpp): this rank computes with
  // its stage's blocks, so those go onto its device, under its memory cap.
  for (const auto& [name, p] : params_) p.rehome(task_.device(), false);
  block_params_ = {0};
  for (int b = rank_plan_.block_begin; b < rank_plan_.block_end; ++b)
    block_params_.push_back(block_params_.back() + model.block(static_cast<size_t>(b)).named_parameters().size());
  shards_ = plan::optimizer_shards(plan, static_cast<size_t>(stage_));
  if (plan::hub_steps_optimizer(plan) && stage_group_->size() > 1) share_weights();
  if (shared_weights_) take_shares();  // lists with the hub's word instead of GatherWeights
  if (shards_.empty()) {
    opt_ = optim::make_optimizer(train.optimizer, params_);
    return;
  }
  for (const auto& [name, p] : params_) shard_params_.emplace_back(name, part_view(p, shards_, replica_));
  opt_ = optim::make_optimizer(train.optimizer, shard_params_);
}

Executor::~Executor() {
  if (std::uncaught_exceptions() > 0) {  // a send destroyed unfinished would be waited for
    for (comm::Request& r : updated_) (void)new comm::Request(std::move(r));
    return;
  }
  // One deadline for all of them: waiting peer_timeout_ on each in turn could hold an
  // ending rank for that many timeouts.
  using std::chrono::duration_cast, std::chrono::steady_clock;
  const auto until = steady_clock::now() + duration_cast<steady_clock::duration>(peer_timeout_);
  const auto left = [&] {
    return std::max(comm::Timeout(0), duration_cast<comm::Timeout>(until - steady_clock::now()));
  };
  try {
    if (draining_) (void)draining_->drain(left());
    for (comm::Request& r : updated_) (void)r.wait(left());
  } catch (...) {
  }
}

// The neighbour may itself have been waiting, for a stage further along that stalled: in
// a pipeline 0-1-2 with rank 1 stopped, rank 0's SendGrad to rank 2 (a rendezvous send
// waits for the receive) named rank 2, which was waiting for rank 1. So the replica's
// ranks, which time out within a step of each other, take a roll call, and the neighbour
// is named only where it is absent from it, or where no one is.
void Executor::fail_neighbour(int peer, const std::string& what) {
  const int neighbour = world_.world_rank(peer);
  std::vector<int> absent;
  if (replica_group_ && replica_group_->size() > 1) absent = comm::absent_after(*replica_group_, peer_timeout_);
  std::vector<int> stalled{neighbour};
  std::string waited = what;
  if (!absent.empty() && std::find(absent.begin(), absent.end(), neighbour) == absent.end()) {
    stalled = absent;
    waited += " (with rank " + std::to_string(neighbour) + ", which answered a roll call and waits too)";
  }
  fail_as<comm::PeerTimeout>(comm::peer_timeout_message(me(), stalled, waited, peer_timeout_));
}

void Executor::take_shares() {
  rank_plan_ = plan_.ranks[static_cast<size_t>(world_.rank())];
  const auto rank = static_cast<size_t>(world_.rank());
  std::vector<bool> shared(plan_.stage_ranges.size(), false);
  if (rank_plan_.stage >= 0) shared[static_cast<size_t>(rank_plan_.stage)] = shared_weights_;
  regular_schedule_ = plan::plan_schedules(plan_, false, shared)[rank];
  const bool on_trial = rank_plan_.replica >= 0 && plan::has_trial(plan_.layout) &&
                        plan_.layout.alternate_micro_batches[static_cast<size_t>(rank_plan_.replica)] > 0;
  trial_schedule_ = on_trial ? plan::plan_schedules(plan_, true, shared)[rank] : plan::Schedule{};
  alternate_next_ = false;
  use_layout(false);
}

void Executor::use_layout(bool trial) {
  layout_ = trial ? plan::trial_layout(plan_.layout) : plan_.layout;
  schedule_ = trial ? trial_schedule_ : regular_schedule_;
  if (rank_plan_.replica < 0) return;  // idle
  const auto r = static_cast<size_t>(rank_plan_.replica);
  for (const plan::Instruction& in : schedule_)
    if (in.op == plan::Op::backward) last_backward_mb_ = in.micro_batch;
  replica_offset_ = 0;
  for (size_t k = 0; k < r; ++k) replica_offset_ += layout_.samples[k];
  mb_offset_.clear();
  int64_t offset = 0;
  for (int mb = 0; mb < layout_.micro_batches[r]; ++mb) {
    mb_offset_.push_back(offset);
    offset += plan::micro_batch_samples(layout_, rank_plan_.replica, mb);
  }
}

void Executor::reshare() {
  const plan::RankPlan& now = plan_.ranks[static_cast<size_t>(world_.rank())];
  HT_CHECK(now.replica == replica_ && now.stage == stage_ && now.block_begin == rank_plan_.block_begin &&
               now.block_end == rank_plan_.block_end && now.recompute == recompute_ &&
               now.optimizer_shard == rank_plan_.optimizer_shard,
           "executor: rank ", me(), " was asked to change its replica, stage, blocks, "
           "recomputation or optimizer shard between steps; only the shares may change");
  take_shares();
  // Under local a group's inner steps change the group's batch (plan::size_group_step).
  if (active()) scale_ = 1.0 / static_cast<double>(plan_.global_batch * task_.predictions_per_sample());
}

Shape Executor::boundary_shape(int mb, bool input) const {
  Shape s{plan::micro_batch_samples(layout_, replica_, mb)};
  const Shape sample = input ? model_.block(static_cast<size_t>(rank_plan_.block_begin)).sample_input_shape()
                             : model_.block(static_cast<size_t>(rank_plan_.block_end - 1)).sample_output_shape();
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

void Executor::load(int mb, int64_t first) {
  const int64_t count = plan::micro_batch_samples(layout_, replica_, mb);
  Batch b = task_.train_batch(first + replica_offset_ + mb_offset_[static_cast<size_t>(mb)], count);
  MicroBatch& m = live_[mb];
  if (first_) m.stage_input = m.inputs = b.inputs;
  if (last_) m.targets = b.targets;
}

// With `keep_graph` false (a recomputing stage's Forward) only the stage input is kept;
// its Recompute calls this again with the dropout streams rewound.
void Executor::forward(int mb, bool keep_graph) {
  MicroBatch& m = live_.at(mb);
  HT_CHECK(m.stage_input.defined(), "executor: rank ", me(), " runs Forward of micro-batch ",
           mb, " before its input was loaded or received");
  const auto begin = static_cast<size_t>(rank_plan_.block_begin);
  const auto end = static_cast<size_t>(rank_plan_.block_end);
  const bool replay = !m.offsets_after.empty();  // this is the Recompute
  if (replay)
    for (size_t b = begin; b < end; ++b) model_.block(b).set_random_offset(m.offsets_before[b - begin]);
  else
    for (size_t b = begin; b < end; ++b) m.offsets_before.push_back(model_.block(b).random_offset());
  {
    std::unique_ptr<NoGradGuard> no_grad;
    if (!keep_graph) no_grad = std::make_unique<NoGradGuard>();
    Tensor h = m.stage_input;
    for (size_t b = begin; b < end; ++b) {
      const Tensor in = keep_graph && b > begin ? h.detach().set_requires_grad() : h;
      h = model_.block(b).forward(in);
      if (keep_graph) m.segments.emplace_back(in, h);
      if (poll_) poll_();
    }
    if (last_) {
      Tensor loss = summed_loss(h, m.targets);
      if (!replay) {
        loss_sum_ += static_cast<double>(loss.item());
        loss_samples_ += m.targets.shape()[0];
      }
      if (keep_graph) m.segments.back().second = mul(loss, static_cast<float>(scale_ * step_scale_));
    } else {
      m.output = h.detach();
    }
  }
  if (replay) {
    for (size_t b = begin; b < end; ++b) model_.block(b).set_random_offset(m.offsets_after[b - begin]);
  } else {
    for (size_t b = begin; b < end; ++b) m.offsets_after.push_back(model_.block(b).random_offset());
  }
}

// Block by block, last first. In the rank's last Backward of the step each block's
// gradients are final once its backward is done: they join the stage's all-reduce then.
void Executor::backward(int mb) {
  MicroBatch& m = live_.at(mb);
  HT_CHECK(!m.segments.empty(), "executor: rank ", me(), " runs Backward of micro-batch ", mb,
           " without its Forward");
  HT_CHECK(last_ || m.grad_output.defined(), "executor: rank ", me(),
           " runs Backward of micro-batch ", mb, " before its gradient arrived");
  const bool overlap = reduce_ && mb == overlap_mb_;  // after its ReduceStart
  Tensor grad = m.grad_output;
  for (size_t i = m.segments.size(); i-- > 0;) {
    auto& [in, out] = m.segments[i];
    if (last_ && i + 1 == m.segments.size()) out.backward();
    else out.backward(grad);
    if (i + 1 == m.segments.size() && mb == last_backward_mb_ && faults_ &&
        (faults_->poison_gradient() || faults_->gradient_scale() != 1))
      corrupt_gradient(block_params_[i], block_params_[i + 1]);
    if (i > 0) {
      grad = in.grad();
      HT_CHECK(grad.defined(), "executor: rank ", me(), " block ", rank_plan_.block_begin + static_cast<int>(i),
               " got no gradient for its input of micro-batch ", mb);
    }
    if (overlap) {
      add_to_reduce(block_params_[i], block_params_[i + 1]);
      reduce_->progress();
    }
    if (poll_) poll_();
  }
  m.segments.clear();
  if (!first_) {
    m.grad_input = m.stage_input.grad();
    HT_CHECK(m.grad_input.defined(), "executor: rank ", me(), " stage ", stage_,
             " got no gradient for its input of micro-batch ", mb);
  }
  m.output = m.grad_output = Tensor();
  if (first_) live_.erase(mb);
}

StepResult Executor::step(int64_t first, float lr, bool record_spans) {
  StepResult r;
  if (!active()) return r;
  if (!trial_schedule_.empty()) {  // a micro-batch trial: its list in every other step
    use_layout(alternate_next_);
    alternate_next_ = !alternate_next_;
  }
  r.micro_batches = layout_.micro_batches[static_cast<size_t>(replica_)];
  loss_sum_ = 0;
  loss_samples_ = 0;
  live_.clear();
  reduce_.reset();
  reduce_order_.clear();
  overlap_mb_ = -1;
  guard_.begin_step();
  counts_.clear();
  groups_.clear();
  events_.clear();
  verdict_ = Verdict::kept;
  skip_update_ = false;
  stop_signal_ = 0;
  step_scale_ = loss_scale_ ? loss_scale_->scale() : 1.0;
  if (stage_group_->size() > 1) ensure_quarantine();
  if (stage_group_->size() > 1 && !deadline_)
    reduce_ = std::make_unique<comm::OverlappedAllreduce>(
        *stage_group_, plan::stage_reduce_parts(plan_, plan_.layout, static_cast<size_t>(stage_)), !shards_.empty());
  const auto start = Clock::now();
  r.start_s = comm::clock_seconds(start);
  if (const double stall = faults_ ? faults_->take_stall() : 0; stall > 0)  // --inject stall: before any instruction
    std::this_thread::sleep_for(std::chrono::duration<double>(stall));
  // By index: a catch-up that brings other shares replaces the list (take_deadline_shares).
  for (size_t i = 0; i < schedule_.size(); ++i) {
    const plan::Instruction in = schedule_[i];
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    bool comm = false;
    auto what = [&] { return std::string(plan::op_name(in.op)) + " of micro-batch " + std::to_string(in.micro_batch); };
    auto wait = [&](comm::WaitStatus s) {
      if (s != comm::WaitStatus::done) fail_neighbour(in.peer, what());
    };
    switch (in.op) {
      case plan::Op::load_micro_batch: load(in.micro_batch, first); break;
      case plan::Op::forward: forward(in.micro_batch, !recompute_); break;
      case plan::Op::recompute: forward(in.micro_batch, true); break;
      case plan::Op::backward: backward(in.micro_batch); break;
      case plan::Op::send_activation:
        comm = true;
        wait(world_.isend(live_.at(in.micro_batch).output, in.peer, kTagActivation).wait(peer_timeout_));
        break;
      case plan::Op::recv_activation: {
        comm = true;
        Tensor x = Tensor::empty(boundary_shape(in.micro_batch, true), DType::f32, task_.device(), "activation");
        wait(world_.recv(x, in.peer, kTagActivation, peer_timeout_));
        live_[in.micro_batch].stage_input = x.set_requires_grad();
        break;
      }
      case plan::Op::send_grad:
        comm = true;
        wait(world_.isend(live_.at(in.micro_batch).grad_input, in.peer, kTagGrad).wait(peer_timeout_));
        live_.erase(in.micro_batch);
        break;
      case plan::Op::recv_grad: {
        comm = true;
        Tensor g = Tensor::empty(boundary_shape(in.micro_batch, false), DType::f32, task_.device(), "gradient");
        wait(world_.recv(g, in.peer, kTagGrad, peer_timeout_));
        live_.at(in.micro_batch).grad_output = g;
        break;
      }
      case plan::Op::reduce_grads:
        comm = true;
        if (reduce_) r.grads_overlapped = reduce_order_.size();
        reduce_grads();
        break;
      case plan::Op::optimizer_step:
        if (r.deadline && r.deadline->ended) break;  // caught up to the end: nothing to apply
        optimizer_step(r.deadline ? lr_at_(r.deadline->record.step) : lr);
        break;
      case plan::Op::catch_up:  // a catch-up moves this rank's step on: its data moves with it
        if (deadline_) {
          const int64_t before = deadline_->step();
          deadline_->catch_up(stages_ == 1);
          first += (deadline_->step() - before) * plan_.global_batch;
          // The catch-up brought another split (a re-split this rank missed): this step
          // runs it, from its list's instruction after CatchUp, the first in both lists.
          if (take_deadline_shares()) {
            HT_CHECK(i == 0 && !schedule_.empty() && schedule_[0].op == plan::Op::catch_up, "executor: rank ", me(),
                     " took new shares at a CatchUp that is not the first instruction of both lists");
            r.micro_batches = layout_.micro_batches[static_cast<size_t>(replica_)];
          }
        }
        break;
      case plan::Op::align_replica:
        comm = true;
        align_replica(r);
        break;
      case plan::Op::reduce_grads_deadline:
        comm = true;
        reduce_grads_deadline(r, start);
        break;
      case plan::Op::outer_sync_finish:
      case plan::Op::outer_sync_start:
        fail("executor: rank ", me(), " met ", plan::op_name(in.op),
             " in a step's list; the outer synchronisation runs between steps (runtime/local_sync.h)");
      case plan::Op::reduce_start:  // the Backward of this micro-batch feeds ReduceGrads
        comm = true;
        overlap_mb_ = in.micro_batch;
        break;
      case plan::Op::gather_weights:
        comm = true;
        gather_weights();
        break;
      case plan::Op::share_weights:
      case plan::Op::await_weights:
        comm = true;
        pass_weights_word(in.op == plan::Op::share_weights);
        break;
    }
    if (!comm && faults_ && faults_->slow_factor() > 1)  // --inject slow: F x this compute's time
      std::this_thread::sleep_for(std::chrono::duration<double>((faults_->slow_factor() - 1) *
                                                                seconds_since(t0)));
    const double dt = seconds_since(t0);
    (comm ? r.comm_s : r.compute_s) += dt;
    const double cpu = process_cpu_seconds() - cpu0;
    (comm ? r.comm_cpu_s : in.op == plan::Op::optimizer_step ? r.optimizer_cpu_s : r.work_cpu_s) += cpu;
    if (in.op == plan::Op::optimizer_step) r.optimizer_s += dt;
    if (plan::is_reduction(in.op) || in.op == plan::Op::gather_weights || in.op == plan::Op::share_weights ||
        in.op == plan::Op::await_weights)
      r.reduce_s += dt;
    if (record_spans) {
      const double at = std::chrono::duration<double>(t0 - start).count();
      r.spans.push_back({world_.rank(), plan::op_name(in.op), comm ? "comm" : "compute", at, at + dt,
                         in.micro_batch, in.stage});
    }
  }
  HT_CHECK(live_.empty(), "executor: rank ", me(), " ended a step with ", live_.size(),
           " micro-batches not backwarded (an inconsistent schedule)");
  // Gradients are not kept between steps: evaluation and checkpoints get the memory.
  for (const auto& [name, p] : params_) p.zero_grad();
  opt_->zero_grad();  // when sharded, the views of the parts hold their own
  // A contribution left out may come from a rank whose loss is not finite either: it
  // takes its samples out of the step's loss, which is then the mean over the others (and
  // where no sample's loss is left, training has diverged: Run::check_loss).
  const bool lost = verdict_ != Verdict::kept && !std::isfinite(loss_sum_);
  r.loss_sum = lost ? 0 : loss_sum_;
  r.loss_samples = lost ? 0 : loss_samples_;
  r.guard_events = std::move(events_);
  r.update_skipped = skip_update_;
  r.stop_signal = stop_signal_;
  r.wall_s = seconds_since(start);
  if (deadline_ && deadline_->rebalances()) {
    // What this step measured goes with the next contributions; a re-split the step's
    // record carried runs from the next step.
    deadline_->set_report(DeadlineRebalancer::row(r.compute_s - r.optimizer_s, r.optimizer_s, r.wall_s, r.reduce_s,
                                                  r.work_cpu_s, r.optimizer_cpu_s, r.comm_cpu_s, r.micro_batches,
                                                  layout_.samples[static_cast<size_t>(replica_)]));
    take_deadline_shares();
  }
  return r;
}

void Executor::load_optimizer_state(const std::vector<nn::NamedTensor>& whole) const {
  opt_->load_state(shards_.empty() ? whole : optimizer_state_part(whole, params_, shards_, replica_));
}

void Executor::load_optimizer_state(const optim::Optimizer::StateSource& whole) const {
  if (shards_.empty()) return opt_->load_state(whole);
  // This rank's part of each tensor, as optimizer_state_part takes it, a tensor at a time.
  const std::map<std::string, const Tensor*> by_name = parameters_by_name(params_);
  optim::Optimizer::StateSource part = whole;
  part.shape = [this, whole, by_name](const std::string& name) {
    const auto [shape, dtype] = whole.shape(name);
    const Tensor* p = slot_parameter(name, dtype, by_name);
    if (!p) return std::make_pair(shape, dtype);
    check_slot_shape(name, shape, *p);
    const auto [begin, end] = part_range(numel(shape), shards_, replica_);
    return std::make_pair(Shape{end - begin}, dtype);
  };
  part.read = [this, whole](const std::string& name) {
    return optimizer_state_part({{name, whole.read(name)}}, params_, shards_, replica_).front().second;
  };
  opt_->load_state(part);
}

std::string Executor::parameter_checksum() const {
  if (!active()) return "";
  uint32_t crc = 0;
  for (const auto& [name, t] : params_) {
    const Tensor dense = contiguous(t.detach());
    if (dense.backend().kind() == DeviceKind::cpu) {
      crc = crc32_update(crc, dense.data(), static_cast<size_t>(dense.numel()) * 4);
    } else {  // a device's memory is read through a staged host copy
      const std::vector<float> host = dense.to_vector();
      crc = crc32_update(crc, host.data(), host.size() * 4);
    }
  }
  return crc32_hex(crc);
}

void check_replicas_identical(const plan::Plan& plan, const std::vector<std::string>& checksums,
                              int64_t step) {
  HT_CHECK(checksums.size() == plan.ranks.size(), "check_replicas_identical: ", checksums.size(),
           " checksums for ", plan.ranks.size(), " ranks");
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    const int first = plan.layout.replicas[0][s];
    for (const auto& replica : plan.layout.replicas) {
      const int other = replica[s];
      HT_CHECK(checksums[static_cast<size_t>(other)] == checksums[static_cast<size_t>(first)],
               "replicas diverged by step ", step, ": stage ", s, " has parameter checksum ",
               checksums[static_cast<size_t>(first)], " on rank ", first, " but ",
               checksums[static_cast<size_t>(other)], " on rank ", other,
               "; expected bit-identical replicas (a rank with different hardware arithmetic or a "
               "lost gradient reduction)");
    }
  }
}

plan::Plan single_process_plan(int blocks, int64_t global_batch, int micro_batches) {
  plan::Plan p;
  p.world_size = 1;
  p.blocks = blocks;
  p.global_batch = global_batch;
  p.strategy = plan::Strategy::data;
  p.stage_ranges = {{0, blocks}};
  p.layout.replicas = {{0}};
  p.layout.samples = {global_batch};
  p.layout.micro_batches = {micro_batches};
  plan::RankPlan r;
  r.replica = r.stage = 0;
  r.block_end = blocks;
  r.samples = global_batch;
  r.micro_batches = micro_batches;
  r.micro_batch_size = (global_batch + micro_batches - 1) / micro_batches;
  p.ranks = {r};
  return p;
}

std::vector<nn::NamedTensor> optimizer_state_part(const std::vector<nn::NamedTensor>& whole,
                                                  const std::vector<nn::NamedTensor>& params,
                                                  const std::vector<double>& shards, int part) {
  const std::map<std::string, const Tensor*> by_name = parameters_by_name(params);
  std::vector<nn::NamedTensor> out;
  for (const auto& [name, t] : whole) {
    const Tensor* p = slot_parameter(name, t.dtype(), by_name);
    if (!p) {
      out.emplace_back(name, t);
      continue;
    }
    check_slot_shape(name, t.shape(), *p, t.is_contiguous());
    out.emplace_back(name, part_view(t, shards, part));
  }
  return out;
}

}  // namespace ht::runtime
