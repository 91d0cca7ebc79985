#include "runtime/stage_gather.h"

#include <chrono>
#include <cmath>
#include <set>
#include <string>

#include "backend/registry.h"
#include "core/error.h"
#include "optim/make_optimizer.h"

namespace ht::runtime {

namespace {

constexpr int kTagGather = 21;

// The same list, in the same order, that `src` sends: its parameters and, with state, its
// optimiser's state() (an optimiser over the same parameters lists the same names in the
// same order).
void receive_all(std::vector<nn::NamedTensor>& into, comm::Communicator& world, int src, comm::Timeout timeout,
                 std::string_view what) {
  for (auto& [name, t] : into)
    if (world.recv(t, src, kTagGather, timeout) != comm::WaitStatus::done)
      fail_as<comm::PeerTimeout>(comm::peer_timeout_message(world.world_rank(world.rank()), {world.world_rank(src)},
                                                            std::string(what) + " ('" + name + "')", timeout));
}

void send_all(const std::vector<nn::NamedTensor>& from, comm::Communicator& world, int dst, comm::Timeout timeout,
              std::string_view what) {
  for (const auto& [name, t] : from)
    world.send(t, dst, kTagGather, timeout, std::string(what) + " ('" + name + "')");
}

// Copies `from` (on any backend) into `to`, tensor by tensor: same shapes and dtypes.
void copy_into(const std::vector<nn::NamedTensor>& to, const std::vector<nn::NamedTensor>& from) {
  for (size_t i = 0; i < to.size(); ++i) {
    const Tensor& dst = to[i].second;
    const Tensor& src = from[i].second;
    const size_t bytes = static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype());
    if (dst.dtype() == DType::f32) dst.backend().copy_from_host(dst.raw(), src.to_vector().data(), bytes);
    else dst.backend().copy_from_host(dst.raw(), src.to_ints().data(), bytes);
  }
}

}  // namespace

std::vector<nn::NamedTensor> gather_to_root(const plan::Plan& plan, const Executor& executor,
                                            nn::Sequential& model, comm::Communicator& world,
                                            const config::OptimizerConfig& opt,
                                            bool optimizer_state, comm::Timeout timeout,
                                            std::string_view what) {
  const bool root = world.rank() == 0;
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    const int src = plan.layout.replicas[0][s];
    if (src == world.rank() && !root) send_all(executor.parameters(), world, 0, timeout, what);
    if (!root || src == 0) continue;
    const auto [begin, end] = plan.stage_ranges[s];
    std::vector<nn::NamedTensor> params =
        model.named_parameters(static_cast<size_t>(begin), static_cast<size_t>(end));
    receive_all(params, world, src, timeout, what);
  }
  if (!optimizer_state) return {};
  const std::vector<CheckpointSlot> slots = root ? optimizer_state_slots(plan, model, opt) : std::vector<CheckpointSlot>{};
  std::vector<nn::NamedTensor> state;
  stream_optimizer_state(plan, executor, model, world, opt, timeout, what, [&](const Tensor& t) {
    state.emplace_back(slots[state.size()].name, t.dense_copy());
  });
  return state;
}

namespace {

// What an optimiser of `opt` lists per parameter (the suffix after the parameter's name;
// f32 slots of the parameter's shape, counters of their own) and once for all, learnt from
// one over a single parameter of two elements.
struct StateShape {
  std::vector<CheckpointSlot> per_param;  // names are suffixes (".exp_avg"); an empty shape: the parameter's
  std::vector<CheckpointSlot> global;
};

StateShape state_shape(const config::OptimizerConfig& opt) {
  Allocator::HostStaging staging;
  const Tensor p = Tensor::zeros({2}, cpu_backend());
  StateShape out;
  for (const auto& [name, t] : optim::make_optimizer(opt, {{"p", p}})->state()) {
    if (name.rfind("p.", 0) != 0) {
      out.global.push_back({name, t.dtype(), t.shape()});
      continue;
    }
    // A float slot is of the parameter's shape (optimizer_state_part shards it so).
    const bool slot = t.dtype() == DType::f32;
    HT_CHECK(!slot || t.shape() == p.shape(), "optimizer state '", name, "' has shape ", to_string(t.shape()),
             "; expected its parameter's ", to_string(p.shape()));
    out.per_param.push_back({name.substr(1), t.dtype(), slot ? Shape{} : t.shape()});
  }
  return out;
}

// One stage's state slots, in its optimiser's order.
std::vector<CheckpointSlot> stage_slots(const StateShape& shape, const std::vector<nn::NamedTensor>& params) {
  std::vector<CheckpointSlot> out;
  for (const auto& [name, p] : params)
    for (const CheckpointSlot& s : shape.per_param)
      out.push_back({name + s.name, s.dtype, s.dtype == DType::f32 ? p.shape() : s.shape});
  for (const CheckpointSlot& s : shape.global) out.push_back(s);
  return out;
}

}  // namespace

std::vector<CheckpointSlot> optimizer_state_slots(const plan::Plan& plan, nn::Sequential& model,
                                                  const config::OptimizerConfig& opt) {
  const StateShape shape = state_shape(opt);
  std::vector<CheckpointSlot> out;
  std::set<std::string> seen;
  for (const auto& [begin, end] : plan.stage_ranges)
    for (CheckpointSlot& s :
         stage_slots(shape, model.named_parameters(static_cast<size_t>(begin), static_cast<size_t>(end))))
      if (seen.insert(s.name).second) out.push_back(std::move(s));  // one "step" for all stages
  return out;
}

void stream_optimizer_state(const plan::Plan& plan, const Executor& executor, nn::Sequential& model,
                            comm::Communicator& world, const config::OptimizerConfig& opt,
                            comm::Timeout timeout, std::string_view what,
                            const std::function<void(const Tensor&)>& sink) {
  const bool root = world.rank() == 0;
  const StateShape shape = root ? state_shape(opt) : StateShape{};
  std::set<std::string> seen;
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    const int src = plan.layout.replicas[0][s];
    // When the stage is sharded, every replica sends its part of the optimiser state.
    const std::vector<double> shards = plan::optimizer_shards(plan, s);
    if (!root && executor.stage() == static_cast<int>(s) && (src == world.rank() || !shards.empty()))
      send_all(executor.optimizer()->state(), world, 0, timeout, what);
    if (!root) continue;

    const auto [begin, end] = plan.stage_ranges[s];
    const std::vector<nn::NamedTensor> params =
        model.named_parameters(static_cast<size_t>(begin), static_cast<size_t>(end));
    const int replicas = shards.empty() ? 1 : static_cast<int>(plan.layout.replicas.size());
    // Rank 0's own part, where it holds one: live buffers, not copies.
    bool mine = false;
    for (int r = 0; r < replicas; ++r) mine = mine || plan.layout.replicas[static_cast<size_t>(r)][s] == 0;
    const std::vector<nn::NamedTensor> own = mine ? executor.optimizer()->state() : std::vector<nn::NamedTensor>{};
    const std::vector<CheckpointSlot> slots = stage_slots(shape, params);
    HT_CHECK(!mine || own.size() == slots.size(), "the checkpoint stream: rank 0's optimiser lists ", own.size(),
             " state tensors for stage ", s, "; expected ", slots.size(), " (its stage's parameters' slots)");
    for (size_t i = 0; i < slots.size(); ++i) {
      const CheckpointSlot& slot = slots[i];
      Tensor whole;
      if (shards.empty() && src == 0) {
        whole = own[i].second;
      } else {
        Allocator::HostStaging staging;
        whole = Tensor::empty(slot.shape, slot.dtype, cpu_backend());
        for (int r = 0; r < replicas; ++r) {
          const int from = plan.layout.replicas[static_cast<size_t>(r)][s];
          std::vector<nn::NamedTensor> into =
              shards.empty() ? std::vector<nn::NamedTensor>{{slot.name, whole}}
                             : optimizer_state_part({{slot.name, whole}}, params, shards, r);
          if (from == 0) copy_into(into, {own[i]});
          else receive_all(into, world, from, timeout, what);
        }
      }
      if (seen.insert(slot.name).second) sink(whole);  // one "step" for all stages
    }
  }
}

void load_stage(const Checkpoint& checkpoint, const Executor& executor) {
  if (!executor.active()) return;  // an idle rank holds nothing
  // The stage's part of the checkpoint: its weights (load_into names any missing or
  // mismatched) and its optimiser state, read from the file as they are loaded.
  Checkpoint params;
  params.path = checkpoint.path;
  params.source = checkpoint.source;
  std::vector<nn::NamedTensor> into;
  for (const auto& [name, t] : executor.parameters()) {
    into.emplace_back("model." + name, t);
    if (auto it = checkpoint.tensors.find("model." + name); it != checkpoint.tensors.end()) params.tensors.insert(*it);
    if (auto it = checkpoint.table.find("model." + name); it != checkpoint.table.end()) params.table.insert(*it);
  }
  load_into(into, params, "model.");

  // The stage's optimiser state, read from the file a tensor at a time as the optimiser
  // takes it.
  std::set<std::string> own;
  for (const auto& p : executor.parameters()) own.insert(p.first);
  optim::Optimizer::StateSource state;
  for (const auto& [name, slot] : checkpoint.table) {
    if (name.rfind("optim.", 0) != 0) continue;
    // "optim.step", or "optim.<parameter>.<slot>" of one of the stage's parameters.
    const std::string rest = name.substr(6);
    const size_t dot = rest.rfind('.');
    if (rest == "step" || (dot != std::string::npos && own.count(rest.substr(0, dot)) > 0)) state.names.push_back(rest);
  }
  state.shape = [&](const std::string& rest) {
    const CheckpointSlot& slot = checkpoint.table.at("optim." + rest);
    return std::make_pair(slot.shape, slot.dtype);
  };
  state.read = [&](const std::string& rest) { return checkpoint.get("optim." + rest); };
  try {
    executor.load_optimizer_state(state);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const CheckpointReadError&) {
    throw;
  } catch (const optim::StateValueError& e) {
    fail("checkpoint ", checkpoint.path, ": its optimizer state is refused (", e.what(), "; the file is corrupt)");
  } catch (const Error& e) {  // the optimizer names the state it lacks; say whose it is
    fail("checkpoint ", checkpoint.path, ": its optimizer state does not fit this config's optimizer (",
         e.what(), "); expected a checkpoint of the same train.optimizer.type");
  }
}

std::unique_ptr<Executor> relayout(std::unique_ptr<Executor> executor, const plan::Plan& before,
                                   const plan::Plan& after, nn::Sequential& model, Task& task,
                                   comm::Communicator& world, const config::TrainConfig& train,
                                   comm::Timeout peer_timeout) {
  HT_CHECK(plan::replicates_whole_model(before) && plan::replicates_whole_model(after) &&
               before.world_size == after.world_size && before.blocks == after.blocks,
           "relayout: only between data-parallel plans over the whole model without optimizer sharding, ",
           "for the same world and model; got a ", plan::to_string(before.strategy), " and a ",
           plan::to_string(after.strategy), " plan");
  const int me = world.rank();
  const bool was_active = executor->active();
  // The old optimiser's buffers outlive it: the new one takes copies.
  const std::vector<nn::NamedTensor> kept = was_active ? executor->optimizer()->state() : std::vector<nn::NamedTensor>{};
  // The dynamic loss scale goes on, and a joining rank takes the source's: every replica
  // must seed its backward with the same scale, sent as its exponent.
  int32_t scale_log2 = 0, clean = 0;
  if (const DynamicLossScale* ls = was_active ? executor->loss_scale() : nullptr) {
    scale_log2 = ls->log2_scale();
    clean = static_cast<int32_t>(ls->clean_steps());
  }
  executor.reset();
  auto next = std::make_unique<Executor>(after, model, task, world, train, peer_timeout);
  constexpr std::string_view kWhat = "the relayout's parameters for a joining rank";
  const int source = before.layout.replicas[0][0];
  std::vector<nn::NamedTensor> params = model.named_parameters();
  for (const plan::RankPlan& r : after.ranks) {
    const bool joins = r.replica >= 0 && before.ranks[static_cast<size_t>(r.rank)].replica < 0;
    if (!joins) continue;
    if (me == source) {
      send_all(params, world, r.rank, peer_timeout, kWhat);
      send_all(kept, world, r.rank, peer_timeout, kWhat);
      std::vector<int32_t> offsets;
      for (size_t b = 0; b < model.size(); ++b) {
        const uint64_t o = model.block(b).random_offset();
        offsets.push_back(static_cast<int32_t>(o & 0xffffffffu));
        offsets.push_back(static_cast<int32_t>(o >> 32));
      }
      offsets.push_back(scale_log2);
      offsets.push_back(clean);
      world.send(Tensor::from_ints(offsets, {static_cast<int64_t>(offsets.size())}, cpu_backend()), r.rank, kTagGather,
                 peer_timeout, kWhat);
    } else if (me == r.rank) {
      receive_all(params, world, source, peer_timeout, kWhat);
      std::vector<nn::NamedTensor> state;
      {
        Allocator::HostStaging staging;  // copied into the optimiser's own buffers
        state = optim::make_optimizer(train.optimizer, params)->state();
      }
      receive_all(state, world, source, peer_timeout, kWhat);
      next->load_optimizer_state(state);
      std::vector<nn::NamedTensor> offsets{{"random offsets and loss scale", Tensor::empty({2 * static_cast<int64_t>(model.size()) + 2}, DType::i32, cpu_backend())}};
      receive_all(offsets, world, source, peer_timeout, kWhat);
      const std::vector<int32_t> o = offsets[0].second.to_ints();
      for (size_t b = 0; b < model.size(); ++b)
        model.block(b).set_random_offset(static_cast<uint32_t>(o[2 * b]) |
                                         (static_cast<uint64_t>(static_cast<uint32_t>(o[2 * b + 1])) << 32));
      if (next->loss_scale()) next->restore_loss_scale(std::ldexp(1.0, o[2 * model.size()]), o[2 * model.size() + 1]);
    }
  }
  if (was_active && next->active()) {
    next->load_optimizer_state(kept);
    if (next->loss_scale()) next->restore_loss_scale(std::ldexp(1.0, scale_log2), clean);
  }
  return next;
}

}  // namespace ht::runtime
