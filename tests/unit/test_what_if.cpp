// The what-if simulator (plan/what_if.h) on hand-built clusters: what each event costs
// each policy, from the plans' own predicted steps, and the event specs' errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include "config/config.h"
#include "core/units.h"
#include "error_message.h"
#include "plan/local_plan.h"
#include "plan/plan_costs.h"
#include "plan/planner.h"
#include "plan/rebalance.h"
#include "plan/stage_memory.h"
#include "plan/simulator.h"
#include "plan/what_if.h"
#include "plan_fixtures.h"
#include "report/what_if_svg.h"
#include "source_root.h"

using namespace ht::plan;
namespace fx = ht::plan::fixtures;
using ht::test_fixtures::source_root;
using Policy = ht::config::SyncPolicy;

namespace {

// Four equal ranks on fast links, data parallel: every rank's part of a step is alike.
WhatIfInput four_equal(int64_t steps, const std::vector<std::string>& specs) {
  const ClusterModel c = fx::cluster({1e11, 1e11, 1e11, 1e11}, {8 * fx::kGiB, 8 * fx::kGiB, 8 * fx::kGiB, 8 * fx::kGiB},
                                     1e-5, 1e10);
  WhatIfInput in;
  in.planner = fx::input(c, fx::costs(c, 4), 8, "data");
  in.steps = steps;
  in.checkpoint_every = 10;
  in.deadline_slack = 0.5;
  for (const std::string& s : specs) in.events.push_back(parse_what_if_event(s));
  check_what_if_events(in.events, c.ranks.size(), Catalogue{});
  return in;
}

// The fixture's four blocks as shapes, which a joined rank's block costs come from, and
// the catalogue its device is read from.
void can_join(WhatIfInput& in) {
  in.catalogue_path = default_catalogue_path();
  in.model.blocks.clear();
  for (size_t b = 0; b < 4; ++b) {
    ht::nn::BlockShape shape;
    shape.params = 1000000;
    shape.flops_per_sample = 1000000000;
    shape.activation_bytes_per_sample = 1000000;
    in.model.blocks.push_back(shape);
  }
}

PolicyOutcome outcome(const WhatIfResult& r, Policy p) {
  for (const PolicyOutcome& o : r.policies)
    if (o.policy == p) return o;
  FAIL("no outcome for the policy");
  return {};
}

}  // namespace

TEST_CASE("what-if without events: each policy's N steps take N of its plan's steps") {
  const WhatIfInput in = four_equal(100, {});
  const WhatIfResult r = run_what_if(in);
  REQUIRE(r.policies.size() == 3);
  for (const PolicyOutcome& o : r.policies) {
    CAPTURE(ht::config::to_string(o.policy));
    REQUIRE(o.refused.empty());
    CHECK(o.seconds == doctest::Approx(100 * o.step_seconds));
    CHECK(o.lost_seconds == doctest::Approx(0).epsilon(1e-9));
    CHECK(o.samples_per_s == doctest::Approx(100.0 * 8 / o.seconds));
  }
}

TEST_CASE("a stall of S seconds costs sync S, and deadline about nothing, with S / step steps closed short") {
  const double S = 5;
  const WhatIfInput in = four_equal(200, {"stall:rank=1,at=10,for=5"});
  const WhatIfResult r = run_what_if(in);
  const PolicyOutcome sync = outcome(r, Policy::sync);
  // The step the stall begins in is held for all of it; at most one step more.
  CHECK(sync.lost_seconds >= S - 1e-9);
  CHECK(sync.lost_seconds <= S + sync.step_seconds);
  CHECK(sync.samples_dropped == 0);

  const PolicyOutcome deadline = outcome(r, Policy::deadline);
  REQUIRE(deadline.refused.empty());
  const double step = deadline.step_seconds, slack = in.deadline_slack;
  // The leader waits out the budget for the silent rank kDeadlineWaitedSteps times (plus
  // the step it returns in), then closes without it: slack x step each.
  CHECK(deadline.lost_seconds >= -1e-9);
  CHECK(deadline.lost_seconds <= (kDeadlineWaitedSteps + 1) * slack * step + 1e-9);
  const double expected_short = S / step;
  CHECK(static_cast<double>(deadline.steps_closed_short) >= expected_short - kDeadlineWaitedSteps * slack - 1);
  CHECK(static_cast<double>(deadline.steps_closed_short) <= expected_short + 1);
  // Each step closed short dropped rank 1's share (2 of the 8 samples).
  const Plan plan = plan_for_policy(in.planner, Policy::deadline, 0);
  CHECK(deadline.samples_dropped == deadline.steps_closed_short * plan.ranks[1].samples);
  CHECK(deadline.samples_per_s == doctest::Approx(static_cast<double>(200 * 8 - deadline.samples_dropped) /
                                                  deadline.seconds));
}

TEST_CASE("a stall past parallel.peer_timeout_s is noted where the policy waits for the rank, not under deadline") {
  WhatIfInput in = four_equal(200, {"stall:rank=1,at=10,for=5"});
  auto noted = [](const PolicyOutcome& o) {
    return std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) {
      return n.find("stall:rank=1,at=10,for=5: outlasts parallel.peer_timeout_s (4 s): where this policy waits for "
                    "rank 1, a job ends there with an error naming it") != std::string::npos;
    });
  };
  in.peer_timeout_s = 4;
  WhatIfResult r = run_what_if(in);
  CHECK(noted(outcome(r, Policy::sync)));
  CHECK(noted(outcome(r, Policy::local)));
  REQUIRE(outcome(r, Policy::deadline).refused.empty());
  CHECK(!noted(outcome(r, Policy::deadline)));  // one stage: it closes steps without the rank
  CHECK(outcome(r, Policy::sync).lost_seconds >= 5 - 1e-9);  // still played through
  in.peer_timeout_s = 5;  // not past it
  r = run_what_if(in);
  CHECK(!noted(outcome(r, Policy::sync)));
  in.peer_timeout_s = 0;  // not known
  r = run_what_if(in);
  CHECK(!noted(outcome(r, Policy::sync)));
}

TEST_CASE("a failure under sync loses the steps since the checkpoint and the restart, then runs re-planned") {
  WhatIfInput in = four_equal(100, {});
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  const double step = plan.predicted.step_seconds;
  const int64_t k = 25;  // it fails half-way through step 25; the newest checkpoint is step 20
  const double at = (static_cast<double>(k) + 0.5) * step;
  in.events = {parse_what_if_event("fail:rank=2,at=" + std::to_string(at))};
  const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
  REQUIRE(sync.refused.empty());
  CHECK(sync.work_lost_steps == k - 20);
  CHECK(sync.work_lost_seconds == doctest::Approx(at - 20 * step + kRestartSeconds));
  // The rest runs on ranks 0, 1 and 3, as the planner plans them.
  const std::vector<int> left = {0, 1, 3};
  PlannerInput rest = in.planner;
  rest.cluster = cluster_of(in.planner.cluster, left);
  rest.costs = costs_of(in.planner.costs, left);
  const double step3 = plan_for_policy(rest, Policy::sync, 0).predicted.step_seconds;
  CHECK(sync.seconds == doctest::Approx(at + kRestartSeconds + (100 - 20) * step3));
  CHECK(sync.lost_seconds == doctest::Approx(sync.seconds - 100 * step));
  REQUIRE(sync.notes.size() == 1);
  CHECK(contains(sync.notes[0], "restart from the checkpoint of step 20"));

  // deadline leaves the rank out for good and needs no restart.
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  CHECK(deadline.work_lost_steps == 0);
  CHECK(deadline.steps_closed_short >= 100 - k - 1);
  CHECK(deadline.samples_dropped == deadline.steps_closed_short * 2);
}

TEST_CASE("failures at one time, or during the restart, share one restart") {
  WhatIfInput in = four_equal(100, {});
  const double step = plan_for_policy(in.planner, Policy::sync, 0).predicted.step_seconds;
  const double at = 25.5 * step;
  const std::string t = std::to_string(at), during = std::to_string(at + kRestartSeconds / 2);
  for (const auto& specs : {std::vector<std::string>{"fail:rank=2,at=" + t, "fail:rank=3,at=" + t},
                            std::vector<std::string>{"fail:rank=2,at=" + t, "fail:rank=3,at=" + during}}) {
    in.events.clear();
    for (const std::string& s : specs) in.events.push_back(parse_what_if_event(s));
    const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
    REQUIRE(sync.refused.empty());
    // It played two restarts back to back, 60 s of work lost.
    CHECK(sync.work_lost_seconds == doctest::Approx(at - 20 * step + kRestartSeconds));
    REQUIRE(sync.notes.size() == 1);
    CHECK(contains(sync.notes[0], "on 2 ranks"));
    CHECK(contains(sync.notes[0], "(2 failed, one restart)"));
  }
}

TEST_CASE("a slow rank under deadline is left out until the budget has adapted to it; sync waits for it") {
  const WhatIfInput in = four_equal(50, {"slow:rank=3,at=0,factor=4"});
  const WhatIfResult r = run_what_if(in);
  const PolicyOutcome deadline = outcome(r, Policy::deadline);
  REQUIRE(deadline.refused.empty());
  // Its part (4x its compute, then the reduction) is beyond the plan's budget of 1.5
  // steps: it is late and waited for (it sends), so the first kDeadlineMinMeasured steps
  // close at that budget without it. Its late parts are the latest arrivals the leader
  // measures, so from then on the budget is 1.5x its part: it arrives in time, and every
  // step closes when it does.
  const Plan plan = plan_for_policy(in.planner, Policy::deadline, 0);
  const SimResult sim = simulate_plan(plan, in.planner.costs, in.planner.cluster);
  const double tail = sim.step_seconds - *std::max_element(sim.busy_seconds.begin(), sim.busy_seconds.end());
  const double part = 4 * sim.busy_seconds[3] + tail;
  const double first = plan.predicted.step_seconds * (1 + in.deadline_slack);
  REQUIRE(part > first);
  CHECK(deadline.steps_closed_short == kDeadlineMinMeasured);
  CHECK(deadline.samples_dropped == kDeadlineMinMeasured * 2);
  CHECK(deadline.seconds == doctest::Approx(kDeadlineMinMeasured * first + (50 - kDeadlineMinMeasured) * part));
  const PolicyOutcome sync = outcome(r, Policy::sync);
  CHECK(sync.samples_dropped == 0);
  CHECK(sync.lost_seconds > 0);
}

TEST_CASE("with rebalance_every, a slow rank's share is re-split after the checks' lag, under sync and deadline") {
  // Rank 3 slowed 4x from the start. With rebalance_every 0 sync runs every step at the
  // slowed step S1. With 10, the job re-splits the batch by measured speed after
  // kRebalanceLagChecks x 10 + 2 steps of S1, and from then on runs the re-split plan,
  // slowed: plan/rebalance.h's resplit over the costs with rank 3's x4, whose predicted
  // step on those costs is S2 < S1. Under equal shares no re-split is played.
  constexpr int64_t kSteps = 200, kEvery = 10;
  WhatIfInput in = four_equal(kSteps, {"slow:rank=3,at=0,factor=4"});
  const PolicyOutcome held = outcome(run_what_if(in), Policy::sync);
  in.rebalance_every = kEvery;
  const WhatIfResult r = run_what_if(in);
  const PolicyOutcome sync = outcome(r, Policy::sync);
  REQUIRE((held.refused.empty() && sync.refused.empty()));
  const double s1 = held.seconds / kSteps;
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  BlockCosts slowed = in.planner.costs;
  for (auto* row : {&slowed.seconds_per_sample, &slowed.call_seconds, &slowed.step_seconds})
    for (double& x : (*row)[3]) x *= 4;
  Plan moved = resplit(plan, plan, slowed);
  REQUIRE(moved.layout.samples != plan.layout.samples);
  CHECK(moved.layout.samples[3] < plan.layout.samples[3]);
  predict_plan(moved, slowed, in.planner.cluster);
  const double s2 = moved.predicted.step_seconds;
  REQUIRE(s2 < s1);
  const int64_t lag = kRebalanceLagChecks * kEvery + 2;
  CHECK(sync.seconds == doctest::Approx(lag * s1 + (kSteps - lag) * s2));
  // Deadline re-splits too: it no longer runs at the slowed rank's pace.
  const PolicyOutcome deadline = outcome(r, Policy::deadline);
  in.rebalance_every = 0;
  const PolicyOutcome deadline_held = outcome(run_what_if(in), Policy::deadline);
  REQUIRE((deadline.refused.empty() && deadline_held.refused.empty()));
  CHECK(deadline.lost_seconds < 0.5 * deadline_held.lost_seconds);
  // An equal split never moves (strategy equal: the ShareTuner keeps the shares).
  WhatIfInput equal = four_equal(kSteps, {"slow:rank=3,at=0,factor=4"});
  equal.planner.strategy = ht::config::ParallelStrategy::equal;
  const PolicyOutcome eq_held = outcome(run_what_if(equal), Policy::sync);
  equal.rebalance_every = kEvery;
  CHECK(outcome(run_what_if(equal), Policy::sync).seconds == doctest::Approx(eq_held.seconds));
}

TEST_CASE("a rank slowed past 4 of the others' steps under deadline is left out every step, not waited for") {
  // Factor 20: its part is more than kDeadlineBehindSteps of the others' closes, as far
  // behind as a rank back from a stop, which comm/deadline_reduce's leader no longer waits
  // for but as a silent one, its first kDeadlineWaitedSteps steps to the plan's budget.
  // Every later step closes when the others are in, at the unperturbed pace, its share
  // dropped; waited for, as a slow rank within those steps is (above), the budget would
  // grow to its part and the job would run at its pace.
  const WhatIfInput in = four_equal(50, {"slow:rank=3,at=0,factor=20"});
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  const PolicyOutcome plain = outcome(run_what_if(four_equal(50, {})), Policy::deadline);
  REQUIRE(deadline.refused.empty());
  CHECK(deadline.steps_closed_short == 50);
  CHECK(deadline.samples_dropped == 50 * 2);
  const double step = plain.seconds / 50;
  CHECK(deadline.seconds == doctest::Approx(plain.seconds + kDeadlineWaitedSteps * in.deadline_slack * step));
  // The leader so slowed is as silent to its members: the next rank leads, and the slow
  // one's share is left out every step.
  const PolicyOutcome led = outcome(run_what_if(four_equal(50, {"slow:rank=0,at=0,factor=20"})), Policy::deadline);
  REQUIRE(led.refused.empty());
  CHECK(led.samples_dropped == 50 * 2);
  CHECK(std::any_of(led.notes.begin(), led.notes.end(), [](const std::string& n) {
    return n.find("the leader (rank 0) fell silent at step 0: rank 1 leads from then on") != std::string::npos;
  }));
}

TEST_CASE("a link event re-simulates the step on the changed cluster from its time on") {
  const WhatIfInput in = four_equal(40, {"link:ranks=0-1,at=0,latency=20,bandwidth=1"});
  const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  ClusterModel changed = in.planner.cluster;
  fx::set_latency(changed, 0, 1, 0.020);
  fx::set_bandwidth(changed, 0, 1, 1e6);
  const double slow_step = simulate_plan(plan, in.planner.costs, changed).step_seconds;
  CHECK(slow_step > plan.predicted.step_seconds);
  CHECK(sync.seconds == doctest::Approx(40 * slow_step));
}

TEST_CASE("deadline: a slow link to one member leaves that member out, not every member") {
  // Rank 1's link to the leader (rank 0) at 1 MB/s: its 16 MB gradient and the sum back
  // take 32 s, far past 4 of the others' closes, so it is waited for as a silent member
  // (its first 2 steps to the plan's budget) and then left out; the other members' links
  // are as they were, and their samples are kept. Charging the whole reduction at the
  // slow link left every member out (384 of 384 samples dropped in a review's run).
  const WhatIfInput in = four_equal(3, {"link:ranks=0-1,at=0,latency=0,bandwidth=1"});
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  const PolicyOutcome plain = outcome(run_what_if(four_equal(3, {})), Policy::deadline);
  REQUIRE(deadline.refused.empty());
  CHECK(deadline.samples_dropped == 3 * 2);
  CHECK(deadline.steps_closed_short == 3);
  const double step = plain.seconds / 3;
  CHECK(deadline.seconds == doctest::Approx(plain.seconds + kDeadlineWaitedSteps * in.deadline_slack * step));
}

TEST_CASE("a stall holds local's one group as it holds sync") {
  // Equal ranks on fast links form one group, whose rounds the stall holds: S exactly.
  const WhatIfInput in = four_equal(120, {"stall:rank=0,at=3,for=4"});
  const PolicyOutcome local = outcome(run_what_if(in), Policy::local);
  REQUIRE(local.refused.empty());
  const Plan plan = plan_for_policy(in.planner, Policy::local, 0);
  REQUIRE(plan.local->groups.size() == 1);
  CHECK(local.lost_seconds == doctest::Approx(4));
}

TEST_CASE("overlapping stalls of one rank hold it over their union, under sync and local alike") {
  // Stopped from 3 to 7 and from 6 to 9: 6 s, not the longer stall's 4 nor the sum's 7.
  const WhatIfInput in = four_equal(1000, {"stall:rank=0,at=3,for=4", "stall:rank=0,at=6,for=3"});
  const WhatIfResult r = run_what_if(in);
  for (Policy p : {Policy::sync, Policy::local}) {
    CAPTURE(ht::config::to_string(p));
    const PolicyOutcome o = outcome(r, p);
    REQUIRE(o.refused.empty());
    CHECK(o.lost_seconds == doctest::Approx(6));
  }
  // One stall inside another adds nothing to it.
  const PolicyOutcome inside = outcome(run_what_if(four_equal(1000, {"stall:rank=0,at=3,for=4", "stall:rank=0,at=4,for=1"})),
                                       Policy::sync);
  CHECK(inside.lost_seconds == doctest::Approx(4));
}

TEST_CASE("deadline: a link to a rank that has failed changes no step; a second failure of it leaves out nothing more") {
  const WhatIfInput failed = four_equal(200, {"fail:rank=2,at=0"});
  const WhatIfInput linked = four_equal(200, {"fail:rank=2,at=0", "link:ranks=0-2,at=0.01,latency=500,bandwidth=1"});
  const WhatIfInput twice = four_equal(200, {"fail:rank=2,at=0", "fail:rank=2,at=0.01"});
  const PolicyOutcome a = outcome(run_what_if(failed), Policy::deadline);
  const PolicyOutcome b = outcome(run_what_if(linked), Policy::deadline);
  const PolicyOutcome c = outcome(run_what_if(twice), Policy::deadline);
  REQUIRE(a.refused.empty());
  CHECK(b.seconds == doctest::Approx(a.seconds));
  CHECK(b.samples_dropped == a.samples_dropped);
  CHECK(c.seconds == doctest::Approx(a.seconds));
  CHECK(std::count_if(c.notes.begin(), c.notes.end(),
                      [](const std::string& n) { return n.find("left out from step") != std::string::npos; }) == 1);
}

TEST_CASE("what-if event specs: one-line errors naming the spec, the field, the value and what was expected") {
  const auto err = [](const std::string& spec) { return error_of([&] { parse_what_if_event(spec); }); };
  CHECK(err("hang:rank=1") == "what-if event hang:rank=1: unknown kind 'hang'; expected stall, slow, fail, link or "
                              "join (e.g. stall:rank=1,at=10,for=5)");
  CHECK(err("stall:rank=1,at=5") == "what-if event stall:rank=1,at=5: missing for; expected stall:rank=...,at=...,for=...");
  CHECK(err("stall:rank=x,at=5,for=5") ==
        "what-if event stall:rank=x,at=5,for=5: rank=x is not a rank; expected an integer of at least 0");
  CHECK(err("stall:rank=99999999999999999999,at=5,for=5") ==
        "what-if event stall:rank=99999999999999999999,at=5,for=5: rank=99999999999999999999 is out of range; "
        "expected a rank of the cluster (an integer of at least 0)");
  CHECK(err("link:ranks=0-1-2,at=1,latency=1,bandwidth=10") ==
        "what-if event link:ranks=0-1-2,at=1,latency=1,bandwidth=10: ranks=0-1-2 is not a rank pair; expected A-B, the "
        "two ranks (at least 0) the link joins (e.g. 0-3)");
  CHECK(err("stall:rank=1,at=5,for=0") ==
        "what-if event stall:rank=1,at=5,for=0: for=0 is out of range; expected seconds, above 0 and at most 1e9");
  CHECK(err("stall:rank=1,at=5,for=1.7e308") == "what-if event stall:rank=1,at=5,for=1.7e308: for=1.7e308 is out of "
                                                "range; expected seconds, above 0 and at most 1e9");
  CHECK(err("slow:rank=1,at=5,factor=0.5") == "what-if event slow:rank=1,at=5,factor=0.5: factor=0.5 is out of range; "
                                              "expected a compute-time multiplier from 1 to 1e6 (2: twice as slow)");
  CHECK(err("slow:rank=1,at=5,factor=2e6") == "what-if event slow:rank=1,at=5,factor=2e6: factor=2e6 is out of range; "
                                              "expected a compute-time multiplier from 1 to 1e6 (2: twice as slow)");
  CHECK(err("fail:rank=1,at=-2") ==
        "what-if event fail:rank=1,at=-2: at=-2 is out of range; expected seconds of job time, from 0 to 1e9");
  CHECK(err("fail:rank=1,at=2,for=3") ==
        "what-if event fail:rank=1,at=2,for=3: unknown field 'for' for fail; expected rank and at");
  CHECK(err("link:ranks=3,at=1,latency=1,bandwidth=10") ==
        "what-if event link:ranks=3,at=1,latency=1,bandwidth=10: ranks=3 is not a rank pair; expected A-B, the two "
        "ranks (at least 0) the link joins (e.g. 0-3)");
  CHECK(err("link:ranks=-1-2,at=1,latency=1,bandwidth=10") ==
        "what-if event link:ranks=-1-2,at=1,latency=1,bandwidth=10: ranks=-1-2 is not a rank pair; expected A-B, the "
        "two ranks (at least 0) the link joins (e.g. 0-3)");
  CHECK(err("link:ranks=0-1,at=1,latency=1,bandwidth=0") ==
        "what-if event link:ranks=0-1,at=1,latency=1,bandwidth=0: bandwidth=0 is out of range; expected the "
        "bandwidth in MB/s (1 MB = 1e6 bytes), from 1e-6 (a byte a second) to 1e9");
  CHECK(err("join:at=1") == "what-if event join:at=1: missing device; expected join:device=...,at=...");
  CHECK(err("stall:rank=1,rank=2,at=1,for=1") ==
        "what-if event stall:rank=1,rank=2,at=1,for=1: field 'rank' is given twice; expected it once");

  const WhatIfEvent link = parse_what_if_event("link:ranks=0-3,at=2.5,latency=4,bandwidth=125");
  CHECK(link.rank == 0);
  CHECK(link.peer == 3);
  CHECK(link.at_s == 2.5);
  CHECK(link.latency_s == doctest::Approx(0.004));
  CHECK(link.bandwidth_bytes_per_s == doctest::Approx(125e6));

  // Against the world and the catalogue.
  Catalogue cat;
  for (const auto& [id, name] : {std::pair{"rtx3060", "RTX 3060"}, std::pair{"a100-40g", "A100"}}) {
    CatalogueDevice d;
    d.id = id;
    d.name = name;
    cat.devices.push_back(d);
  }
  const auto check = [&](const std::string& spec) {
    return error_of([&] { check_what_if_events({parse_what_if_event(spec)}, 4, cat); });
  };
  CHECK(check("stall:rank=4,at=1,for=1") ==
        "what-if event stall:rank=4,at=1,for=1: rank 4 is not in the cluster; expected 0 to 3 (the cluster has 4 ranks)");
  CHECK(check("link:ranks=1-7,at=1,latency=1,bandwidth=1") ==
        "what-if event link:ranks=1-7,at=1,latency=1,bandwidth=1: rank 7 is not in the cluster; expected 0 to 3 (the "
        "cluster has 4 ranks)");
  CHECK(check("join:device=h100,at=1") ==
        "what-if event join:device=h100,at=1: device=h100 is not in the catalogue; expected one of rtx3060, a100-40g");
}

TEST_CASE("a join re-plans at the next checkpoint boundary, after a restart, with the datasheet device") {
  WhatIfInput in = four_equal(100, {});
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  const double step = plan.predicted.step_seconds;
  in.events = {parse_what_if_event("join:device=cpu-16c,at=" + std::to_string(5.5 * step))};
  can_join(in);
  const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
  REQUIRE(sync.refused.empty());
  REQUIRE(sync.notes.size() == 1);
  CHECK(contains(sync.notes[0], "joined at the checkpoint of step 10"));
  CHECK(contains(sync.notes[0], "(was " + ht::format_seconds(step) + ")"));
  ClusterModel five = in.planner.cluster;
  const DeviceModel cpu = cluster_from_synth("synth:1xcpu-16c", in.catalogue_path).ranks[0];
  five.ranks.push_back(cpu);
  five.links.add_rank(1e-5, 1e10);
  PlannerInput bigger = in.planner;
  bigger.cluster = five;
  bigger.costs = block_costs(in.model, five, in.optimizer);
  const double step5 = plan_for_policy(bigger, Policy::sync, 0).predicted.step_seconds;
  CHECK(sync.seconds == doctest::Approx(10 * step + kRestartSeconds + 90 * step5));
  CHECK(sync.work_lost_steps == 0);

  // Two joins waiting at one checkpoint come in with one restart, on six ranks.
  in.events.push_back(parse_what_if_event("join:device=cpu-16c,at=" + std::to_string(6.5 * step)));
  const PolicyOutcome two = outcome(run_what_if(in), Policy::sync);
  REQUIRE(two.refused.empty());
  REQUIRE(two.notes.size() == 2);
  CHECK(contains(two.notes[1], "(2 joined with one restart)"));
  ClusterModel six = five;
  six.ranks.push_back(cpu);
  six.links.add_rank(1e-5, 1e10);
  bigger.cluster = six;
  bigger.costs = block_costs(in.model, six, in.optimizer);
  const double step6 = plan_for_policy(bigger, Policy::sync, 0).predicted.step_seconds;
  CHECK(two.seconds == doctest::Approx(10 * step + kRestartSeconds + 90 * step6));
}

TEST_CASE("a failure's restart takes a waiting join into the one re-plan, where the ranks left alone have none") {
  // Three of four ranks fail at one time while a fourth device waits to join: local on the
  // one rank left has no plan (it steps groups beside one another), with the joined one
  // it has. The re-plan was of the ranks left first, and local was not played at all.
  WhatIfInput in = four_equal(100, {});
  const double step = plan_for_policy(in.planner, Policy::sync, 0).predicted.step_seconds;
  const std::string at = std::to_string(2.5 * step);
  in.events = {parse_what_if_event("join:device=cpu-16c,at=" + std::to_string(1.5 * step)),
               parse_what_if_event("fail:rank=1,at=" + at), parse_what_if_event("fail:rank=2,at=" + at),
               parse_what_if_event("fail:rank=3,at=" + at)};
  can_join(in);
  const WhatIfResult r = run_what_if(in);
  for (Policy p : {Policy::sync, Policy::local}) {
    const PolicyOutcome o = outcome(r, p);
    CAPTURE(static_cast<int>(p));
    REQUIRE(o.refused.empty());
    CHECK(std::any_of(o.notes.begin(), o.notes.end(), [](const std::string& n) { return contains(n, "on 2 ranks"); }));
    CHECK(std::any_of(o.notes.begin(), o.notes.end(),
                      [](const std::string& n) { return contains(n, "joined with the restart after"); }));
  }
}

TEST_CASE("a join with no checkpoint after it before the end never joins, and says so") {
  WhatIfInput in = four_equal(100, {});
  in.catalogue_path = default_catalogue_path();
  const double step = plan_for_policy(in.planner, Policy::sync, 0).predicted.step_seconds;
  in.events = {parse_what_if_event("join:device=cpu-16c,at=" + std::to_string(5.5 * step))};
  for (const int64_t every : {int64_t{100}, int64_t{0}}) {  // the only checkpoint is the end's; none at all
    in.checkpoint_every = every;
    const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
    REQUIRE(sync.refused.empty());
    REQUIRE(sync.notes.size() == 1);
    CHECK(contains(sync.notes[0], "join:device=cpu-16c,at="));
    CHECK(contains(sync.notes[0], every ? ": never joined: no checkpoint (every 100 steps) came after it"
                                        : ": never joined: the job writes no checkpoint (checkpoint.every 0)"));
    CHECK(sync.seconds == doctest::Approx(100 * step));
  }
  // A failure's restart re-plans: a join waiting then comes in with it, checkpoint or none
  // after it (the restart is from the checkpoint before both).
  in.checkpoint_every = 100;
  in.events.push_back(parse_what_if_event("fail:rank=3,at=" + std::to_string(7.5 * step)));
  can_join(in);
  const PolicyOutcome both = outcome(run_what_if(in), Policy::sync);
  INFO(both.refused);
  REQUIRE(both.refused.empty());
  REQUIRE(both.notes.size() == 2);
  CHECK(contains(both.notes[0], "fail:rank=3,at="));
  CHECK(contains(both.notes[0], ": restart from the checkpoint of step 0 (7 steps lost) on 4 ranks"));
  CHECK(contains(both.notes[1], "join:device=cpu-16c,at="));
  CHECK(contains(both.notes[1], ": joined with the restart after fail:rank=3,at="));
}

TEST_CASE("deadline's budget follows the median of the last steps' arrivals, as the leader's does") {
  // Every rank slowed 4x from the start: every part is past the plan's budget, so the
  // first kDeadlineMinMeasured steps close short for every member (at that budget), then
  // the budget is 1.5x the measured step and none is. (A slow link lengthens only its own
  // member's part: the test below.)
  WhatIfInput in = four_equal(40, {"slow:rank=0,at=0,factor=4", "slow:rank=1,at=0,factor=4",
                                   "slow:rank=2,at=0,factor=4", "slow:rank=3,at=0,factor=4"});
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  REQUIRE(deadline.refused.empty());
  const Plan plan = plan_for_policy(in.planner, Policy::deadline, 0);
  const SimResult sim = simulate_plan(plan, in.planner.costs, in.planner.cluster);
  const double slow = sim.step_seconds + 3 * *std::max_element(sim.busy_seconds.begin(), sim.busy_seconds.end());
  const double first = plan.predicted.step_seconds * (1 + in.deadline_slack);
  REQUIRE(slow > first);
  CHECK(deadline.steps_closed_short == kDeadlineMinMeasured);
  CHECK(deadline.samples_dropped == kDeadlineMinMeasured * 8);
  CHECK(deadline.seconds == doctest::Approx(kDeadlineMinMeasured * first + (40 - kDeadlineMinMeasured) * slow));
}

namespace {

// The e2e tests' fixed cluster file (speeds 4/2/1/1) on links made 5 ms slow, with the
// MLP's size (2 blocks of 3.3e5 parameters, 47 us per sample and block on rank 0): each
// rank steps alone, so local plays four one-rank groups, H = 8 split 4/2/1/1 (as
// test_local_plan checks).
WhatIfInput four_groups(int64_t steps) {
  ClusterModel c = load_cluster_model((source_root() / "tests/e2e/clusters/cpu_4_2_1_1.json").string(),
                                      (source_root() / "configs/devices.json").string());
  for (size_t i = 0; i < c.ranks.size(); ++i)
    for (size_t j = 0; j < c.ranks.size(); ++j)
      if (i != j && c.links.latency(i, j) > 0) c.links.set_latency(i, j, 5e-3);
  BlockCosts k = fx::costs(c, 2);
  for (size_t b = 0; b < 2; ++b) k.params[b] = 3.3e5, k.state_bytes[b] = 3.3e5 * 16;
  for (size_t r = 0; r < c.ranks.size(); ++r)
    for (double& s : k.seconds_per_sample[r]) s = 47e-6 * c.ranks[0].flops / c.ranks[r].flops;
  WhatIfInput in;
  in.planner = fx::input(c, k, 128, "data");
  in.steps = steps;
  in.local_steps = 8;
  return in;
}

struct Rounds {
  Plan plan;
  std::vector<double> length;  // each group's round of inner steps
};

Rounds rounds_of(const WhatIfInput& in) {
  const auto given = std::find_if(in.plans.begin(), in.plans.end(), [](const Plan& p) { return p.local.has_value(); });
  Rounds r{given != in.plans.end() ? *given : plan_for_policy(in.planner, Policy::local, in.local_steps), {}};
  for (int g = 0; g < static_cast<int>(r.plan.local->groups.size()); ++g) {
    const std::vector<int> ranks = group_ranks(r.plan, g);
    const double step = simulate_plan(group_plan(r.plan, g), costs_of(in.planner.costs, ranks),
                                      cluster_of(in.planner.cluster, ranks)).step_seconds;
    r.length.push_back(static_cast<double>(r.plan.local->group_steps[static_cast<size_t>(g)]) * step);
  }
  return r;
}

}  // namespace

TEST_CASE("local drops no sample: a group held longer than a round is waited for once, its round's samples counted") {
  WhatIfInput in = four_groups(8 * 20);
  const Rounds r = rounds_of(in);
  REQUIRE(r.plan.local->groups.size() == 4);
  REQUIRE(r.plan.local->inner_steps == 8);
  // A round lasts the plan's H job steps (the slowest group's inner steps and the outer pass).
  const double round = r.plan.predicted.step_seconds * r.plan.local->inner_steps;
  // Rank 1 (group 1) stops a little into its third round for three rounds: the others end
  // their fourth and wait at its exchange, so its third round is waited for, once; then
  // every group goes on from that exchange, level.
  const double S = 3 * round;
  in.events = {parse_what_if_event("stall:rank=1,at=" + std::to_string(2 * round + 0.1 * r.length[1]) +
                                   ",for=" + std::to_string(S))};
  const PolicyOutcome local = outcome(run_what_if(in), Policy::local);
  REQUIRE(local.refused.empty());
  CHECK(local.samples_dropped == 0);
  CHECK(local.rounds_waited_for == 1);
  CHECK(local.samples_waited_for == r.plan.local->round_samples[1]);
  // The stall's cost is at most S, less at most the one round the others run on during
  // it (the exchange they wait at is the held round's, one round later).
  CHECK(local.lost_seconds <= S * (1 + 1e-9));
  CHECK(local.lost_seconds >= S - round - 1e-9 * S);
  REQUIRE(!local.notes.empty());
  CHECK(contains(local.notes.back(), "1 group rounds held by an event were waited for"));
}

TEST_CASE("local with rebalance_every: a slowed group's rounds are re-split by the slowed costs after the lag") {
  // Rank 0 (group 0, most of each round's samples) slowed 3x from the start. Without
  // re-splits every round waits for its slowed steps; with parallel.rebalance_every above
  // 0 the rounds re-split from kResplitRounds + 2 rounds on (the runtime's window, the
  // round left out after a change, the exchange that carries it): split_round over the
  // groups' costs with rank 0's x3, which gives group 0 fewer samples, and the job loses
  // less.
  WhatIfInput in = four_groups(8 * 40);
  in.events = {parse_what_if_event("slow:rank=0,at=0,factor=3")};
  const PolicyOutcome held = outcome(run_what_if(in), Policy::local);
  in.rebalance_every = 10;
  const PolicyOutcome moved = outcome(run_what_if(in), Policy::local);
  REQUIRE((held.refused.empty() && moved.refused.empty()));
  const Rounds r = rounds_of(in);
  REQUIRE(r.plan.local->groups.size() == 4);
  BlockCosts slowed = in.planner.costs;
  for (auto* row : {&slowed.seconds_per_sample, &slowed.call_seconds, &slowed.step_seconds})
    for (double& x : (*row)[0]) x *= 3;
  const RoundSplit split = split_round(r.plan.local->inner_steps, r.plan.global_batch,
                                       group_costs(r.plan, slowed, in.planner.cluster));
  REQUIRE(split.samples[0] < r.plan.local->round_samples[0]);
  CHECK(moved.lost_seconds < 0.75 * held.lost_seconds);
  CHECK(moved.lost_seconds > 0);
  MESSAGE("lost: ", held.lost_seconds, " s with the plan's split, ", moved.lost_seconds, " s re-split");
}

TEST_CASE("local: a group held past the next round's outer step is waited for there; a shorter hold at the final flush") {
  WhatIfInput in = four_groups(8 * 20 + 3);
  // The outer step a job step into the next round where the exchange allows
  // (parallel.outer_delay 1): the plan the what-if plays.
  Plan soon = plan_for_policy(in.planner, Policy::local, in.local_steps);
  apply_outer_delay(soon, in.planner.costs, in.planner.cluster, 1);
  in.plans = {soon};
  const Rounds r = rounds_of(in);
  REQUIRE(r.plan.local->groups.size() == 4);
  const int d = r.plan.local->outer_delay;
  CAPTURE(d);
  REQUIRE(d < r.plan.local->inner_steps);
  const double round = r.plan.predicted.step_seconds * r.plan.local->inner_steps;
  // Group 0 (rank 0) reaches job step D of a round after its first batches_in_round(D)
  // inner steps; the others reach it no later (the split ends the rounds together).
  const double to_d = static_cast<double>(batches_in_round(r.plan, 0, d)) * r.length[0] /
                      r.plan.local->group_steps[0];
  // Rank 1 stopped a little into its third round, for longer than it takes group 0 to
  // reach D in its fourth: group 0 waits there for the third round's exchange, once.
  const double at = 2 * round + 0.1 * r.length[1];
  in.events = {parse_what_if_event("stall:rank=1,at=" + std::to_string(at) + ",for=" + std::to_string(0.9 * r.length[1]))};
  REQUIRE(0.9 * r.length[1] > 0.1 * r.length[1] + to_d + 0.05 * round);
  const PolicyOutcome held = outcome(run_what_if(in), Policy::local);
  REQUIRE(held.refused.empty());
  CHECK(held.rounds_waited_for == 1);
  CHECK(held.samples_waited_for == r.plan.local->round_samples[1]);
  // A hold shorter than the slack before D is not waited for there: the group stays
  // behind unseen until the final flush waits for it. 20 rounds and 3 steps: the last,
  // partial round has ceil(3 x H_1 / 8) of group 1's batches.
  char brief_for[64];
  std::snprintf(brief_for, sizeof brief_for, "%.9g", 0.5 * to_d);
  in.events = {parse_what_if_event("stall:rank=1,at=" + std::to_string(at) + ",for=" + brief_for)};
  const PolicyOutcome brief = outcome(run_what_if(in), Policy::local);
  CHECK(brief.rounds_waited_for == 1);
  // Group 1's samples of those batches (its steps are n_1 / H_1 samples, not one global batch).
  int64_t partial = 0;
  for (int rank : group_ranks(r.plan, 1)) partial += samples_in_round(r.plan, rank, 3);
  CHECK(partial >= batches_in_round(r.plan, 1, 3));
  CHECK(partial < r.plan.local->round_samples[1]);
  CHECK(brief.samples_waited_for == partial);
  // Without the event nothing is waited for.
  in.events.clear();
  const PolicyOutcome plain = outcome(run_what_if(in), Policy::local);
  CHECK(plain.rounds_waited_for == 0);
  CHECK(plain.samples_waited_for == 0);
}

namespace {

struct SvgLine {
  std::string kind;
  int event = -1;
  double x = 0;
};

// The event marks of a what-if picture: <line class="event-mark KIND" data-event="I" x1="X" ...>.
std::vector<SvgLine> event_marks(const std::string& svg) {
  std::vector<SvgLine> out;
  const std::regex mark(R"re(<line class="event-mark (\w+)" data-event="(\d+)" x1="([0-9.]+)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), mark); it != std::sregex_iterator(); ++it)
    out.push_back({(*it)[1], std::stoi((*it)[2]), std::stod((*it)[3])});
  return out;
}

// One policy's band of the picture.
std::string band(const std::string& svg, const std::string& policy) {
  const std::string open = "<g class=\"band\" data-policy=\"" + policy + "\">";
  const size_t at = svg.find(open);
  REQUIRE(at != std::string::npos);
  return svg.substr(at, svg.find("</g>\n<g class=", at) - at);
}

// The widths of the spans of one kind in a band.
std::vector<double> span_widths(const std::string& band_svg, const std::string& kind) {
  std::vector<double> out;
  const std::regex span("<rect class=\"span " + kind + R"re(" x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)")re");
  for (auto it = std::sregex_iterator(band_svg.begin(), band_svg.end(), span); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

}  // namespace

TEST_CASE("what-if picture: every event's mark at its time's x, the stall held and the restart drawn to scale") {
  WhatIfInput in = four_equal(300, {});
  can_join(in);
  const double step = plan_for_policy(in.planner, Policy::sync, 0).predicted.step_seconds;
  const auto at = [&](double steps) { return std::to_string(steps * step); };
  // The stall in the middle of step 10 (sync holds that step for all of it); the failure
  // before the next checkpoint; the join after its restart has ended (one waiting by then
  // would come in with that restart).
  const std::vector<std::string> specs = {"stall:rank=1,at=" + at(10.5) + ",for=" + at(20),
                                          "slow:rank=2,at=" + at(60) + ",factor=2",
                                          "link:ranks=0-1,at=" + at(90) + ",latency=1,bandwidth=100",
                                          "fail:rank=3,at=" + at(125.5),
                                          "join:device=cpu-16c,at=" + std::to_string(135.5 * step + kRestartSeconds)};
  for (const std::string& s : specs) in.events.push_back(parse_what_if_event(s));
  const WhatIfResult r = run_what_if(in);
  for (const PolicyOutcome& o : r.policies) REQUIRE(o.refused.empty());
  const std::string svg = ht::report::what_if_to_svg(r, in.events, "what if");
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);

  // The axis: 0 to the longest played job (every event falls inside it here).
  double end = 0;
  for (const PolicyOutcome& o : r.policies) end = std::max(end, o.seconds);
  const auto x = [&](double t) { return ht::report::kWhatIfPlotLeft + t / end * ht::report::kWhatIfPlotWidth; };
  const double px = 0.005 + 1e-9;  // coordinates are written to 2 decimals
  const std::vector<SvgLine> marks = event_marks(svg);
  REQUIRE(marks.size() == in.events.size());
  const char* kinds[] = {"stall", "slow", "link", "fail", "join"};
  for (size_t i = 0; i < marks.size(); ++i) {
    CAPTURE(in.events[i].spec);
    CHECK(marks[i].event == static_cast<int>(i));
    CHECK(marks[i].kind == kinds[i]);
    CHECK(std::abs(marks[i].x - x(in.events[i].at_s)) <= px);
  }
  // The stall's own span: at its time, as long as it.
  const std::regex stall_span(R"re(<rect class="event-span stall" data-event="0" x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)")re");
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, stall_span));
  CHECK(std::abs(std::stod(m[1]) - x(in.events[0].at_s)) <= px);
  CHECK(std::abs(std::stod(m[2]) - (x(in.events[0].at_s + in.events[0].for_s) - x(in.events[0].at_s))) <= 2 * px);

  // sync: the step the stall began in held for all of it; the failure's restart and the
  // join's each kRestartSeconds long; the work lost drawn too.
  const std::string sync = band(svg, "sync");
  const double S = in.events[0].for_s, scale = ht::report::kWhatIfPlotWidth / end;
  const std::vector<double> held = span_widths(sync, "held");
  REQUIRE(held.size() == 1);
  CHECK(std::abs(held[0] - S * scale) <= 3 * px);
  const std::vector<double> restarts = span_widths(sync, "restart");
  REQUIRE(restarts.size() == 2);
  for (double w : restarts) CHECK(std::abs(w - kRestartSeconds * scale) <= 3 * px);
  CHECK(span_widths(sync, "lost").size() == 1);
  // deadline restarts only for the join; it closes steps short instead.
  const std::string deadline = band(svg, "deadline");
  CHECK(span_widths(deadline, "restart").size() == 1);
  CHECK(!span_widths(deadline, "short").empty());
  // 300 steps drawn as spans merged per lane: a handful of elements, not one per step.
  // (local's re-planned groups wait for the slow one every round: spans per round there.)
  for (const char* policy : {"sync", "deadline"}) {
    const std::string b = band(svg, policy);
    size_t n = 0;
    for (size_t p = b.find("<rect class=\"span"); p != std::string::npos; p = b.find("<rect class=\"span", p + 1)) ++n;
    CAPTURE(std::string(policy));
    CHECK(n < 40);
  }
  // The legend names every span kind and event kind.
  for (const char* label : {"held by a stall", "closed short", "restart", "work lost (redone)", "stall", "slow from T",
                            "failure", "link change", "join"})
    CHECK(svg.find(std::string(">") + label + "<") != std::string::npos);
}

TEST_CASE("what-if picture: an event after the job's end widens the axis to it") {
  WhatIfInput in = four_equal(20, {});
  in.events = {parse_what_if_event("stall:rank=0,at=1000,for=10")};
  const WhatIfResult r = run_what_if(in);
  CHECK(ht::report::what_if_svg_end(r, in.events) == 1010);
  const std::vector<SvgLine> marks = event_marks(ht::report::what_if_to_svg(r, in.events, "t"));
  REQUIRE(marks.size() == 1);
  CHECK(std::abs(marks[0].x - (ht::report::kWhatIfPlotLeft + 1000.0 / 1010 * ht::report::kWhatIfPlotWidth)) <= 0.006);
}

TEST_CASE("what-if picture: spans narrower than a pixel are drawn as a few, at most about one a pixel per lane") {
  // 20,000 alternating spans of 1 ms over 20 s on one lane: 0.04 px each.
  WhatIfResult r;
  r.steps = 20000;
  PolicyOutcome o;
  o.policy = Policy::local;
  o.seconds = 20;
  o.lanes = {"group 0"};
  for (int i = 0; i < 20000; ++i)
    o.timeline.push_back({i * 1e-3, (i + 1) * 1e-3, 0, i % 2 ? WhatIfSpanKind::waiting : WhatIfSpanKind::work});
  r.policies.push_back(o);
  const std::string svg = ht::report::what_if_to_svg(r, {}, "t");
  size_t n = 0;
  for (size_t p = svg.find("<rect class=\"span"); p != std::string::npos; p = svg.find("<rect class=\"span", p + 1)) ++n;
  CHECK(n >= 1);
  CHECK(n <= static_cast<size_t>(ht::report::kWhatIfPlotWidth));
  // They cover the lane from 0 to 20 s, as the spans did.
  double covered = 0;
  for (const std::string kind : {"work", "waiting"})
    for (double w : span_widths(band(svg + "</g>\n<g class=", "local"), kind)) covered += w;
  // Each width is written to 2 decimals: off by at most 0.005 px each.
  CHECK(std::abs(covered - ht::report::kWhatIfPlotWidth) <= 0.005 * static_cast<double>(n) + 1e-6);
}

TEST_CASE("deadline: a stall that outlasts the job holds its end, which hears from every rank") {
  WhatIfInput in = four_equal(20, {});
  const double step = plan_for_policy(in.planner, Policy::deadline, 0).predicted.step_seconds;
  in.events = {parse_what_if_event("stall:rank=1,at=" + std::to_string(5.5 * step) + ",for=" + std::to_string(100 * step))};
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  REQUIRE(deadline.refused.empty());
  CHECK(deadline.seconds == doctest::Approx(in.events[0].at_s + in.events[0].for_s));
}

TEST_CASE("deadline: with every rank stopped no step closes; the job waits as sync does") {
  WhatIfInput in = four_equal(200, {});
  const double step = plan_for_policy(in.planner, Policy::deadline, 0).predicted.step_seconds;
  const double at = 10.5 * step, S = 50 * step;
  for (int r = 0; r < 4; ++r)
    in.events.push_back(parse_what_if_event("stall:rank=" + std::to_string(r) + ",at=" + std::to_string(at) +
                                            ",for=" + std::to_string(S)));
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  REQUIRE(deadline.refused.empty());
  // It closed dozens of empty steps, each dropping the whole batch.
  CHECK(deadline.steps_closed_short == 0);
  CHECK(deadline.samples_dropped == 0);
  CHECK(deadline.lost_seconds == doctest::Approx(S).epsilon(0.02));
}

TEST_CASE("deadline: a failure counts from the step its rank had not yet sent to; one after the end changes nothing") {
  WhatIfInput in = four_equal(20, {});
  const double step = plan_for_policy(in.planner, Policy::deadline, 0).predicted.step_seconds;
  const PolicyOutcome clean = outcome(run_what_if(in), Policy::deadline);
  // Just after the last step closed, inside what would have been its budget: nothing.
  in.events = {parse_what_if_event("fail:rank=1,at=" + std::to_string(clean.seconds + 0.2 * step))};
  const PolicyOutcome late = outcome(run_what_if(in), Policy::deadline);
  CHECK(late.seconds == doctest::Approx(clean.seconds));
  CHECK(late.samples_dropped == 0);
  // Early in step 6 (a step is clean.seconds / 20 as played), within step 5's budget: step
  // 5 is whole, 6 on are short (14 of 20). It was charged to step 5, whose budget ran on.
  in.events = {parse_what_if_event("fail:rank=1,at=" + std::to_string(6.2 * clean.seconds / 20))};
  const PolicyOutcome mid = outcome(run_what_if(in), Policy::deadline);
  CHECK(mid.steps_closed_short == 14);
  REQUIRE(!mid.notes.empty());
  CHECK(contains(mid.notes[0], "left out from step 6 on"));
}

TEST_CASE("deadline: a stalled leader costs its step the members' patience and the next leader's budget") {
  WhatIfInput in = four_equal(100, {});
  const double step = plan_for_policy(in.planner, Policy::deadline, 0).predicted.step_seconds;
  // Step 10: the members send at one step, wait 2 budgets (1.5 steps each) and 20 ms, then
  // rank 1 leads and waits a budget for rank 0; step 11 it waits a budget again
  // (kDeadlineWaitedSteps), then closes without it at each step's end: 4.5 + 0.5 steps
  // and the 20 ms more than the plain run. The stall ends as step 30 begins (then at
  // 35 steps and 20 ms), so its return is waited for no longer than any step.
  const double at = 10.5 * step, lost = 5 * step + kDeadlinePatienceSeconds;
  in.events = {parse_what_if_event("stall:rank=0,at=" + std::to_string(at) + ",for=" +
                                   std::to_string(30 * step + lost - at))};
  const PolicyOutcome deadline = outcome(run_what_if(in), Policy::deadline);
  REQUIRE(deadline.refused.empty());
  CHECK(deadline.lost_seconds == doctest::Approx(lost));
  REQUIRE(!deadline.notes.empty());
  CHECK(contains(deadline.notes[0], "the leader (rank 0) fell silent at step 10: rank 1 leads from then on"));
  // A member's stall costs no patience: kDeadlineWaitedSteps half-steps.
  const double member_lost = kDeadlineWaitedSteps * 0.5 * step;
  in.events = {parse_what_if_event("stall:rank=2,at=" + std::to_string(at) + ",for=" +
                                   std::to_string(30 * step + member_lost - at))};
  const PolicyOutcome member = outcome(run_what_if(in), Policy::deadline);
  CHECK(member.lost_seconds == doctest::Approx(member_lost));
  CHECK(member.notes.empty());
}

namespace {

// `n` ranks of one kind under a CPU quota of 0.2 (each wakes 3.2 ms late to every message,
// plan_costs.h's wake_seconds) on free links, the MLP's costs, `per` samples a rank.
WhatIfInput throttled(size_t n, int64_t per, int64_t steps) {
  ClusterModel c = fx::cluster(std::vector<double>(n, 2e12), std::vector<double>(n, 64 * fx::kGiB));
  for (DeviceModel& d : c.ranks) {
    d.id = std::string("C");
    d.name = d.id;
    d.cpu_quota = 0.2;
    d.cpu_quota_period_s = 0.01;
  }
  WhatIfInput in;
  in.planner = fx::input(c, fx::mlp_costs(c), static_cast<int64_t>(n) * per);
  in.steps = steps;
  return in;
}

}  // namespace

TEST_CASE("what-if's local at 64 throttled ranks: synchronous groups of the class, at most kMaxRoundSteps, not 64 alone") {
  const WhatIfInput in = throttled(64, 2, 200);
  const Plan sync = make_plan(in.planner);
  // The group search leaves each rank alone (its share takes less than the all-reduce's
  // wakes), so the asked local plan has 64 groups and a round of at least 64 steps.
  const Plan asked = *local_plan_for(in.planner, sync, Policy::local, 0);
  REQUIRE(asked.local->groups.size() == 64);
  CHECK(asked.local->inner_steps >= 64);
  const LocalPlanResult bounded = bounded_local_plan(in.planner, sync, 0);
  REQUIRE(bounded.plan);
  const Plan& p = *bounded.plan;
  check_local_plan(p);
  const size_t groups = p.local->groups.size();
  CHECK(groups >= 1);
  CHECK(groups <= static_cast<size_t>(kMaxRoundSteps));
  CHECK(p.local->inner_steps <= kMaxRoundSteps);
  // k runs of the one class for a power of two k: 64 / k ranks each, every rank in one.
  CHECK(64 % groups == 0);
  std::vector<int> seen;
  for (int g = 0; g < static_cast<int>(groups); ++g) {
    const std::vector<int> ranks = group_ranks(p, g);
    CHECK(ranks.size() == 64 / groups);
    seen.insert(seen.end(), ranks.begin(), ranks.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(64);
  for (int r = 0; r < 64; ++r) all[static_cast<size_t>(r)] = r;
  CHECK(seen == all);
  // The what-if plays it, and says what it played.
  const PolicyOutcome local = outcome(run_what_if(in), Policy::local);
  REQUIRE(local.refused.empty());
  CHECK(local.groups == static_cast<int>(groups));
  CHECK(local.inner_steps == p.local->inner_steps);
  const std::string each = std::to_string(64 / groups) + " C";
  CHECK(local.plan_shape == std::to_string(groups) + (groups == 1 ? " group (" + each : " groups (" + std::to_string(groups) + " x " + each) +
                                "), H " + std::to_string(p.local->inner_steps));
  CHECK(local.step_seconds == doctest::Approx(p.predicted.step_seconds));
}

TEST_CASE("what-if's local is refused, with the reason, where every round needs more than kMaxRoundSteps steps") {
  // Two ranks of two kinds behind a 1 MB/s link: the outer exchange of the MLP's 2.6 MB
  // takes seconds against inner steps of milliseconds, so every round needs hundreds.
  const ClusterModel c = fx::cluster({8e12, 4e12}, {64 * fx::kGiB, 64 * fx::kGiB}, 1e-3, 1e6);
  WhatIfInput in;
  in.planner = fx::input(c, fx::mlp_costs(c), 128);
  in.steps = 100;
  const Plan sync = make_plan(in.planner);
  const Plan asked = *local_plan_for(in.planner, sync, Policy::local, 0);
  REQUIRE(asked.local->groups.size() == 2);
  const int h = asked.local->inner_steps;
  CHECK(h > kMaxRoundSteps);
  const std::string why = "the group search's 2 groups need rounds of " + std::to_string(h) +
                          " steps, more than kMaxRoundSteps 32; as synchronous groups of one class each, a round "
                          "needs at least " + std::to_string(h) + " inner steps (at 2 groups), more than kMaxRoundSteps 32";
  const LocalPlanResult bounded = bounded_local_plan(in.planner, sync, 0);
  CHECK_FALSE(bounded.plan);
  CHECK(bounded.problem == why);
  const PolicyOutcome local = outcome(run_what_if(in), Policy::local);
  CHECK(local.refused == "no local plan within a round of 32 steps: " + why);
  CHECK(local.plan_shape.empty());
  // parallel.local_steps above the bound is refused by name.
  const PlannerInput many = throttled(64, 2, 1).planner;
  CHECK(bounded_local_plan(many, make_plan(many), 40).problem ==
        "parallel.local_steps 40 is above kMaxRoundSteps 32, the longest round auto takes");
}

TEST_CASE("deadline: a stopped member's own copies of the gradient leave the steps it misses") {
  // Rank 3 copies slowly (its memory bandwidth), so its two copies a step are a good part
  // of every step's reduction; while it is stopped the others' steps close without them.
  WhatIfInput in = four_equal(300, {"stall:rank=3,at=2,for=5"});
  const double fast = 1e12;
  for (size_t r = 0; r < 4; ++r) in.planner.cluster.ranks[r].memory_bandwidth = fast;
  Plan probe = plan_for_policy(in.planner, Policy::deadline, 0);
  const auto [begin, end] = probe.stage_ranges[0];
  const double bytes = ht::plan::stage_footprint(in.planner.costs, begin, end).params * kGradBytesPerParam;
  REQUIRE(bytes > 0);
  // Its copies: about half the step it had with fast copies.
  in.planner.cluster.ranks[3].memory_bandwidth = 4 * bytes / (0.5 * probe.predicted.step_seconds);
  const Plan plan = plan_for_policy(in.planner, Policy::deadline, 0);
  const double copy = deadline_member_copy_seconds(plan, plan.layout, in.planner.costs, 0,
                                                   static_cast<size_t>(plan.ranks[3].replica));
  REQUIRE(copy > 0.3 * plan.predicted.step_seconds);
  const PolicyOutcome d = outcome(run_what_if(in), Policy::deadline);
  REQUIRE(d.refused.empty());
  const double step = d.step_seconds, S = 5;
  // Charged its copies while stopped, the others would close about S / step steps short;
  // without them each step is shorter by about `copy`, and never shorter than a rank's
  // compute.
  const SimResult sim = simulate_plan(plan, in.planner.costs, in.planner.cluster);
  const double busy = *std::max_element(sim.busy_seconds.begin(), sim.busy_seconds.begin() + 3);
  CAPTURE(step);
  CAPTURE(copy);
  CAPTURE(busy);
  CHECK(static_cast<double>(d.steps_closed_short) > S / step + 2);
  CHECK(static_cast<double>(d.steps_closed_short) > S / (step - copy) - kDeadlineWaitedSteps - 1);
  CHECK(static_cast<double>(d.steps_closed_short) <= S / busy + kDeadlineWaitedSteps + 2);
}

TEST_CASE("deadline on a hybrid plan: a stalled rank's replica is left out of every stage, its share dropped") {
  // No rank but rank 0 holds the whole model's 96 MB of weight state, so no data-parallel
  // plan fits without sharding it, which deadline refuses: auto plans replicas of pipelines.
  const ClusterModel c = fx::cluster({2e13, 2e13, 1e13, 1e13}, {64 * fx::kGiB, 80e6, 80e6, 80e6}, 1e-4, 5e8);
  WhatIfInput in;
  in.planner = fx::input(c, fx::costs(c, 6), 128);
  in.steps = 200;
  in.checkpoint_every = 10;
  in.deadline_slack = 0.5;
  const Plan plan = plan_for_policy(in.planner, Policy::deadline, 0);
  REQUIRE(plan.strategy == Strategy::hybrid);
  REQUIRE(plan.layout.replicas.size() == 2);
  const double step = plan.predicted.step_seconds, S = 40 * step;
  // The last stage of the replica without rank 0: its pipeline holds the replica's every rank.
  const int stalled = plan.layout.replicas[1].back();
  in.events = {parse_what_if_event("stall:rank=" + std::to_string(stalled) + ",at=" + std::to_string(20.5 * step) +
                                   ",for=" + std::to_string(S))};
  check_what_if_events(in.events, c.ranks.size(), Catalogue{});
  const WhatIfResult r = run_what_if(in);
  const PolicyOutcome sync = outcome(r, Policy::sync);
  CHECK(sync.lost_seconds >= S - 1e-9);
  const PolicyOutcome deadline = outcome(r, Policy::deadline);
  REQUIRE(deadline.refused.empty());
  CHECK(deadline.notes.empty());  // neither "waits as sync does" nor a silent leader
  // The other replica goes on: S / step steps closed short without replica 1, each
  // dropping its share once (not once per stage), at most the waited steps' slack lost.
  CHECK(deadline.lost_seconds >= -1e-9);
  CHECK(deadline.lost_seconds <= (kDeadlineWaitedSteps + 1) * in.deadline_slack * step + 1e-9);
  CHECK(static_cast<double>(deadline.steps_closed_short) >= S / step - kDeadlineWaitedSteps - 1);
  CHECK(static_cast<double>(deadline.steps_closed_short) <= S / step + 1);
  CHECK(deadline.samples_dropped == deadline.steps_closed_short * plan.layout.samples[1]);
  // Both ranks of that replica fail, one after the other: each is named, both are gone (the
  // second, of a replica already out, was never taken: no note, and left due it held every
  // later step from the fast path).
  in.events.clear();
  for (size_t k = 0; k < plan.layout.replicas[1].size(); ++k)
    in.events.push_back(parse_what_if_event("fail:rank=" + std::to_string(plan.layout.replicas[1][k]) +
                                            ",at=" + std::to_string((20.5 + 10 * static_cast<double>(k)) * step)));
  const PolicyOutcome failing = outcome(run_what_if(in), Policy::deadline);
  REQUIRE(failing.refused.empty());
  for (const WhatIfEvent& e : in.events)
    CHECK(std::count_if(failing.notes.begin(), failing.notes.end(), [&](const std::string& n) {
            return n.rfind(e.spec + ": left out from step ", 0) == 0;
          }) == 1);
  // A pure pipeline has no stand-in: it waits as sync does, and says so.
  WhatIfInput two = in;
  const ClusterModel pair = fx::cluster({1e13, 1e13}, std::vector(2, 64 * fx::kGiB), 1e-4, 2e8);
  two.planner = fx::input(pair, fx::costs(pair, 4, 1e6, 4096), 64, "pipeline");
  REQUIRE(plan_for_policy(two.planner, Policy::deadline, 0).strategy == Strategy::pipeline);
  two.events = {parse_what_if_event("stall:rank=1,at=1,for=5")};
  const PolicyOutcome piped = outcome(run_what_if(two), Policy::deadline);
  REQUIRE(!piped.notes.empty());
  CHECK(contains(piped.notes[0], "a pipeline has no stand-in for a stalled stage"));
  CHECK(piped.lost_seconds >= 5 - 1e-9);
}

TEST_CASE("sync: an idle rank's stall holds the job at the second log exchange after it begins, or at the end") {
  // Rank 1 a thousand times slower: sync's plan trains on rank 0 alone.
  const ClusterModel c = fx::cluster({1e11, 1e8}, {8 * fx::kGiB, 8 * fx::kGiB}, 1e-5, 1e10);
  WhatIfInput in;
  in.planner = fx::input(c, fx::costs(c, 4), 8);
  in.steps = 200;
  in.log_every = 10;
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  REQUIRE(plan.ranks[1].replica < 0);
  const double s = plan.predicted.step_seconds;
  const auto lost = [&](double at_steps, double for_steps) {
    in.events = {parse_what_if_event("stall:rank=1,at=" + std::to_string(at_steps * s) +
                                     ",for=" + std::to_string(for_steps * s))};
    return outcome(run_what_if(in), Policy::sync).lost_seconds / s;
  };
  // Begun in step 13: log step 20's exchange (finished after step 21) has its item; log
  // step 30's (after step 31) waits for the stall's end at step 42.5.
  CHECK(lost(12.5, 30) == doctest::Approx(11.5).epsilon(1e-6));
  CHECK(lost(12.5, 10) == doctest::Approx(0).epsilon(1e-6));  // over by step 22.5
  CHECK(lost(195.5, 20) == doctest::Approx(15.5).epsilon(1e-6));  // the job's end waits
  in.checkpoint_every = 25;  // a checkpoint (step 25) comes before step 31: it waits there
  CHECK(lost(12.5, 30) == doctest::Approx(42.5 - 25).epsilon(1e-6));
  // A failure while the job waits there: the checkpoint of step 25 was not written, so the
  // restart is from step 0's, at the failure's time.
  in.events = {parse_what_if_event("stall:rank=1,at=" + std::to_string(12.5 * s) + ",for=" + std::to_string(30 * s)),
               parse_what_if_event("fail:rank=0,at=" + std::to_string(30 * s))};
  const PolicyOutcome failed = outcome(run_what_if(in), Policy::sync);
  CHECK(failed.work_lost_steps == 25);
  CHECK(failed.work_lost_seconds == doctest::Approx(30 * s + kRestartSeconds));
}
