// The what-if simulator (plan/what_if.h) on hand-built clusters: what each event costs
// each policy, from the plans' own predicted steps, and the event specs' errors.
#include <doctest/doctest.h>

#include <cmath>

#include "config/config.h"
#include "error_message.h"
#include "plan/local_plan.h"
#include "plan/what_if.h"
#include "plan_fixtures.h"

using namespace ht::plan;
namespace fx = ht::plan::fixtures;
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

TEST_CASE("a slow rank under deadline drops its samples every step; sync waits for it") {
  const WhatIfInput in = four_equal(50, {"slow:rank=3,at=0,factor=4"});
  const WhatIfResult r = run_what_if(in);
  const PolicyOutcome deadline = outcome(r, Policy::deadline);
  REQUIRE(deadline.refused.empty());
  // Its part is 4x the others' compute, beyond 1.5x the step: late every step, and waited
  // for (it sends), so every step closes at its budget.
  CHECK(deadline.steps_closed_short == 50);
  CHECK(deadline.samples_dropped == 50 * 2);
  CHECK(deadline.seconds == doctest::Approx(50 * deadline.step_seconds * (1 + in.deadline_slack)));
  const PolicyOutcome sync = outcome(r, Policy::sync);
  CHECK(sync.samples_dropped == 0);
  CHECK(sync.lost_seconds > 0);
}

TEST_CASE("a link event re-simulates the step on the changed cluster from its time on") {
  const WhatIfInput in = four_equal(40, {"link:ranks=0-1,at=0,latency=20,bandwidth=1"});
  const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  ClusterModel changed = in.planner.cluster;
  changed.latency_s[0][1] = changed.latency_s[1][0] = 0.020;
  changed.bandwidth_bytes_per_s[0][1] = changed.bandwidth_bytes_per_s[1][0] = 1e6;
  const double slow_step = simulate_plan(plan, in.planner.costs, changed).step_seconds;
  CHECK(slow_step > plan.predicted.step_seconds);
  CHECK(sync.seconds == doctest::Approx(40 * slow_step));
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

TEST_CASE("what-if event specs: one-line errors naming the spec, the field, the value and what was expected") {
  const auto err = [](const std::string& spec) { return error_of([&] { parse_what_if_event(spec); }); };
  CHECK(err("hang:rank=1") == "what-if event hang:rank=1: unknown kind 'hang'; expected stall, slow, fail, link or "
                              "join (e.g. stall:rank=1,at=10,for=5)");
  CHECK(err("stall:rank=1,at=5") == "what-if event stall:rank=1,at=5: missing for; expected stall:rank=...,at=...,for=...");
  CHECK(err("stall:rank=x,at=5,for=5") ==
        "what-if event stall:rank=x,at=5,for=5: rank=x is not a rank; expected an integer of at least 0");
  CHECK(err("stall:rank=1,at=5,for=0") ==
        "what-if event stall:rank=1,at=5,for=0: for=0 is out of range; expected seconds, above 0");
  CHECK(err("slow:rank=1,at=5,factor=0.5") == "what-if event slow:rank=1,at=5,factor=0.5: factor=0.5 is out of range; "
                                              "expected a compute-time multiplier of at least 1 (2: twice as slow)");
  CHECK(err("fail:rank=1,at=-2") ==
        "what-if event fail:rank=1,at=-2: at=-2 is out of range; expected seconds of job time, at least 0");
  CHECK(err("fail:rank=1,at=2,for=3") ==
        "what-if event fail:rank=1,at=2,for=3: unknown field 'for' for fail; expected rank and at");
  CHECK(err("link:ranks=3,at=1,latency=1,bandwidth=10") ==
        "what-if event link:ranks=3,at=1,latency=1,bandwidth=10: ranks=3 is not a rank pair; expected A-B, the two "
        "ranks the link joins (e.g. 0-3)");
  CHECK(err("link:ranks=0-1,at=1,latency=1,bandwidth=0") ==
        "what-if event link:ranks=0-1,at=1,latency=1,bandwidth=0: bandwidth=0 is out of range; expected the "
        "bandwidth in MB/s (1 MB = 1e6 bytes), above 0");
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
  cat.devices.push_back(CatalogueDevice{"rtx3060", "RTX 3060"});
  cat.devices.push_back(CatalogueDevice{"a100-40g", "A100"});
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
  in.catalogue_path = default_catalogue_path();
  const Plan plan = plan_for_policy(in.planner, Policy::sync, 0);
  const double step = plan.predicted.step_seconds;
  in.events = {parse_what_if_event("join:device=cpu-16c,at=" + std::to_string(5.5 * step))};
  // The model's shapes for the joined rank's block costs: the fixture's four blocks.
  for (size_t b = 0; b < 4; ++b) {
    ht::nn::BlockShape shape;
    shape.params = 1000000;
    shape.flops_per_sample = 1000000000;
    shape.activation_bytes_per_sample = 1000000;
    in.model.blocks.push_back(shape);
  }
  const PolicyOutcome sync = outcome(run_what_if(in), Policy::sync);
  REQUIRE(sync.refused.empty());
  REQUIRE(sync.notes.size() == 1);
  CHECK(contains(sync.notes[0], "joined at the checkpoint of step 10"));
  ClusterModel five = in.planner.cluster;
  const DeviceModel cpu = cluster_from_synth("synth:1xcpu-16c", in.catalogue_path).ranks[0];
  for (auto& row : five.latency_s) row.push_back(1e-5);
  for (auto& row : five.bandwidth_bytes_per_s) row.push_back(1e10);
  five.ranks.push_back(cpu);
  five.latency_s.push_back({1e-5, 1e-5, 1e-5, 1e-5, 0});
  five.bandwidth_bytes_per_s.push_back({1e10, 1e10, 1e10, 1e10, 0});
  PlannerInput bigger = in.planner;
  bigger.cluster = five;
  bigger.costs = block_costs(in.model, five, in.optimizer);
  const double step5 = plan_for_policy(bigger, Policy::sync, 0).predicted.step_seconds;
  CHECK(sync.seconds == doctest::Approx(10 * step + kRestartSeconds + 90 * step5));
  CHECK(sync.work_lost_steps == 0);
}
