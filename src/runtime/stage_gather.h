// Moving a model split over pipeline stages to and from whole-model form: rank 0 gathers
// replica 0's stages (for evaluation and for checkpoints that do not depend on the world
// size), and every rank takes its own stage out of a whole-model checkpoint to resume;
// and moving a data-parallel job to another set of ranks while it trains.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
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
// model's optimiser state, named as one process's optimiser names it (copies of what
// stream_optimizer_state gives); other ranks get {}.
// Every send and receive waits up to `timeout`; a miss raises comm::PeerTimeout naming
// the rank not heard from and `what` ("the evaluation gather"). Raised while a checkpoint
// streams (stream_optimizer_state), it unwinds the CheckpointWriter, which removes its
// temporary file: a checkpoint whose gather timed out leaves no file behind.
std::vector<nn::NamedTensor> gather_to_root(const plan::Plan& plan, const Executor& executor,
                                            nn::Sequential& model, comm::Communicator& world,
                                            const config::OptimizerConfig& opt,
                                            bool optimizer_state, comm::Timeout timeout,
                                            std::string_view what);

// The whole model's optimiser state as rank 0 streams it to a checkpoint: every stage's
// tensors in stage order, named as one process's optimiser names them ("step" once), with
// their dtypes and shapes. Nothing is allocated: the names and shapes are those an
// optimiser of `opt` lists for one parameter, repeated for each of `model`'s.
std::vector<CheckpointSlot> optimizer_state_slots(const plan::Plan& plan, nn::Sequential& model,
                                                  const config::OptimizerConfig& opt);

// Collective over `world`: rank 0 passes the whole model's optimiser state to `sink`, one
// tensor at a time in optimizer_state_slots' order, as the ranks that hold it send it (a
// sharded tensor's parts put together first); the other ranks send theirs and never call
// `sink`. Rank 0 holds at most one tensor of it beside its own state, never the whole
// (the pipeline of a model larger than its host's memory checkpoints through it). Waits
// as gather_to_root's. Call it after gather_to_root (the weights), as a checkpoint does.
void stream_optimizer_state(const plan::Plan& plan, const Executor& executor, nn::Sequential& model,
                            comm::Communicator& world, const config::OptimizerConfig& opt,
                            comm::Timeout timeout, std::string_view what,
                            const std::function<void(const Tensor&)>& sink);

// Loads this rank's parameters and optimiser state from a whole-model checkpoint
// ("model.<name>", "optim.<name>.<slot>", "optim.step"), ignoring other stages' tensors.
void load_stage(const Checkpoint& checkpoint, const Executor& executor);

// Collective over `world`: replaces `executor` (made for `before`) with one for `after`,
// both plan::replicates_whole_model, for the same world (some ranks may be idle in
// either). Ranks active in both keep their optimiser state; a rank that joins takes the
// parameters, optimiser state and dropout streams of `before`'s first replica, so every
// replica is bit-identical again. The last step's all-reduce is drained first. Waits
// (and the new executor's) are bounded by `peer_timeout`.
std::unique_ptr<Executor> relayout(std::unique_ptr<Executor> executor, const plan::Plan& before,
                                   const plan::Plan& after, nn::Sequential& model, Task& task,
                                   comm::Communicator& world, const config::TrainConfig& train,
                                   comm::Timeout peer_timeout);

}  // namespace ht::runtime
