// parallel.sync local (DiLoCo): groups of ranks that step on their own and meet in an
// outer step every H inner steps.
//
// A local plan is a data-parallel plan (one stage, the whole model on every rank, no
// optimiser sharding) whose replicas fall into groups (Plan::local). Each group is a
// synchronous sub-plan (group_plan) that the executor runs on the group's communicator
// exactly as it runs any plan; between groups only the outer exchange travels.
//
// Groups. Ranks are taken fastest first; a rank joins an existing group when that
// group's synchronous step with it keeps kGroupEfficiency of the two sides' summed
// throughputs (its all-reduce is nearly free: fast links, no throttled member), else it
// starts a group of its own. So throttled ranks and ranks behind slow links step alone.
//
// Steps. A round is H job steps: H global batches of the sample stream, so the samples
// seen equal sync's for the same train.steps. The groups take the round's samples in
// group order, group g a run of n_g of them in H_g inner steps of near-equal size (its
// sub-plan sized for each: size_group_step). H_g is the count of whole global batches
// that would end the groups' rounds closest together (steps_by_speed), so a slow group
// takes few, large steps and amortises a step's fixed costs (the optimiser step over the
// whole model, the per-call costs) as well as a fast one; n_g then makes the rounds end
// together exactly, from each group's predicted step as a fixed part plus a part per
// sample (split_round). Integer H_g alone left the groups' rounds apart by up to a step.
//
// D. The outer exchange (the deltas' all-reduce over every rank) runs while the next
// round's inner steps do, and the outer step lands after job step D of that round
// (LocalSync::outer_delay): at the round's end (D = H) unless parallel.outer_delay asks
// for it sooner (apply_outer_delay), which leaves the groups' steps less far behind the
// others' progress and the rounds less slack for a late group. On the MLP at
// 0.8/0.4/0.2/0.2 (one host, H 18) one plan ended 600 steps at 85.16-85.53% with D 3 to
// 9 against 84.75-85.06% at the round's end, in 5 rounds side by side, and D 9 ran at
// 0.92 of the standalone sum against 0.96 (docs/architecture.md).
//
// H. A round must be at least kHideFactor times
// the exchange and give every group a step; from that least count up to kMaxRoundSteps,
// H is the count whose round costs least per job step, each group's round holding its
// inner steps and its own outer work (its pass, and on a CPU rank of one host its part of
// the exchange's sums; kHostCopyBandwidth), so a short round pays that more often, the
// smallest within kNearBestRound of that: a group's steps start from weights that lack
// the others' last round, and that staleness grows with H (the MLP at 0.8/0.4/0.2/0.2
// ended within 0.866-0.8705 for H 10 to 32 with the sample-weighted mean, sync 0.877).
// That least count takes the exchange at whole batches a group, each member owning an
// equal part; split by speed, a fast member owns most of it, and where the split's
// exchange outlasts the round, the least is raised to hide it (at most kMaxRoundSteps).
// Where the run evaluates or checkpoints during training (every PlannerInput::flush_every
// steps), H is the smallest of the counts within kNearBestRound that divides that, where
// one does: each evaluation and checkpoint flushes the rounds (runtime/local_sync.h), and
// at a round's end that is the exchange already in flight alone, where inside a round it
// is a second exchange of the round so far, and the rounds cut short there are not
// measured for a re-split (on the MLP at 0.8/0.4/0.2/0.2, evaluating every 50 steps, H 25
// in place of 18 took 38 ms an evaluation in place of 51: docs/architecture.md).
// parallel.local_steps overrides it (at least one step per group).
//
// Idle ranks. As in a synchronous plan, the slowest ranks may be left out (idle: no
// group, no share) when the plan over fewer is predicted kIdleGain faster: a rank's
// per-step costs (its optimiser step over the whole model) can outlast the others'
// whole share even at one sample. The candidate sets are the speed order's suffixes left
// out and, where some ranks sit behind links at least twice as costly as the cheapest
// (link_last_order), the same over the order with those ranks last, so that leaving out
// the rank behind a slow link does not take a faster-linked, slower rank with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/simulator.h"

namespace ht::plan {

inline constexpr double kGroupEfficiency = 0.9;
inline constexpr double kHideFactor = 1.0;
// A CPU member whose links to every other member run at least this fast (bytes/s) is
// taken to share a host with them, where the outer exchange runs through shared memory
// and the member sums its part with its own cores, so its round holds that as well as
// its pass (see carries_exchange in local_plan.cpp): above any 1 GbE link (125 MB/s),
// below the 1 to 5 GB/s the probe measures between ranks of one host.
inline constexpr double kHostCopyBandwidth = 250e6;
// The largest H the planner chooses (when the exchange needs no more), and how close to
// the cheapest round per job step a smaller H may be and still be taken.
inline constexpr int kMaxRoundSteps = 32;
inline constexpr double kNearBestRound = 0.02;
// A local plan leaves the slowest ranks idle only when that is predicted this much faster.
inline constexpr double kIdleGain = 0.10;

// The world ranks of group g, in the order of its sub-plan's ranks.
std::vector<int> group_ranks(const Plan& plan, int group);
// The group of a world rank (-1: idle).
int group_of_rank(const Plan& plan, int rank);
// Samples of group g's nominal inner step (the global batch, over its replicas).
int64_t group_samples(const Plan& plan, int group);
// Where group g's run of a round's samples begins, from the round's first: the n_g of
// the groups before it.
int64_t group_round_offset(const Plan& plan, int group);
// The size of group g's k-th inner step of a round (0 <= k < H_g): n_g / H_g, the first
// n_g mod H_g of them one more.
int64_t inner_step_samples(const Plan& plan, int group, int k);
// The shares of group g's replicas (in group order) of an inner step of `count`
// samples: the nominal shares (layout.samples) scaled by cumulative floor, so that they
// sum to count and the same count always splits the same way.
std::vector<int64_t> step_shares(const Plan& plan, int group, int64_t count);
// The largest micro-batch replica `replica` of `plan` can take: the nominal step's
// largest, or more where every rank of the replica has the memory for it (its
// predicted use with activations grown in proportion to the micro-batch, against its
// device's memory). Splitting a step just over the nominal batch into two micro-batches
// of half the size cost the MLP's throttled ranks a tenth of their inner steps.
int64_t fitting_micro_batch(const Plan& plan, int replica);
// Sizes `sub`, group g's synchronous sub-plan (group_plan), for an inner step of `count`
// samples: the replicas' shares by step_shares, each replica in the fewest micro-batches
// of at most fitting_micro_batch, the global batch `count`. Throws ht::Error when count
// is below the group's replicas.
void size_group_step(Plan& sub, const Plan& plan, int group, int64_t count);

// A group's predicted costs for the split of a round: an inner step of b samples takes
// step_fixed + per_sample x b; its round also holds round_fixed (its own outer work); a
// step needs at least least_step samples (one per replica).
struct GroupCost {
  double step_fixed = 0;
  double per_sample = 0;
  double round_fixed = 0;
  int64_t least_step = 1;
};
struct RoundSplit {
  std::vector<int> steps;        // H_g, summing to the round's steps
  std::vector<int64_t> samples;  // n_g, summing to the round's samples
  double seconds = 0;            // the latest group's round
};
// H_g for a round of `round_steps` over groups whose inner steps take `step_seconds` and
// whose round adds `round_seconds` of its own (empty: none): at least one each, summing
// to round_steps, the latest group's round as early as it can be in whole steps. Throws
// ht::Error when round_steps is below the group count.
std::vector<int> steps_by_speed(int round_steps, const std::vector<double>& step_seconds,
                                const std::vector<double>& round_seconds = {});
// A round of `round_steps` job steps (round_steps x global_batch samples): H_g by
// steps_by_speed over the groups' one-batch steps, then the n_g (integers, at least
// H_g x least_step each) that end the groups' rounds together as nearly as integers can.
RoundSplit split_round(int round_steps, int64_t global_batch, const std::vector<GroupCost>& groups);
// Each group's costs for split_round, from its sub-plan predicted at one global batch
// and at half of it (the fixed part and the part per sample of a step), and its outer work.
std::vector<GroupCost> group_costs(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster);
// H as described above, from `least` (which the exchange and the group count set); the
// smallest divisor of `align` (> 0) among the counts near the cheapest, where there is one.
int choose_round_steps(int64_t global_batch, const std::vector<GroupCost>& groups, int least, int64_t align = 0);

// Re-splitting from measured rounds (runtime/local_sync.h). A running job measures, per
// group, the seconds its slowest rank spent in a round's inner steps and in its outer
// pass (medians over kResplitRounds rounds: window_medians). resplit_from_measured gives
// the split of the same H that ends the groups' rounds together at those speeds (a
// group's inner seconds taken in proportion to its samples), when it is predicted to end
// the latest round kResplitGain sooner than the split the rounds were measured under;
// otherwise nothing (noise does not move samples back and forth).
inline constexpr int kResplitRounds = 3;
inline constexpr double kResplitGain = 0.03;
// Each group's median over a window's rounds (rounds[k][g]; every round one value a
// group). A round held up by a stall of one of its ranks is no change of speed: the
// mean of three took a 4 s stall for a group 80 times slower and left it 1 sample of a
// round's 1,280 for 60 steps; one such round of three moves no median.
std::vector<double> window_medians(const std::vector<std::vector<double>>& rounds);
std::optional<RoundSplit> resplit_from_measured(const Plan& plan, const std::vector<double>& inner_seconds,
                                                const std::vector<double>& pass_seconds);
// A CPU rank's round, split into inner steps and outer work by the CPU time each took:
// the round's wall clock less its waits on peers (`waited_s`) is the time the rank was
// working or runnable, and its parts are in proportion to their CPU seconds. The wall
// clock of each part alone says little on a shared or throttled core: a rank that is
// descheduled (by its quota, or for the ranks beside it on the core) is so wherever it
// is, and a rank that yields its core in the polls between its blocks is charged the
// other ranks' time there: by wall clock, most of a throttled rank's inner time read as
// outer work (docs/architecture.md). Zero where nothing was measured.
struct RoundSeconds {
  double inner = 0, outer = 0;
};
RoundSeconds cpu_round_seconds(double cpu_s, double outer_cpu_s, double wall_s, double waited_s);

// One inner step a group takes: its first sample's stream position, counted from the
// job's first sample, and its size.
struct LocalBatch {
  int64_t first = 0;
  int64_t count = 0;
};
// The inner steps group g takes during job step `step`: of its H_g steps of the round,
// those that local_batches spreads into this job step (evenly over the round's H job
// steps and front-loaded: the k-th in the job step ceil-ish k H / H_g, so a group with
// one step a round takes it at the round's start and ends with the others). Over a
// round the groups' steps cover the round's H x global batch positions, each once.
std::vector<LocalBatch> local_batches(const Plan& plan, int group, int64_t step);
// Rank `rank`'s part of a round's samples (0 when idle): its shares of its group's
// inner steps over H x global batch. The ranks' parts sum to 1.
double round_weight(const Plan& plan, int rank);
// round_weight of every world rank, in one pass.
std::vector<double> round_weights(const Plan& plan);
// The inner steps group g takes in the first `job_steps` job steps of a round (0..H), as
// local_batches spreads them: ceil(job_steps x H_g / H).
int64_t batches_in_round(const Plan& plan, int group, int64_t job_steps);
// Rank `rank`'s samples in the inner steps its group takes in a round's first
// `job_steps` job steps (0 when idle).
int64_t samples_in_round(const Plan& plan, int rank, int64_t job_steps);
// Rank `rank`'s part of the samples of a round's first `job_steps` job steps (0 when
// idle or when none were taken): round_weight for a whole round. The parts sum to 1.
double partial_round_weight(const Plan& plan, int rank, int64_t job_steps);
// Rank `rank`'s part of the samples taken in job steps from..to of a round (0 <= from <=
// to <= H; 0 when idle or when none were taken): the weight of its delta over that part
// of the round, where the rest of a round after a flush, or a partial round after a
// resume, is exchanged (LocalSync). segment_weight(plan, r, 0, H) equals round_weight's
// value bit for bit, and (0, n) partial_round_weight's.
double segment_weight(const Plan& plan, int rank, int64_t from, int64_t to);

// Group g's synchronous sub-plan: its replicas only, ranks renumbered 0.. in
// group_ranks order, global batch = the group's samples. group_plan checks the plan
// first (check_local_plan); group_plan_unchecked is for a caller that has.
Plan group_plan(const Plan& plan, int group);
Plan group_plan_unchecked(const Plan& plan, int group);

// Checks a local plan's groups against its layout (every replica in exactly one group,
// one stage, no sharding, H >= 1, the H_g summing to H and the n_g to H x global batch,
// each inner step at least one sample per replica). Throws ht::Error naming what is wrong.
void check_local_plan(const Plan& plan);

struct LocalPlanInput {
  BlockCosts costs;
  ClusterModel cluster;
  // A data-parallel plan over every rank (its memory strategies are kept per rank).
  Plan data_plan;
  // The best synchronous plan, for the gain.
  double sync_step_seconds = 0;
  int64_t local_steps = 0;  // parallel.local_steps; 0: chosen
  int64_t flush_every = 0;  // PlannerInput::flush_every: what H is chosen to divide where it can
  size_t most_groups = 0;   // more groups than this: no plan (auto's kMaxRoundSteps); 0: any
};

// The local plan, or why there is none (a rank that cannot hold the whole model, ...).
struct LocalPlanResult {
  std::optional<Plan> plan;
  std::string problem;
};
LocalPlanResult make_local_plan(const LocalPlanInput& in);

// What `hetrain plan` and `hetrain train` run under parallel.sync. Asked for local:
// the local plan (throws ht::Error saying why when there is none). Not given, under
// strategy auto: the local plan when the synchronous plan `sync_plan` leaves a rank
// idle or starved (busy below kStarvedBusy), the world has at most kAutoLocalMaxRanks
// ranks, the round needs at most kMaxRoundSteps steps (no more groups than that), and
// local is predicted kLocalMinGain faster. Otherwise nothing: the
// synchronous plan stands.
inline constexpr double kStarvedBusy = 0.5;
inline constexpr size_t kAutoLocalMaxRanks = SIZE_MAX;  // auto considers local at any world size
inline constexpr double kLocalMinGain = 0.10;
std::optional<Plan> local_plan_for(const PlannerInput& in, const Plan& sync_plan,
                                   std::optional<config::SyncPolicy> asked, int64_t local_steps);

// Fills a local plan's prediction: each group's sub-plan simulated on its own schedules
// (the slowest paces the inner step), the outer exchange, H, and the gain. `local_steps`
// 0 chooses H, a divisor of `flush_every` where one is near the cheapest (above);
// LocalSync::round_align says whether H divides it, given or chosen.
void predict_local(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster, double sync_step_seconds,
                   int64_t local_steps, int64_t flush_every = 0);

// parallel.outer_delay on a local plan that predict_local made: 0 or at least H, the
// outer step at the round's end; else the requested job step, or later where the
// exchange and the latest member's lag in it (a member takes part between the blocks of
// its inner steps, and a rank under a CPU quota may be off its core for the rest of its
// period) need more job steps, at most H. The predicted step stands: the exchange stays
// hidden.
void apply_outer_delay(Plan& plan, const BlockCosts& costs, const ClusterModel& cluster, int64_t requested);

// The ranks of the outer exchange, ascending: every rank of a group, and rank 0, which
// evaluates and checkpoints the outer weights, idle or not. Another idle rank holds no
// outer weights: taking the sums every round would tie the rounds to its links (a rank
// left idle behind a 6 MB/s link made the others' rounds wait on 2.7 MB through it).
std::vector<int> outer_members(const Plan& plan);
// Every world rank's outer synchronisation in a round, in order: OuterSyncFinish (the
// exchange started at the round before's end, and the outer step) after job step D,
// OuterSyncStart (this round's deltas) after job step H; the outer_members only (other
// idle ranks: an empty list).
std::vector<Schedule> outer_sync_schedules(const Plan& plan);

// What the simulator charges for them: OuterSyncStart the outer update's work on the
// rank (kOuterBytesPerParam per parameter through its memory), OuterSyncFinish the part
// of the exchange that D job steps of `inner_step_seconds` do not hide.
// `tiers`: link_tiers of the cluster where the caller has them (found otherwise).
CostModel outer_sync_cost_model(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster,
                                double inner_step_seconds, const LinkTiers* tiers = nullptr);

// One round of a local plan as each rank runs it, for `hetrain plan --trace` and --svg
// (whose whole-layout lists would draw an all-reduce over every rank that a local plan
// never runs): each group's H_g inner steps back to back, each its sub-plan sized for
// that step (size_group_step) and simulated on its own schedules, with the outer list
// between them: OuterSyncFinish after the inner steps that job step D holds
// (batches_in_round), the exposed exchange (outer_sync_cost_model) after an idle span
// for what the group's round lacks of the latest group's (in steady state a group waits
// there for the round before's exchange, which needs every member's deltas), and
// OuterSyncStart (the rank's outer work) after its last inner step. Spans carry world
// ranks; step_seconds is the round's end, every group's (with D = H it is H predicted
// steps: predict_local's round); busy, comm and idle are per rank over it.
SimResult simulate_local_round(const Plan& plan, const BlockCosts& costs, const ClusterModel& cluster);

// The costs and cluster of `ranks` alone, in that order (for a group's sub-plan).
BlockCosts costs_of(const BlockCosts& costs, const std::vector<int>& ranks);
ClusterModel cluster_of(const ClusterModel& cluster, const std::vector<int>& ranks);

// The local plan auto's bounds accept, whatever its gain: at most kMaxRoundSteps groups and
// a round of at most kMaxRoundSteps steps (parallel.local_steps included). What the what-if
// simulator plays for local (plan_for_policy), so that its rounds are ones a job would run.
// Where the group search gives more groups than that (ranks that each step alone, their
// links too slow to share a step), or their round needs more steps, the groups are
// synchronous groups of one class each (cost_classes: one device and link tier): every
// class's ranks cut into k near-equal runs for the same k = 1, 2, 4, ... while the groups
// number at most kMaxRoundSteps; of those whose H is within it, the fastest, fewer groups
// preferred unless more are predicted kIdleGain faster. No plan: `problem` says why in one
// line (more classes than kMaxRoundSteps, every round too long, a rank that cannot hold
// the model, ...).
LocalPlanResult bounded_local_plan(const PlannerInput& in, const Plan& sync_plan, int64_t local_steps);

}  // namespace ht::plan
