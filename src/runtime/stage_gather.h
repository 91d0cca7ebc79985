// Moving a model split over pipeline stages to and from whole-model form: rank 0 gathers
// replica 0's stages (for evaluation and for checkpoints that do not depend on the world
// size), and every rank takes its own stage out of a whole-model checkpoint to resume.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/block.h"
#include "plan/plan.h"
#include "runtime/checkpoint.h"
#include "runtime/executor.h"

namespace ht::runtime {

// Collective over `world`. Afterwards rank 0's `model` holds replica 0's trained
// parameters for every block. With `optimizer_state`, rank 0 also gets the whole
// model's optimiser state, named as one process's optimiser names it; other ranks get {}.
std::vector<nn::NamedTensor> gather_to_root(const plan::Plan& plan, const Executor& executor,
                                            nn::Sequential& model, comm::Communicator& world,
                                            const config::OptimizerConfig& opt,
                                            bool optimizer_state);

// Loads this rank's parameters and optimiser state from a whole-model checkpoint
// ("model.<name>", "optim.<name>.<slot>", "optim.step"), ignoring other stages' tensors.
void load_stage(const Checkpoint& checkpoint, const Executor& executor);

}  // namespace ht::runtime
