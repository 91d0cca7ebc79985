// The executor: the first interpreter of a plan. It runs this rank's instruction list
// (plan/schedule.h) for one optimiser step on real tensors and the communication layer,
// the same list the simulator runs against the cost model. Every training run goes
// through it, one process or many: a single process is the plan of one rank.
//
// Exactness: every micro-batch's summed loss is scaled by 1 / (global batch x
// predictions per sample) and gradients are summed over micro-batches and replicas, so
// the step's gradient is the global batch's mean whatever the split; stages share the
// global gradient norm for clipping. Stage inputs arrive as leaves, so a stage's
// backward ends at its input and hands that gradient to the previous stage.
//
// Optimiser-state sharding (the plan's optimizer_shard < 1, ZeRO stage 1 with uneven
// parts): every tensor of the stage is cut into one part per replica in proportion to
// the shards (comm::part_offsets), and each rank's optimiser holds state for its parts
// only. ReduceGrads sums each part on its owner; OptimizerStep clips by the norm over all
// parts and stages, updates this rank's parts of the weights, and GatherWeights takes the
// others' from their owners. The update is element-wise, so the weights are those of the
// unsharded step. Where one hub owns every part (it steps the optimiser for all) and its
// stage's ranks share a host, its weights live in shared memory and the other replicas
// compute with them in place: ShareWeights/AwaitWeights carry only word that the update
// is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/block.h"
#include "optim/optimizer.h"
#include "plan/plan.h"
#include "plan/timeline.h"
#include "runtime/deadline_sync.h"
#include "runtime/fault_injection.h"
#include "runtime/guard.h"
#include "runtime/loss_scale.h"
#include "runtime/task.h"

namespace ht::comm {
class OverlappedAllreduce;
}

namespace ht::runtime {

struct StepResult {
  // Summed loss over the micro-batches this rank finished as the last stage (0 on other
  // stages); the global mean is the sum over ranks / (global batch x predictions).
  double loss_sum = 0;
  // The samples whose loss is in loss_sum: those of the micro-batches this rank finished
  // as the last stage, none where its contribution was left out with a non-finite loss.
  int64_t loss_samples = 0;
  double compute_s = 0, comm_s = 0;  // this rank's time in each kind of instruction
  double optimizer_s = 0;            // the part of compute_s in OptimizerStep
  double reduce_s = 0;               // the part of comm_s in ReduceGrads and the weights' instructions
  // Gradient tensors that joined the all-reduce during Backward, before ReduceGrads (all
  // of the stage's on a replicated stage, since they join block by block).
  size_t grads_overlapped = 0;
  double wall_s = 0;
  double start_s = 0;     // when the step began, on this rank's clock (comm::clock_seconds)
  int micro_batches = 0;  // this rank's in the step (0: idle); see alternate_micro_batches
  // CPU seconds of the process in the compute instructions (OptimizerStep, the rest) and
  // in the communication (gathering sharded weights included).
  double work_cpu_s = 0, optimizer_cpu_s = 0, comm_cpu_s = 0;
  std::vector<plan::Span> spans;   // when recorded: one per instruction, from start_s
  // The bad-node guard's contributions left out and members quarantined in this step,
  // reported by the first member of each stage group (every member knows them).
  std::vector<GuardEvent> guard_events;
  bool update_skipped = false;  // no contribution of some group kept: the optimiser did not step
  // Nonzero where some member of the step's gradient reduction asked to stop in it
  // (set_stop_request): the signal it was asked with (SIGTERM over SIGINT where members
  // were given both), the same on every rank, so all stop after this step and exit with
  // one status.
  int stop_signal = 0;
  // Under parallel.sync deadline: the step this rank applied (which may differ from the
  // one it was asked for, after a catch-up) and who contributed to it.
  std::optional<DeadlineStep> deadline;
};

// Re-splits under deadline (runtime/deadline_rebalance.h): with `decide` and
// parallel.rebalance_every above 0, on a one-stage plan, the members' shares move by the
// leaders' re-splits; the executor runs each from the step it applies to, handing
// `replace_plan` the plan with those shares first (the plan it was made with, which the
// caller replaces). None within two steps of `total_steps`.
struct DeadlineResplits {
  RebalanceFn decide;
  std::function<void(plan::Plan)> replace_plan;
  int64_t total_steps = 0;
};

class Executor {
 public:
  // `model` is the whole model built from the config's seed, identical on every rank;
  // this rank trains blocks [begin, end) of its stage with its own optimiser. Collective:
  // every rank of `world` constructs one (it splits the stage and replica groups).
  // `peer_timeout` (parallel.peer_timeout_s) bounds every wait on another rank: past it
  // the step raises comm::PeerTimeout naming the rank or group and what it waited for.
  Executor(const plan::Plan& plan, nn::Sequential& model, Task& task, comm::Communicator& world,
           const config::TrainConfig& train, comm::Timeout peer_timeout);
  ~Executor();

  bool active() const { return !schedule_.empty(); }  // false: an idle rank
  int stage() const { return stage_; }
  int replica() const { return replica_; }
  const plan::RankPlan& rank_plan() const { return rank_plan_; }
  // This rank's parameters, named as in the whole model ("blocks.<i>.<name>").
  const std::vector<nn::NamedTensor>& parameters() const { return params_; }
  // Over parameters(), or when sharded over this rank's parts of them (flat, same names).
  optim::Optimizer* optimizer() const { return opt_.get(); }
  // Loads the stage's whole optimiser state (as an optimiser over parameters() names it),
  // keeping this rank's part when sharded.
  void load_optimizer_state(const std::vector<nn::NamedTensor>& whole) const;
  // The same from a source that reads each tensor of the whole state when asked (a resume
  // from the checkpoint file): one held at a time.
  void load_optimizer_state(const optim::Optimizer::StateSource& whole) const;

  // The plan it was made with now holds new shares (layout unchanged, see
  // plan/rebalance.h); the next step runs them. Every rank calls it at the same step.
  void reshare();

  // One step over the global batch whose first sample sits at stream position `first`.
  StepResult step(int64_t first, float lr, bool record_spans);
  // --inject's faults for this rank (the caller keeps it, and calls begin_step before
  // each step); null: none.
  void inject(const FaultInjector* faults) { faults_ = faults; }
  // Called between a step's instructions and between its blocks' forward and backward
  // calls: under local, the outer exchange moves along there (runtime/local_sync.h).
  void set_poll(std::function<void()> poll) { poll_ = std::move(poll); }
  // The signal that asked this rank to stop (0: none), sent with every step's guard
  // counts, so that every member learns of any member's request in the same step
  // (StepResult::stop_signal). Acted on only where the step's gradient reduction spans
  // every rank of the world (one stage, no idle rank): there it reaches them all. On a
  // hybrid plan under deadline AlignReplica carries it instead: a replica's ranks agree
  // on the step they stop after, and their stages' chains end there (Run::take_deadline).
  void set_stop_request(std::function<int()> requested) { stop_requested_ = std::move(requested); }
  // The bad-node guard's settings (config.guard; the defaults until called). Its history
  // and quarantines start afresh.
  void set_guard(const config::GuardConfig& guard);
  // The dynamic loss scale (train.loss_scale; null without one or on an idle rank): the
  // same on every member of the stage group after every step.
  const DynamicLossScale* loss_scale() const { return loss_scale_ ? &*loss_scale_ : nullptr; }
  // A checkpoint's or a peer's scale and clean steps; nothing without a loss scale.
  void restore_loss_scale(double scale, int64_t clean);
  // This rank's guard (its norm histories and its stage's quarantine) as JSON text, and
  // back: a checkpoint keeps it, so that a resumed run leaves out and quarantines as the
  // run it continues would have. restore_guard_state throws ht::Error naming what does
  // not fit.
  std::string guard_state() const;
  void restore_guard_state(const std::string& text);
  // Whether this rank's stage leaves out replica `replica` as quarantined in the next step.
  bool quarantines(int replica) const { return quarantine_ && quarantine_->quarantined(replica); }
  // parallel.sync deadline (runtime/deadline_sync.h) on a plan whose lists carry its
  // instructions: the stage's reduction leaves out what has not arrived when the step's
  // budget expires. `first_step` is the step the run starts at (every member passes the
  // same), `lr_at` the learning rate of a step (a rank that catches up steps with the
  // step it applies, not the one it was asked for). No-op on a stage without replicas.
  // Re-splits under deadline: see DeadlineResplits.
  void use_deadline(const config::ParallelConfig& parallel, int64_t first_step,
                    std::function<float(int64_t)> lr_at, DeadlineResplits resplits = DeadlineResplits{});
  bool deadline() const { return deadline_ != nullptr; }
  int64_t deadline_step() const { return deadline_ ? deadline_->step() : -1; }
  // After the last step, on every member: one chain everywhere (a rank behind catches
  // up) and nothing left in flight; returns the steps this rank caught up past.
  std::vector<comm::StepRecord> finish_deadline(
      comm::DeadlineReduce::FinishReason why = comm::DeadlineReduce::FinishReason::end);
  // Every rank's string of this rank's replica (every stage of it), in stage order;
  // bounded by the peer timeout, a miss naming `what`. Under deadline on a hybrid plan
  // the replica's ranks are at one step after every step (AlignReplica) while the other
  // replicas may be elsewhere: rank 0's checkpoint asks only its own replica.
  std::vector<std::string> replica_allgather(const std::string& mine, std::string_view what) const;

  // CRC-32 of this rank's parameter bytes ("" on an idle rank): replicas of a stage must
  // hold bit-identical parameters, since they apply the same summed gradient.
  std::string parameter_checksum() const;
  // Whether the stage's replicas compute with its hub's weights in place (shared memory,
  // see share_weights); why not, when its hub steps the optimiser and they do not.
  bool shares_weights() const { return shared_weights_; }
  const std::string& why_weights_apart() const { return weights_apart_; }
  // Whether this rank computes with another's weights: loading them is the hub's.
  bool borrows_weights() const { return shared_weights_ && replica_ != plan_.layout.reduce_owner; }
  // Collective over the stage, after the hub loaded its weights (a checkpoint): the
  // replicas computing with them may start.
  void weights_loaded();

 private:
  struct MicroBatch;
  void load(int mb, int64_t first);
  void forward(int mb, bool keep_graph);
  void backward(int mb);
  void reduce_grads();
  void add_to_reduce(size_t begin, size_t end);
  void corrupt_gradient(size_t begin, size_t end);  // --inject nan and scale
  std::vector<Tensor> final_grads(size_t begin, size_t end);  // contiguous, held by the parameters
  void judge(std::vector<Tensor>& grads, size_t begin, size_t end);
  void settle_guard();
  void settle_deadline_guard(const DeadlineStep& d);
  void record_verdicts(const std::vector<Verdict>& verdicts, bool exclusions);
  Quarantine& ensure_quarantine();  // made on first use (set_guard drops it)
  // What a deadline catch-up carries of the guard: the quarantine and the loss scale.
  std::vector<int64_t> deadline_guard_state();
  void restore_deadline_guard_state(const int64_t* ints, size_t n);
  void optimizer_step(float lr);
  void reduce_grads_deadline(StepResult& r, std::chrono::steady_clock::time_point start);
  void align_replica(StepResult& r);  // Op::align_replica: see executor_sync.cpp
  void gather_weights();    // sharded: the other parts' updated weights
  void pass_weights_word(bool from_hub);  // shared hub weights: word that they are updated
  void share_weights();     // a hub that steps the optimiser: see executor_sync.cpp
  Shape boundary_shape(int mb, bool input) const;
  void take_shares();  // this rank's plan, schedule and sample offsets from plan_
  // Under deadline with re-splits: the shares the reduction's chain has for the next step,
  // when they are not plan_'s, replace the plan (replace_plan_) and are taken; whether so.
  bool take_deadline_shares();
  void use_layout(bool trial);  // this step's layout_, schedule and sample offsets
  // A pipeline neighbour (`peer`, of world_) that did not answer within the peer timeout:
  // raises comm::PeerTimeout naming who stalled (see executor.cpp).
  [[noreturn]] void fail_neighbour(int peer, const std::string& what);
  // This rank in the job's world, for messages: under parallel.sync local world_ is the
  // group's communicator, whose ranks are not the ones a user sees.
  int me() const { return world_.world_rank(world_.rank()); }

  const plan::Plan& plan_;
  nn::Sequential& model_;
  Task& task_;
  comm::Communicator& world_;
  config::TrainConfig train_;
  comm::Timeout peer_timeout_;
  plan::RankPlan rank_plan_;
  // This step's shares: plan_'s, except that a replica in a micro-batch trial runs its
  // alternate count in every other step.
  plan::PipelineLayout layout_;
  bool alternate_next_ = false;
  plan::Schedule schedule_;  // this step's: one of
  plan::Schedule regular_schedule_, trial_schedule_;  // trial: empty unless on trial
  int stage_ = -1, replica_ = -1, stages_ = 0;
  bool first_ = false, last_ = false, recompute_ = false;
  int64_t replica_offset_ = 0;       // first sample of this replica within a global batch
  std::vector<int64_t> mb_offset_;   // first sample of each micro-batch within the replica
  double scale_ = 0;                 // 1 / (global batch x predictions per sample)
  std::vector<nn::NamedTensor> params_;
  std::vector<size_t> block_params_;  // params_ of the stage's block i: [i], [i + 1]
  std::vector<double> shards_;        // the stage's optimiser shards; empty: not sharded
  std::vector<nn::NamedTensor> shard_params_;  // sharded: views of this rank's parts
  std::vector<size_t> reduce_order_;  // params_ indices in the order reduce_ got them
  int last_backward_mb_ = -1;         // the micro-batch of this rank's last Backward
  int overlap_mb_ = -1;               // this step's ReduceStart's micro-batch
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<comm::Communicator> stage_group_;    // this stage in every replica
  std::unique_ptr<comm::Communicator> replica_group_;  // every stage of this replica
  // Over stage_group_, so declared after it (destroyed first).
  std::unique_ptr<comm::OverlappedAllreduce> reduce_;    // this step's, replicated stages only
  std::unique_ptr<comm::OverlappedAllreduce> draining_;  // the last step's, its sums still going out
  bool shared_weights_ = false;
  std::string weights_apart_;          // why not shared, when they might have been
  std::vector<comm::Request> updated_;  // the hub's word of updated weights, in flight
  std::map<int, MicroBatch> live_;   // micro-batches between their Forward and Backward
  double loss_sum_ = 0;
  int64_t loss_samples_ = 0;  // the samples loss_sum_ holds
  const FaultInjector* faults_ = nullptr;
  std::function<void()> poll_;
  std::function<int()> stop_requested_;
  int stop_signal_ = 0;  // this step's agreed stop, its signal (set_stop_request)
  // The bad-node guard (runtime/guard.h). In a pipeline each stage's replicas judge their
  // own part of the gradient, so one stage may leave out a replica that another keeps,
  // and a stage without replicas skips its own update alone; a NaN sent back across a
  // stage boundary poisons, and so is caught by, every stage before it as well.
  config::GuardConfig guard_cfg_;
  ContributionGuard guard_{guard_cfg_};
  std::unique_ptr<Quarantine> quarantine_;       // replicated stages; the same on every member
  std::optional<DynamicLossScale> loss_scale_;    // train.loss_scale (runtime/loss_scale.h)
  double step_scale_ = 1;                         // the scale of this step's backward
  std::vector<Tensor> counts_;                   // this step's, one per group judged
  std::vector<std::pair<size_t, size_t>> groups_;  // params_ [begin, end) of each
  std::vector<GuardEvent> events_;
  Verdict verdict_ = Verdict::kept;  // this rank's, the first not kept in this step
  bool skip_update_ = false;
  std::unique_ptr<DeadlineSync> deadline_;  // parallel.sync deadline, replicated stages
  std::function<float(int64_t)> lr_at_;
  std::function<void(plan::Plan)> replace_plan_;  // under deadline with re-splits
};

// Throws when two replicas of one stage report different checksums (one per world rank,
// in rank order, "" for idle ranks), naming the stage, both ranks and the step.
void check_replicas_identical(const plan::Plan& plan, const std::vector<std::string>& checksums,
                              int64_t step);

// The plan of one process: the whole model, the whole batch in `micro_batches`
// micro-batches (gradient accumulation).
plan::Plan single_process_plan(int blocks, int64_t global_batch, int micro_batches);

// The part of a stage's whole optimiser state (`whole`, as an optimiser over `params`
// lists it) that the rank of replica `part` keeps when sharded by `shards`: flat views of
// the slot tensors' parts, the counters as they are, in order. Throws, naming the tensor,
// when a slot tensor is not of its parameter's shape.
std::vector<nn::NamedTensor> optimizer_state_part(const std::vector<nn::NamedTensor>& whole,
                                                  const std::vector<nn::NamedTensor>& params,
                                                  const std::vector<double>& shards, int part);

}  // namespace ht::runtime
