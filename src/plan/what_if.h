// The what-if simulator: how a job planned over a cluster fares, under each sync policy,
// when a rank stalls, slows down or fails, a link changes, or a device joins.
//
// Granularity. One instruction-level simulation (plan/simulator.h) of ONE step per plan
// and per state of the cluster (each set of slow factors and link changes in force):
// its step time and every rank's compute are the step parts. The N steps are then played
// at step granularity against the events, so 4,096 ranks x 1,000 steps cost a few
// simulations, not 1,000; under sync and deadline the steps alike the last one that end
// before the next event are added up without asking every rank (quiet_until).
//
// Per policy (each from its own plan, plan_for_policy, on the same PlannerInput):
//  - sync: a step ends when every rank's part ends. A stall that begins in a step holds
//    that step for the whole stall (the rank is in every step); a slow rank's compute is
//    multiplied by its factor (the step re-simulated); a failure ends the job: it
//    restarts after kRestartSeconds from the newest checkpoint (checkpoint.every; step 0
//    without one) on the ranks left, re-planned, and the steps since that checkpoint are
//    the work lost. A stall of a rank the plan leaves idle holds no step, but such a rank
//    still takes part in the log exchange (runtime/trainer_logs) and in checkpoints: rank
//    0 waits at the second log exchange finished after the stall began (the first one
//    already holds the idle rank's item, sent a window ahead), at a checkpoint or at the
//    job's end, whichever comes first, until the stall ends (log_every; one run of the
//    MLP at 0.8/0.4/0.2/0.2 lost 5.2 s to an idle rank stopped for 5 s); a failure in
//    that wait finds the step's checkpoint not written. So does deadline's pure pipeline,
//    which runs as sync does.
//  - deadline: a step's budget adapts as comm/deadline_reduce's leader adapts it: the
//    plan's predicted step x (1 + deadline_slack) until kDeadlineMinMeasured steps have
//    closed, then (1 + deadline_slack) x the median (the upper one of an even count) of
//    the latest arrival of the last kDeadlineMedianOf + 1 closed steps; a step's latest
//    arrival is the latest part of any rank heard from, late ones included (a slow rank
//    sends after the close; a stalled one sends when it resumes, counted when that step is
//    still in the window). So a slow rank's late parts raise the budget until it arrives
//    in time. The job's end waits for a rank still stopped then (its finish is collective).
//    A silent leader (rank 0 first) costs its step the members' patience (2 budgets and
//    20 ms after they sent) and a budget of the next rank, which leads from then on with
//    its window measured afresh.
//    A rank whose part
//    (its compute x factor, plus its copies and the step's common tail after the slowest
//    arrival: the reduction) does not arrive by the budget is left out, its samples dropped. The step
//    closes at its budget while a late rank is still waited for (a slow one whose part is
//    within kDeadlineBehindSteps closes of the others'; a silent one for
//    kDeadlineWaitedSteps steps, as comm/deadline_reduce does),
//    else when the last present rank arrives. A stalled rank is caught up when it returns
//    (the catch-up charged nothing, as the simulator charges CatchUp); a failed one is
//    left out for good, with no restart. On a hybrid plan the unit left out is a replica:
//    its part is the latest of its ranks' (each when it reaches its reduction in the step
//    simulated with the slow factors, plus its copies and the tail), a stall of any of its
//    ranks holds all of them, and its whole share is dropped once per step. A pure
//    pipeline has no stand-in for a stage: it waits as sync does.
//  - Re-splits (parallel.rebalance_every above 0): under sync with more than one replica
//    (shares that may move: not strategy equal), and under deadline on one stage, the job
//    re-splits the global batch by measured speed (runtime/rebalancer.h,
//    runtime/deadline_rebalance.h). A slow factor's re-split is played from
//    kRebalanceLagChecks x rebalance_every + 2 steps (of the step slowed, not yet
//    re-split) after the factor begins, or after the job's restart: a rank's window is
//    judged on its new speed alone at the first check whose steps since the check
//    before are more than half slowed (plan::drop_steps_before_speed_change), from half
//    a check to a check and a half after the factor begins, and its answer runs two
//    steps later. The re-split is plan/rebalance.h's over the costs with the factors
//    applied; what it plays is that plan, slowed. Under
//    local (more than one group) the rounds re-split (runtime/local_sync.h): from
//    kResplitRounds + 2 rounds after the factor begins, plan/local_plan.h's split_round
//    over the groups' costs with the factors applied, the same split for every group of
//    a round (the one in force at the round's start).
//  - local: the plan is one auto's bounds accept (bounded_local_plan: at most
//    kMaxRoundSteps groups and steps a round; groups of one class each where the search
//    leaves too many ranks alone), or the policy is refused saying why. Each group plays
//    its rounds (H_g inner steps of its simulated sub-plan step, then its part of the
//    round's outer list) on its own clock; job step D of a round (outer_delay) waits for
//    the exchange of the round before, so for every group to have ended that round (the
//    wait is drawn at the round's start). A stall holds its group only, and the others
//    wait D steps into the round after the one it held.
//    A failure restarts the job as under sync (the groups' outer exchange spans every
//    rank), re-planned as a local plan. No sample is dropped and none is staler than the
//    one round the design delays every group's progress: runtime/local_sync's exchange
//    finishes (blocking, within parallel.peer_timeout_s) before a round's outer step, so a
//    late group is waited for rather than left out. What the outcome counts instead are the
//    samples waited for: those of a round held by an event (a stall in it, or a slow
//    factor on its group) that ended after another group had ended its next round, so
//    that group waited at the exchange for it (or at the job's final flush).
//  - link (ranks=A-B): from its time on, the link between ranks A and B has the given
//    one-way latency and bandwidth both ways, and every step is re-simulated on that
//    cluster (the all-reduce and pipeline transfers that cross it change).
//  - join (device=D, a catalogue id): a rank of that device, modelled from its datasheet,
//    linked to every rank by rank 0's median link. sync and deadline: the job re-plans at the first checkpoint
//    boundary after the join (a restart: kRestartSeconds, no work lost; joins waiting at
//    one boundary share it); without
//    checkpoint.every, or with no checkpoint after it before the end, it never joins (a
//    note says so). local: the same, re-planned as a local plan.
// Events apply to the ranks of the world they were given for; once a failure or a join
// re-plans, a rank keeps its identity (the events follow it), and a joined rank can be
// named by no event. A later slow event on a rank replaces the earlier one's factor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "nn/block_shape.h"
#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/local_plan.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/policy_plan.h"

namespace ht::plan {

// Assumed cost of restarting a job after a failure or for a join: the launcher starting
// the ranks again, reading the checkpoint and planning from the plan file (no probe).
inline constexpr double kRestartSeconds = 30;
// Steps a deadline leader still waits for a member it has heard nothing from.
inline constexpr int kDeadlineWaitedSteps = 2;
// A deadline member this many steps late or more is not waited for (comm/deadline_reduce's
// kSendTo): it is back from a stop, stepping through its queued results, or too slow.
inline constexpr int kDeadlineBehindSteps = 4;
// Checks of parallel.rebalance_every steps before a slow factor's re-split (see above).
inline constexpr int64_t kRebalanceLagChecks = 1;
// comm/deadline_reduce's budget: the median over the last kDeadlineMedianOf + 1 closed
// steps' latest arrivals, once kDeadlineMinMeasured have closed.
inline constexpr int kDeadlineMedianOf = 9;
inline constexpr int kDeadlineMinMeasured = 3;
// A deadline member's patience with a silent leader: this many budgets and seconds.
inline constexpr double kDeadlinePatienceBudgets = 2, kDeadlinePatienceSeconds = 0.02;
inline constexpr int64_t kDefaultWhatIfSteps = 1000;
// --what-if-steps' bound: the play's time grows with the steps (10 million took 9.5 s).
inline constexpr int64_t kMaxWhatIfSteps = 1000000;
// slow:factor's bound: a rank a million times slower is a stalled one (use stall:), and
// past it the step's time leaves the range a double prints and sums exactly enough.
inline constexpr double kMaxSlowFactor = 1e6;
// The latest event time and the longest stall, in seconds (about 31 years): sums of them stay finite.
inline constexpr double kMaxEventSeconds = 1e9;

enum class WhatIfKind { stall, slow, fail, link, join };

struct WhatIfEvent {
  WhatIfKind kind = WhatIfKind::stall;
  std::string spec;    // as given, for messages and the table's notes
  double at_s = 0;     // seconds of job time
  int rank = -1;       // stall, slow, fail; link: its first end
  int peer = -1;       // link: its second end
  double for_s = 0;    // stall
  double factor = 1;   // slow: compute x factor
  double latency_s = 0, bandwidth_bytes_per_s = 0;  // link
  std::string device;  // join: catalogue id
};

// Parses one event spec:
//   stall:rank=R,at=T,for=S  slow:rank=R,at=T,factor=F  fail:rank=R,at=T
//   link:ranks=A-B,at=T,latency=L,bandwidth=B (L in ms, B in MB/s, 1 MB = 1e6 bytes)
//   join:device=D,at=T
// T and S in seconds. Errors (config::ConfigError) name the spec, the field, its value
// and what was expected.
WhatIfEvent parse_what_if_event(const std::string& spec);

// Refuses an event naming a rank outside a world of `world_size` ranks, a link from a
// rank to itself, or a join device the catalogue does not list (config::ConfigError).
void check_what_if_events(const std::vector<WhatIfEvent>& events, size_t world_size, const Catalogue& catalogue);


struct WhatIfInput {
  PlannerInput planner;
  // Plans already made on `planner` (the one `hetrain plan` shows): a policy with one
  // here plays it instead of planning again.
  std::vector<Plan> plans;
  nn::ModelShape model;               // for a joining device's block costs
  config::OptimizerConfig optimizer;  // likewise
  std::string catalogue_path;         // join: the device catalogue
  int64_t steps = kDefaultWhatIfSteps;
  int64_t checkpoint_every = 0;       // checkpoint.every; 0: only at the end
  int64_t log_every = 50;             // train.log_every: sync's log exchanges (idle ranks' stalls)
  double deadline_slack = 0.5;
  int64_t local_steps = 0;            // parallel.local_steps
  int64_t rebalance_every = 0;        // parallel.rebalance_every: 0 plays no re-split
  // parallel.peer_timeout_s; 0: not known. A stall longer than it, under a policy that
  // waits for the stalled rank (sync, local, a pipeline under deadline), ends a real job
  // with an error naming the rank: the play waits it through, and a note says so.
  double peer_timeout_s = 0;
  std::vector<WhatIfEvent> events;
};

// The played job's timeline, for the picture (report/what_if_svg.h): spans on lanes (sync
// and deadline: one, the job; local: one per group), consecutive spans of one kind on a
// lane merged, so that its size follows what happened, not the steps or the ranks.
enum class WhatIfSpanKind {
  work,     // steps (or rounds) as planned, slow factors and link changes included
  held,     // a step or round held past its length by a stall
  waiting,  // local: a group waiting at the exchange for a group late by an event
  short_step,  // deadline: steps closed without every rank
  restart,  // the restart after a failure or for a join (kRestartSeconds)
  lost,     // work redone after a failure (drawn over the spans it covers)
};

struct WhatIfSpan {
  double start = 0, end = 0;
  int lane = 0;
  WhatIfSpanKind kind = WhatIfSpanKind::work;
};

struct PolicyOutcome {
  config::SyncPolicy policy = config::SyncPolicy::sync;
  std::string refused;          // non-empty: the policy was not simulated, and why
  double step_seconds = 0;      // the plan's predicted step (local: per job step)
  double seconds = 0;           // to the N steps, events included
  double baseline_seconds = 0;  // the same plan without the events
  double lost_seconds = 0;      // seconds - baseline_seconds
  double samples_per_s = 0;     // samples trained (dropped ones not) over seconds
  int64_t samples_dropped = 0;  // deadline: contributions left out
  int64_t samples_waited_for = 0;  // local: see above
  int64_t rounds_waited_for = 0;   // local: the rounds those samples were taken in
  int64_t steps_closed_short = 0;  // deadline: steps closed without every rank
  int64_t work_lost_steps = 0;     // steps redone after restarts
  double work_lost_seconds = 0;    // the time those steps and the restarts took
  // local: the played plan's groups and H (its first plan's, before any re-plan), and
  // them in words ("32 groups (16 x 128 rtx3090, 16 x 128 rtx3060), H 32").
  int groups = 0, inner_steps = 0;
  std::string plan_shape;
  std::vector<std::string> notes;  // what happened, in order (restarts, joins, ...)
  std::vector<std::string> lanes;  // the timeline's lanes, named
  std::vector<WhatIfSpan> timeline;  // in time order per lane
};

struct WhatIfResult {
  int64_t steps = 0;
  int64_t global_batch = 0;
  std::vector<PolicyOutcome> policies;  // sync, deadline, local
};

// Plans each policy and plays N steps under the events, and once without them.
WhatIfResult run_what_if(const WhatIfInput& in);

}  // namespace ht::plan
