#include "runtime/stage_gather.h"

#include <chrono>
#include <cmath>
#include <set>
#include <string>

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
  std::vector<nn::NamedTensor> state;
  std::set<std::string> seen;
  const bool root = world.rank() == 0;
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    const int src = plan.layout.replicas[0][s];
    // When the stage is sharded, every replica sends its part of the optimiser state.
    const std::vector<double> shards = optimizer_state ? plan::optimizer_shards(plan, s) : std::vector<double>{};
    if (src == world.rank() && !root) send_all(executor.parameters(), world, 0, timeout, what);
    if (optimizer_state && !root && executor.stage() == static_cast<int>(s) &&
        (src == world.rank() || !shards.empty()))
      send_all(executor.optimizer()->state(), world, 0, timeout, what);
    if (!root) continue;

    const auto [begin, end] = plan.stage_ranges[s];
    std::vector<nn::NamedTensor> params =
        model.named_parameters(static_cast<size_t>(begin), static_cast<size_t>(end));
    if (src != 0) receive_all(params, world, src, timeout, what);
    if (!optimizer_state) continue;
    // Names and shapes to receive into: a whole stage's optimiser.
    std::vector<nn::NamedTensor> stage_state = optim::make_optimizer(opt, params)->state();
    const int replicas = shards.empty() ? 1 : static_cast<int>(plan.layout.replicas.size());
    for (int r = 0; r < replicas; ++r) {
      const int from = plan.layout.replicas[static_cast<size_t>(r)][s];
      std::vector<nn::NamedTensor> into =
          shards.empty() ? stage_state : optimizer_state_part(stage_state, params, shards, r);
      if (from == 0) copy_into(into, executor.optimizer()->state());
      else receive_all(into, world, from, timeout, what);
    }
    for (auto& nt : stage_state)
      if (seen.insert(nt.first).second) state.push_back(nt);  // one "step" for all stages
  }
  return state;
}

void load_stage(const Checkpoint& checkpoint, const Executor& executor) {
  if (!executor.active()) return;  // an idle rank holds nothing
  Checkpoint params = checkpoint;
  params.tensors.clear();
  std::vector<nn::NamedTensor> into;
  for (const auto& [name, t] : executor.parameters()) {
    into.emplace_back("model." + name, t);
    auto it = checkpoint.tensors.find("model." + name);
    if (it != checkpoint.tensors.end()) params.tensors.insert(*it);
  }
  load_into(into, params, "model.");  // names a missing or mismatched tensor

  std::vector<nn::NamedTensor> state;
  for (const auto& [name, t] : checkpoint.tensors) {
    if (name.rfind("optim.", 0) != 0) continue;
    const std::string rest = name.substr(6);
    bool mine = rest == "step";
    for (const auto& p : executor.parameters()) mine = mine || rest.rfind(p.first + ".", 0) == 0;
    if (mine) state.emplace_back(rest, t);
  }
  try {
    executor.load_optimizer_state(state);
  } catch (const OutOfMemory&) {
    throw;
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
