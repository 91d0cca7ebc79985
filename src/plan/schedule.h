// The schedule IR: for every rank, a flat list of instructions that the executor runs on
// real tensors and MPI and the simulator runs against a cost model. Plain data on purpose
// (no MPI, no tensors), so pairing, deadlock freedom and micro-batch coverage are
// unit-tested on the lists alone, the way DeepSpeed tests its pipe schedules.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ht::plan {

enum class Op {
  load_micro_batch,  // read the stage's share of a micro-batch (see build_1f1b for who loads)
  forward,
  backward,
  send_activation,   // to the next stage's rank; paired with its recv_activation
  recv_activation,
  send_grad,         // to the previous stage's rank; paired with its recv_grad
  recv_grad,
  reduce_grads,      // collective over the ranks that run the same stage in every replica
  optimizer_step,
  recompute,         // re-run the forward of a micro-batch whose activations were dropped
  // Opens the stage's ReduceGrads before the rank's last Backward (micro_batch = that
  // Backward's): as that Backward finishes each block, the block's gradients are final and
  // join the all-reduce, which so overlaps the rest of the backward pass. ReduceGrads
  // finishes it. Never blocks. Every rank of the stage's reduction has one, or none does
  // (they must add the same tensors in the same order).
  reduce_start,
  // Collective over the stage's ReduceGrads group, after OptimizerStep, where the
  // optimiser state is sharded: each rank sends its part of the updated weights and takes
  // the others' (round 2 of the all-reduce, carrying weights instead of sums).
  gather_weights,
  // Where the stage's hub steps the optimiser and its replicas compute with the hub's
  // weights in place (shared memory): the hub posts word that the weights are updated
  // (never blocks), and each other replica waits for it (peer = the hub's rank).
  share_weights,
  await_weights,
  // parallel.sync deadline (plan/deadline_plan.h): ReduceGrads bounded by the step's
  // budget, over the stage's replicas (comm/deadline_reduce.h); missing contributions
  // are left out. Collective in the lists: in the steady state every member takes part.
  reduce_grads_deadline,
  // parallel.sync deadline, first in the list: a rank that was left out takes the state
  // a leader sent it before it computes. Never blocks; free in the steady state.
  catch_up,
  // parallel.sync deadline on a hybrid plan, after OptimizerStep: the ranks of one
  // replica (Instruction::replica; its every stage) agree on the step they are at. Each
  // stage's reduction closes on its own, so a rank of a replica that was left out may be
  // caught up to another step than its pipeline's other ranks; then the ranks behind take
  // their stage's state at the step of the one ahead, and the replica's pipeline runs one
  // step again. Collective over the replica's ranks; in the steady state one small
  // message each.
  align_replica,
  // parallel.sync local (plan/local_plan.h), once a round: OuterSyncFinish, after job
  // step D, waits for the outer exchange started at the round before's end (collective
  // over every rank) and takes the outer step; OuterSyncStart, after the round's last
  // step, posts this round's weighted deltas and never blocks. runtime/local_sync.h runs
  // them between the executor's steps.
  outer_sync_finish,
  outer_sync_start,
};

// "LoadMicroBatch", "Forward", ...: the one spelling shared by executor, simulator, JSON
// and traces.
const char* op_name(Op op);

// Point-to-point instructions come in pairs: a send on one rank, its recv on the peer.
constexpr bool is_send(Op op) { return op == Op::send_activation || op == Op::send_grad; }
constexpr bool is_recv(Op op) { return op == Op::recv_activation || op == Op::recv_grad; }
constexpr Op send_of(Op recv) { return recv == Op::recv_activation ? Op::send_activation : Op::send_grad; }
constexpr Op recv_of(Op send) { return send == Op::send_activation ? Op::recv_activation : Op::recv_grad; }
// Collectives complete together on every rank holding one of the same op and stage.
constexpr bool is_collective(Op op) {
  return op == Op::reduce_grads || op == Op::gather_weights || op == Op::reduce_grads_deadline ||
         op == Op::outer_sync_finish || op == Op::align_replica;
}
// The step's gradient reduction, bounded or not.
constexpr bool is_reduction(Op op) { return op == Op::reduce_grads || op == Op::reduce_grads_deadline; }

struct Instruction {
  Op op;
  int micro_batch = -1;  // -1 for per-step ops (ReduceGrads, OptimizerStep, ...)
  int stage = -1;
  int peer = -1;         // world rank on the other end of a send/recv, or awaited; -1 otherwise
  int64_t bytes = 0;     // payload of a send/recv: boundary bytes per sample x micro-batch size
  int replica = -1;      // AlignReplica: the replica whose ranks it spans; -1 otherwise
};

// Which ranks a collective spans, with its op: the holders of the same op and group. A
// stage's collectives span its replicas (the group is the stage); AlignReplica spans one
// replica's stages (the group is the replica).
constexpr int collective_group(const Instruction& in) {
  return in.op == Op::align_replica ? in.replica : in.stage;
}

using Schedule = std::vector<Instruction>;  // one per rank

struct PipelineLayout {
  // replicas[r][s] = world rank running stage s of pipeline replica r. Every replica has
  // the same number of stages S. Pure data parallel: S = 1; pure pipeline: one replica.
  std::vector<std::vector<int>> replicas;
  // Samples of each global batch per replica (its data-parallel share), and M per replica
  // per step. Replicas are independent pipelines until ReduceGrads, so a replica on
  // smaller devices may cut its share into more, smaller micro-batches. 1 <= M <= samples.
  std::vector<int64_t> samples;
  std::vector<int> micro_batches;
  std::vector<int64_t> activation_bytes;     // size S-1: boundary s -> s+1, per sample
  std::vector<std::vector<bool>> recompute;  // [r][s], the shape of replicas; empty = nowhere
  // Optional [r][s] estimates of one micro-batch's Forward and Backward seconds. They only
  // order communication (see build_1f1b); empty means nominal Forward 1, Backward 2.
  std::vector<std::vector<double>> forward_seconds, backward_seconds;
  // Who owns the parts of every stage's ReduceGrads (see reduce_parts): -1, each replica
  // in proportion to its share; r >= 0, replica r alone (a hub that sums and sends back).
  int reduce_owner = -1;
  // A micro-batch trial (plan/rebalance.h): per replica, the count it runs in every other
  // step instead of micro_batches (0: none), so that both are measured in the same
  // stretch of time; empty: no trial. Those steps run the lists of trial_layout(); the
  // memory plan takes micro_batches.
  std::vector<int> alternate_micro_batches;
};

// The layout of a micro-batch trial's alternate steps: micro_batches replaced by
// alternate_micro_batches where that is > 0, and no trial of its own.
PipelineLayout trial_layout(const PipelineLayout& layout);
bool has_trial(const PipelineLayout& layout);

// Samples in micro-batch `mb` of `replica`: its share cut into M near-equal parts, the
// first (samples mod M) one larger. Executor and simulator both size micro-batches by this.
int64_t micro_batch_samples(const PipelineLayout& layout, int replica, int mb);

// Each replica's fraction of every tensor in a stage's ReduceGrads (the stage group's
// ranks are its replicas in order). Without an owner, its share of the global batch, so
// that a slow rank adds and sends little: under the 4-rank quotas the CNN (shares
// 64/34/15/15) ran 2,848-2,886 samples/s against 2,747-2,820 with equal parts. With
// `reduce_owner` r, all of it to replica r: the others only send their gradients and
// receive the sums, so no round waits on them (see weighted_allreduce_seconds). The
// executor reduces with these parts and the cost model charges them.
std::vector<double> reduce_parts(const PipelineLayout& layout);

// Forwards a stage runs before its first Backward can arrive: min(S-1-s, M).
int warmup_forwards(int stage, int stages, int micro_batches);

// The 1F1B (PipeDream-flush / Megatron) schedule for every rank of the world; ranks in no
// replica get an empty schedule. Throws ht::Error on an inconsistent layout.
//
// Load convention: LoadMicroBatch loads what the stage itself needs of that micro-batch,
// right before its Forward: the inputs on the first stage, the targets on the last, and
// both in one instruction when a stage is first and last (S = 1). So a stage loads M times
// when it is first or last, never 2M, and middle stages never load.
//
// Communication order: rendezvous sends (MPI_Ssend, or any send above the eager limit)
// deadlock a naive 1F1B, where stage s sends an activation while stage s+1 sends it a
// gradient. So every send/recv pair gets one key, shared by both ends, and each rank
// issues its pairs in key order; a receive may therefore be posted a little before the
// compute that needs it. The keys come from a nominal run of the pipeline, timed with the
// layout's cost estimates when it has them: with nominal costs that are off (a Backward
// that really costs 1x its Forward, not 2x), a receive can be posted before compute that
// does not need it and stall the rank. check_schedules verifies the result under
// rendezvous semantics.
//
// Reduction: with more than one replica, each rank's last Backward is preceded by
// ReduceStart (its gradients join the all-reduce block by block) and its OptimizerStep by
// ReduceGrads (the finish).
std::vector<Schedule> build_1f1b(const PipelineLayout& layout, int world_size);

// How a stage's replicas get the weights after OptimizerStep: as they are (each updated
// its own whole copy), gathered (GatherWeights: optimiser state sharded), or shared (the
// hub steps the optimiser in shared memory: ShareWeights on the hub, AwaitWeights on the
// others).
enum class WeightSync { own, gather, share };

// Appends the weight instructions after each rank's OptimizerStep, per stage as `sync`
// says (one entry per stage; empty: own everywhere). `share` needs the layout's
// reduce_owner: the hub replica.
void add_weight_sync(std::vector<Schedule>& schedules, const PipelineLayout& layout,
                     const std::vector<WeightSync>& sync);

struct ScheduleReport {
  bool ok = true;
  std::string problem;  // names the rank(s) and instruction(s) when !ok
};

// Returns the first problem found, local faults before the deadlock check, since a
// deadlock they cause would only show where the ranks got stuck:
//  (a) every send has a receive of the matching kind on its peer with the same micro-batch
//      and bytes, in the same order per (src, dst, kind); every AwaitWeights has a
//      ShareWeights of its stage on its peer;
//  (b) no deadlock when sends are rendezvous and receives block; ReduceGrads of stage s is
//      a barrier over every rank holding a ReduceGrads for stage s, GatherWeights likewise,
//      AlignReplica of replica r over every rank holding one for r; an AwaitWeights waits
//      until its peer has posted the matching ShareWeights;
//  (c) per rank and stage, each forwarded micro-batch is backwarded exactly once, never
//      forwarded twice, and never backwarded (or recomputed) before its Forward;
//  (d) ReduceGrads and OptimizerStep come after the rank's last Backward, and
//      OptimizerStep after ReduceGrads; a ReduceStart comes after every Backward but the
//      last, which is of its micro-batch, and before a ReduceGrads of its stage; the
//      weight instructions come after OptimizerStep, on a rank that reduces their stage;
//      an AlignReplica comes after OptimizerStep and names a replica;
//  (e) a stage's ReduceStarts, GatherWeights and ShareWeights/AwaitWeights span the
//      same ranks as its ReduceGrads (all of them or, for ReduceStart, none).
// (a) and (e) come first, then (c) and (d) rank by rank, then (b).
ScheduleReport check_schedules(const std::vector<Schedule>& schedules);

// --- The lock-step sweep ---
// The one interpretation of the lists' blocking rules, shared by check_schedules'
// deadlock check and the simulator: every rank runs until it blocks; a send is
// rendezvous (it fires with its receive, once the peer stands at the matching receive); a
// collective fires once every rank holding it for its group (collective_group) stands at it; an
// AwaitWeights fires once its peer has fired the matching ShareWeights; anything else
// fires alone. Ranks are visited in order, repeatedly, until none moves; each fired
// event goes to `fire`, which sees the participants before they advance.
struct SweepEvent {
  enum class Kind { local, pair, collective, await };
  Kind kind = Kind::local;
  // (rank, instruction index) of each participant: local, the rank; pair, the sender then
  // the receiver; collective, every holder in rank order; await, the waiting rank then
  // the peer's ShareWeights (fired before).
  std::vector<std::pair<int, size_t>> at;
};
// Returns where each rank stopped: the size of its list when it ran to the end. Peers
// must be ranks of the world (check_schedules' pairing check and the simulator refuse
// others first; here they are an error).
std::vector<size_t> sweep(const std::vector<Schedule>& schedules,
                          const std::function<void(const SweepEvent&)>& fire);

struct InstructionCounts {
  int loads = 0, forwards = 0, backwards = 0;
  int send_activations = 0, recv_activations = 0, send_grads = 0, recv_grads = 0;
  int recomputes = 0, reduces = 0, steps = 0;
  int reduce_starts = 0, gathers = 0, shares = 0, awaits = 0, aligns = 0;
  bool operator==(const InstructionCounts&) const = default;
};

// What build_1f1b emits for one stage: M forwards and backwards; M activation sends unless
// last, M activation recvs unless first (grads the other way); M loads on the first and on
// the last stage (M, not 2M, when S = 1); M recomputes when on; one ReduceStart and one
// ReduceGrads when there is more than one replica; one OptimizerStep. (add_weight_sync
// adds the rest.)
InstructionCounts expected_1f1b_counts(int stage, int stages, int micro_batches, int replicas,
                                       bool recompute);
InstructionCounts count(const Schedule& schedule);

// One instruction per line, e.g. "Forward mb=3 stage=1", "SendActivation mb=3 stage=1
// peer=2 bytes=4096"; unset fields are left out.
std::string to_text(const Instruction& instruction);
std::string to_text(const Schedule& schedule);

}  // namespace ht::plan
