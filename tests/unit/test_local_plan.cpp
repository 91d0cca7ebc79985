// parallel.sync local in the planner (plan/local_plan.h) on hand-built clusters: which
// ranks form groups, the groups' shares, H, the predicted gain, when auto takes it, the
// groups' sub-plans and the plan file.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"
#include "tests/unit/plan_fixtures.h"

#include <numeric>
#include <nlohmann/json.hpp>

#include "plan/local_plan.h"
#include "plan/plan_json.h"
#include "plan/planner.h"
#include "report/local_sync_text.h"

using namespace ht;
using namespace ht::plan;
using namespace ht::plan::fixtures;

namespace {

// 4/2/1/1 speeds; ranks 1-3 under CPU quotas 0.4/0.2/0.2 of a 10 ms period, as
// tools/hetero-local runs them: each wakes late to every message (plan_costs.h's
// wake_seconds: 1.8, 3.2 and 3.2 ms), so their all-reduce costs more than they add.
ClusterModel throttled() {
  ClusterModel c = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB), 20e-6, 5e9);
  const double quota[] = {0, 0.4, 0.2, 0.2};
  for (size_t r = 0; r < 4; ++r) {
    c.ranks[r].cpu_quota = quota[r];
    c.ranks[r].cpu_quota_period_s = 0.01;
    c.ranks[r].memory_bandwidth = 10e9;
  }
  return c;
}

// The MLP's size: 2 blocks of 3.3e5 parameters, 47 us per sample each on rank 0 (its
// 64 samples take 6 ms, as the MLP's do at quota 0.8).
BlockCosts small_model(const ClusterModel& c) {
  BlockCosts k = costs(c, 2);
  for (size_t b = 0; b < 2; ++b) {
    k.params[b] = 3.3e5;
    k.state_bytes[b] = 3.3e5 * 16;
  }
  for (size_t r = 0; r < c.ranks.size(); ++r)
    for (double& s : k.seconds_per_sample[r]) s = 47e-6 * 8e12 / c.ranks[r].flops;
  return k;
}

}  // namespace

TEST_CASE("local plan: throttled 4/2/1/1 ranks step alone, shares follow speed, gain over sync") {
  const ClusterModel c = throttled();
  const PlannerInput in = input(c, small_model(c), 128);
  const Plan sync = make_plan(in);
  const std::optional<Plan> chosen = local_plan_for(in, sync, std::nullopt, 0);
  REQUIRE(chosen);  // auto takes local: the synchronous plan leaves ranks idle or starved
  const Plan& p = *chosen;
  check_plan(p);
  CHECK(p.sync_policy == "local");
  REQUIRE(p.local);
  CHECK(p.local->groups == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
  // In proportion to speed (64/32/16/16) up to what the per-call costs move, and the
  // groups' predicted steps end together, within one sample of the slowest rank.
  const double speed[] = {8, 4, 2, 2};
  double slowest = 0, latest = 0;
  std::vector<double> steps;
  for (int g = 0; g < 4; ++g) {
    CHECK(std::abs(static_cast<double>(p.layout.samples[static_cast<size_t>(g)]) - 128 * speed[g] / 16) <= 2);
    Plan sub = group_plan(p, g);
    predict_plan(sub, costs_of(in.costs, {g}), cluster_of(c, {g}));
    steps.push_back(sub.predicted.step_seconds);
    latest = std::max(latest, sub.predicted.step_seconds);
    slowest = std::max(slowest, in.costs.seconds_per_sample[static_cast<size_t>(g)][0] * 2);
  }
  for (double t : steps) CHECK(t >= latest - slowest);
  CHECK(std::accumulate(p.layout.samples.begin(), p.layout.samples.end(), int64_t{0}) == p.global_batch);
  CHECK(p.local->inner_steps >= 1);
  // The exchange hides: a round is at least kHideFactor exchanges long.
  CHECK(p.local->inner_steps * p.predicted.step_seconds >= kHideFactor * p.local->outer_exchange_seconds * 0.999);
  CHECK(p.local->gain > 1 + kLocalMinGain);
  CHECK(p.local->sync_step_seconds == doctest::Approx(sync.predicted.step_seconds));
  CHECK(p.predicted.samples_per_s == doctest::Approx(128 / p.predicted.step_seconds));
  // Each group is its own one-rank plan, the executor's unit.
  for (int g = 0; g < 4; ++g) {
    const Plan sub = group_plan(p, g);
    check_plan(sub);
    CHECK(sub.world_size == 1);
    CHECK(sub.global_batch == p.layout.samples[static_cast<size_t>(g)]);
    CHECK(group_ranks(p, g) == std::vector<int>{g});
    CHECK(group_of_rank(p, g) == g);
  }
  CHECK(group_offset(p, 0) == 0);
  CHECK(group_offset(p, 2) == 96);
  const std::string text = report::local_sync_text(p);
  CHECK(text.find("4 groups") != std::string::npos);
  CHECK(text.find("group 3: rank 3, 16 samples a step") != std::string::npos);
}

TEST_CASE("local plan: ranks on free links form one synchronous group; auto keeps sync there") {
  const ClusterModel c = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB));
  const PlannerInput in = input(c, costs(c, 4), 128);
  const Plan sync = make_plan(in);
  CHECK_FALSE(local_plan_for(in, sync, std::nullopt, 0));
  CHECK_FALSE(local_plan_for(in, sync, config::SyncPolicy::sync, 0));
  const std::optional<Plan> asked = local_plan_for(in, sync, config::SyncPolicy::local, 0);
  REQUIRE(asked);
  CHECK(asked->local->groups == std::vector<std::vector<int>>{{0, 1, 2, 3}});
  CHECK(asked->local->inner_steps == 1);  // nothing to exchange between groups
  const Plan sub = group_plan(*asked, 0);
  CHECK(sub.world_size == 4);
  CHECK(sub.layout.samples == std::vector<int64_t>{64, 32, 16, 16});
}

TEST_CASE("local plan: parallel.local_steps sets H; a slower link needs a larger H") {
  ClusterModel c = throttled();
  const PlannerInput in = input(c, small_model(c), 128);
  const Plan sync = make_plan(in);
  CHECK(local_plan_for(in, sync, config::SyncPolicy::local, 7)->local->inner_steps == 7);
  const int h = local_plan_for(in, sync, config::SyncPolicy::local, 0)->local->inner_steps;
  for (size_t r = 0; r < 4; ++r) {  // rank 3 behind 50 ms and 50 Mbit/s
    c.latency_s[r][3] = c.latency_s[3][r] = r == 3 ? 0 : 0.05;
    c.bandwidth_bytes_per_s[r][3] = c.bandwidth_bytes_per_s[3][r] = r == 3 ? 0 : 50e6 / 8;
  }
  const PlannerInput slow = input(c, small_model(c), 128);
  const std::optional<Plan> p = local_plan_for(slow, make_plan(slow), config::SyncPolicy::local, 0);
  REQUIRE(p);
  CHECK(p->local->inner_steps > h);
  CHECK(p->local->inner_steps * p->predicted.step_seconds >= kHideFactor * p->local->outer_exchange_seconds * 0.999);
}

TEST_CASE("local plan: the plan file carries the groups and refuses inconsistent ones") {
  const ClusterModel c = throttled();
  const PlannerInput in = input(c, small_model(c), 128);
  const Plan p = *local_plan_for(in, make_plan(in), config::SyncPolicy::local, 0);
  const std::string text = plan_to_json(p);
  const Plan back = plan_from_json(text, "plan.json");
  REQUIRE(back.local);
  CHECK(back.local->groups == p.local->groups);
  CHECK(back.local->inner_steps == p.local->inner_steps);
  CHECK(back.local->gain == doctest::Approx(p.local->gain));

  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  j.erase("local");
  CHECK(error_of([&] { plan_from_json(j.dump(), "plan.json"); }).find("local") != std::string::npos);
  j = nlohmann::ordered_json::parse(text);
  j["local"]["groups"] = {{0, 1}, {3}};
  CHECK(error_of([&] { plan_from_json(j.dump(), "plan.json"); }).find("replica 3 where 2 was expected") !=
        std::string::npos);
  j["local"]["groups"] = {{0, 1}, {2}};
  CHECK(error_of([&] { plan_from_json(j.dump(), "plan.json"); }).find("3 of the 4 replicas") != std::string::npos);
  j = nlohmann::ordered_json::parse(text);
  j["local"]["inner_steps"] = 0;
  CHECK(error_of([&] { plan_from_json(j.dump(), "plan.json"); }).find("inner_steps") != std::string::npos);
}

TEST_CASE("local plan: a rank whose one-sample step outlasts the others' shares is left idle") {
  ClusterModel c = throttled();
  BlockCosts k = small_model(c);
  for (double& s : k.seconds_per_sample[3]) s *= 400;  // 19 ms a sample: longer than rank 0's 64
  const PlannerInput in = input(c, k, 128);
  const std::optional<Plan> p = local_plan_for(in, make_plan(in), config::SyncPolicy::local, 0);
  REQUIRE(p);
  check_plan(*p);
  CHECK(p->ranks[3].replica == -1);
  CHECK(p->ranks[3].samples == 0);
  CHECK(group_of_rank(*p, 3) == -1);
  CHECK(p->local->groups == std::vector<std::vector<int>>{{0}, {1}, {2}});
  CHECK(std::accumulate(p->layout.samples.begin(), p->layout.samples.end(), int64_t{0}) == 128);
}

TEST_CASE("local plan: the outer synchronisation is every rank's list, and the simulator charges it") {
  ClusterModel c = throttled();
  for (size_t r = 0; r < 4; ++r) {  // rank 3 behind 50 ms and 50 Mbit/s
    c.latency_s[r][3] = c.latency_s[3][r] = r == 3 ? 0 : 0.05;
    c.bandwidth_bytes_per_s[r][3] = c.bandwidth_bytes_per_s[3][r] = r == 3 ? 0 : 50e6 / 8;
  }
  const PlannerInput in = input(c, small_model(c), 128);
  const Plan sync = make_plan(in);
  const Plan hidden = *local_plan_for(in, sync, config::SyncPolicy::local, 0);
  const Plan exposed = *local_plan_for(in, sync, config::SyncPolicy::local, 1);
  for (const Plan* p : {&hidden, &exposed}) {
    const std::vector<Schedule> lists = outer_sync_schedules(*p);
    REQUIRE(lists.size() == 4);
    for (const Schedule& s : lists) {
      REQUIRE(s.size() == 2);
      CHECK(s[0].op == Op::outer_sync_finish);
      CHECK(s[1].op == Op::outer_sync_start);
    }
  }
  // H = 1 cannot hide the exchange: each step pays what one step does not cover.
  double inner = 0;
  for (int g = 0; g < static_cast<int>(exposed.local->groups.size()); ++g) {
    const std::vector<int> ranks = group_ranks(exposed, g);
    Plan sub = group_plan(exposed, g);
    predict_plan(sub, costs_of(in.costs, ranks), cluster_of(c, ranks));
    inner = std::max(inner, sub.predicted.step_seconds);
  }
  const SimResult outer = simulate(outer_sync_schedules(exposed), outer_sync_cost_model(exposed, in.costs, c, inner));
  CHECK(outer.step_seconds >= exposed.local->outer_exchange_seconds - inner);
  CHECK(exposed.predicted.step_seconds == doctest::Approx(inner + outer.step_seconds));
  CHECK(exposed.predicted.step_seconds >= exposed.local->outer_exchange_seconds);
  // Chosen H hides it: the round outlasts the exchange, and the step is the inner step
  // plus the outer update spread over the round.
  CHECK(hidden.local->inner_steps * hidden.predicted.step_seconds >= hidden.local->outer_exchange_seconds);
  CHECK(hidden.predicted.step_seconds < exposed.predicted.step_seconds);
}
