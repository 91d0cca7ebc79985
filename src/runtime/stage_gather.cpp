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
    std::vector<nn::NamedTensor> stage_state;
    if (src == world.rank()) {
      if (optimizer_state) stage_state = executor.optimizer()->state();
      if (!root) {
        for (const auto& [name, t] : executor.parameters()) world.send(t, 0, kTagGather);
        for (const auto& [name, t] : stage_state) world.send(t, 0, kTagGather);
        continue;
      }
    } else if (root) {
      const auto [begin, end] = plan.stage_ranges[s];
      std::vector<nn::NamedTensor> params =
          model.named_parameters(static_cast<size_t>(begin), static_cast<size_t>(end));
      receive_all(params, world, src);
      if (optimizer_state) {
        auto layout = optim::make_optimizer(opt, params);  // names and shapes to receive into
        stage_state = layout->state();
        receive_all(stage_state, world, src);
      }
    }
    if (root)
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
  executor.optimizer()->load_state(state);
}

}  // namespace ht::runtime
