#include "runtime/stage_gather.h"

#include <chrono>
#include <set>
#include <string>

#include "core/error.h"
#include "optim/make_optimizer.h"

namespace ht::runtime {

namespace {

constexpr int kTagGather = 21;
constexpr std::chrono::seconds kGatherTimeout{600};

// The same list, in the same order, that the stage's rank sends: its parameters and, with
// state, its optimiser's state() (an optimiser over the same parameters lists the same
// names in the same order).
void receive_all(std::vector<nn::NamedTensor>& into, comm::Communicator& world, int src) {
  for (auto& [name, t] : into) {
    const comm::WaitStatus s = world.recv(t, src, kTagGather, kGatherTimeout);
    HT_CHECK(s == comm::WaitStatus::done, "rank 0: gathering '", name, "' from rank ", src,
             " timed out after ", kGatherTimeout.count(), " s");
  }
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
                                            bool optimizer_state) {
  std::vector<nn::NamedTensor> state;
  std::set<std::string> seen;
  const bool root = world.rank() == 0;
  for (size_t s = 0; s < plan.stage_ranges.size(); ++s) {
    const int src = plan.layout.replicas[0][s];
    // When the stage is sharded, every replica sends its part of the optimiser state.
    const std::vector<double> shards = optimizer_state ? plan::optimizer_shards(plan, s) : std::vector<double>{};
    if (src == world.rank() && !root)
      for (const auto& [name, t] : executor.parameters()) world.send(t, 0, kTagGather);
    if (optimizer_state && !root && executor.stage() == static_cast<int>(s) &&
        (src == world.rank() || !shards.empty()))
      for (const auto& [name, t] : executor.optimizer()->state()) world.send(t, 0, kTagGather);
    if (!root) continue;

    const auto [begin, end] = plan.stage_ranges[s];
    std::vector<nn::NamedTensor> params =
        model.named_parameters(static_cast<size_t>(begin), static_cast<size_t>(end));
    if (src != 0) receive_all(params, world, src);
    if (!optimizer_state) continue;
    // Names and shapes to receive into: a whole stage's optimiser.
    std::vector<nn::NamedTensor> stage_state = optim::make_optimizer(opt, params)->state();
    const int replicas = shards.empty() ? 1 : static_cast<int>(plan.layout.replicas.size());
    for (int r = 0; r < replicas; ++r) {
      const int from = plan.layout.replicas[static_cast<size_t>(r)][s];
      std::vector<nn::NamedTensor> into =
          shards.empty() ? stage_state : optimizer_state_part(stage_state, params, shards, r);
      if (from == 0) copy_into(into, executor.optimizer()->state());
      else receive_all(into, world, from);
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
  executor.load_optimizer_state(state);
}

}  // namespace ht::runtime
