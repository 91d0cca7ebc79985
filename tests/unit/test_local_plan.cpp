// parallel.sync local in the planner (plan/local_plan.h) on hand-built clusters: which
// ranks form groups, the groups' shares, H, the predicted gain, when auto takes it, the
// groups' sub-plans and the plan file.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"
#include "tests/unit/plan_fixtures.h"
#include "tests/unit/source_root.h"

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

using ht::test_fixtures::source_root;

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

// Each group's inner step predicted on its own, one global batch.
std::vector<double> group_step_seconds(const Plan& p, const BlockCosts& k, const ClusterModel& c) {
  std::vector<double> out;
  for (int g = 0; g < static_cast<int>(p.local->groups.size()); ++g) {
    const std::vector<int> ranks = group_ranks(p, g);
    Plan sub = group_plan(p, g);
    predict_plan(sub, costs_of(k, ranks), cluster_of(c, ranks));
    out.push_back(sub.predicted.step_seconds);
  }
  return out;
}

// The H_g check shared by the cases below: at least one each, summing to H, and no
// group's round shortened by moving one of its steps to another group (the integer
// split that ends the latest group's round earliest).
void check_group_steps(const Plan& p, const std::vector<double>& step) {
  const std::vector<int>& h = p.local->group_steps;
  REQUIRE(h.size() == step.size());
  CHECK(std::accumulate(h.begin(), h.end(), 0) == p.local->inner_steps);
  double latest = 0;
  for (size_t g = 0; g < h.size(); ++g) {
    CHECK(h[g] >= 1);
    latest = std::max(latest, h[g] * step[g]);
  }
  for (size_t from = 0; from < h.size(); ++from)
    for (size_t to = 0; to < h.size(); ++to)
      if (from != to && h[from] > 1 && h[from] * step[from] == latest)
        CHECK((h[to] + 1) * step[to] >= latest * (1 - 1e-12));
}

TEST_CASE("local plan: throttled 4/2/1/1 ranks step alone, inner steps follow speed, gain over sync") {
  const ClusterModel c = throttled();
  const PlannerInput in = input(c, small_model(c), 128);
  const Plan sync = make_plan(in);
  const std::optional<Plan> chosen = local_plan_for(in, sync, std::nullopt, 0);
  REQUIRE(chosen);  // auto takes local: the synchronous plan leaves ranks idle or starved
  const Plan& p = *chosen;
  check_plan(p);
  CHECK(p.sync_policy == plan::SyncPolicy::local);
  REQUIRE(p.local);
  CHECK(p.local->groups == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
  // Every group's inner step is the whole global batch; the round's H batches go to the
  // groups in proportion to speed (choose_round_steps, tested below, picks H).
  for (int g = 0; g < 4; ++g) CHECK(p.layout.samples[static_cast<size_t>(g)] == 128);
  const std::vector<double> step = group_step_seconds(p, in.costs, c);
  check_group_steps(p, step);
  const int h = p.local->inner_steps;
  double rate = 0, latest = 0;
  for (double t : step) rate += 1 / t;
  for (size_t g = 0; g < 4; ++g) latest = std::max(latest, p.local->group_steps[g] * step[g]);
  CHECK(latest <= 1.25 * h / rate);  // 4/2/1/1: no count up to kMaxRoundSteps is worse
  CHECK(h <= kMaxRoundSteps);
  // The exchange hides: a round is at least kHideFactor exchanges long.
  CHECK(h * p.predicted.step_seconds >= kHideFactor * p.local->outer_exchange_seconds * 0.999);
  CHECK(p.local->gain > 1 + kLocalMinGain);
  CHECK(p.local->sync_step_seconds == doctest::Approx(sync.predicted.step_seconds));
  CHECK(p.predicted.samples_per_s == doctest::Approx(128 / p.predicted.step_seconds));
  // Each group is its own one-rank plan, the executor's unit.
  for (int g = 0; g < 4; ++g) {
    const Plan sub = group_plan(p, g);
    check_plan(sub);
    CHECK(sub.world_size == 1);
    CHECK(sub.global_batch == 128);
    CHECK(group_ranks(p, g) == std::vector<int>{g});
    CHECK(group_of_rank(p, g) == g);
  }
  CHECK(group_first_step(p, 0) == 0);
  CHECK(group_first_step(p, 2) == p.local->group_steps[0] + p.local->group_steps[1]);
  double parts = 0;
  for (int r = 0; r < 4; ++r) parts += round_weight(p, r);
  CHECK(parts == doctest::Approx(1));
  const std::string text = report::local_sync_text(p);
  CHECK(text.find("4 groups") != std::string::npos);
  CHECK(text.find("group 3: rank 3, 128 samples a step, " + std::to_string(p.local->group_steps[3]) + " of the " +
                  std::to_string(h) + " steps a round") != std::string::npos);
}

// The fixed cluster file of the e2e tests (speeds 4/2/1/1), its links made 5 ms slow so
// that every rank's all-reduce outlasts what it adds and each steps alone.
ClusterModel fixed_4_2_1_1() {
  ClusterModel c = load_cluster_model((source_root() / "tests/e2e/clusters/cpu_4_2_1_1.json").string(),
                                      (source_root() / "configs/devices.json").string());
  for (auto& row : c.latency_s)
    for (double& l : row) l = l > 0 ? 5e-3 : 0;
  return c;
}

// small_model's costs at the file's speeds: 47 us per sample and block on rank 0.
BlockCosts fixed_model(const ClusterModel& c) {
  BlockCosts k = small_model(c);
  for (size_t r = 0; r < c.ranks.size(); ++r)
    for (double& s : k.seconds_per_sample[r]) s = 47e-6 * c.ranks[0].flops / c.ranks[r].flops;
  return k;
}

TEST_CASE("local plan: on the fixed 4/2/1/1 cluster file the groups' inner steps are 4/2/1/1 of every 8") {
  const ClusterModel c = fixed_4_2_1_1();
  BlockCosts k = fixed_model(c);
  const PlannerInput in = input(c, k, 128);
  for (int64_t h : {8, 16}) {
    const Plan p = *local_plan_for(in, make_plan(in), config::SyncPolicy::local, h);
    check_plan(p);
    REQUIRE(p.local->groups.size() == 4);  // asked for local: each rank alone at these speeds
    const int q = static_cast<int>(h / 8);
    CHECK(p.local->group_steps == std::vector<int>{4 * q, 2 * q, q, q});
    CHECK(p.local->inner_steps == h);
    check_group_steps(p, group_step_seconds(p, in.costs, c));
  }
  // Chosen H: an exact split of speeds 4/2/1/1 needs a multiple of 8.
  const Plan p = *local_plan_for(in, make_plan(in), config::SyncPolicy::local, 0);
  CHECK(p.local->inner_steps % 8 == 0);
  const int q = p.local->inner_steps / 8;
  CHECK(p.local->group_steps == std::vector<int>{4 * q, 2 * q, q, q});
  // Fewer steps a round than groups is refused, naming the setting.
  CHECK(error_of([&] { local_plan_for(in, make_plan(in), config::SyncPolicy::local, 3); })
            .find("parallel.local_steps 3 is below the plan's 4 local groups") != std::string::npos);
}

TEST_CASE("local plan: in every round the groups take disjoint global batches that cover it, each once") {
  const ClusterModel c = fixed_4_2_1_1();
  const PlannerInput in = input(c, fixed_model(c), 128);
  for (int64_t h : {4, 5, 8, 13}) {
    const Plan p = *local_plan_for(in, make_plan(in), config::SyncPolicy::local, h);
    CAPTURE(h);
    const int groups = static_cast<int>(p.local->groups.size());
    for (int64_t round = 0; round < 3; ++round) {
      std::vector<int> taken(static_cast<size_t>(h), 0);
      std::vector<int> per_group(static_cast<size_t>(groups), 0);
      for (int64_t step = round * h; step < (round + 1) * h; ++step)
        for (int g = 0; g < groups; ++g) {
          const std::vector<int64_t> b = local_batches(p, g, step);
          CHECK(b.size() <= 1);  // at most one inner step per job step
          for (int64_t batch : b) {
            REQUIRE(batch >= round * h);
            REQUIRE(batch < (round + 1) * h);
            ++taken[static_cast<size_t>(batch - round * h)];
            ++per_group[static_cast<size_t>(g)];
          }
        }
      CHECK(taken == std::vector<int>(static_cast<size_t>(h), 1));
      CHECK(per_group == p.local->group_steps);
    }
    // A group's batches are consecutive from its first, in step order (what a resume at
    // any step continues), and a one-step group takes its step at the round's start.
    for (int g = 0; g < groups; ++g) {
      int64_t next = group_first_step(p, g);
      for (int64_t step = 0; step < h; ++step)
        for (int64_t batch : local_batches(p, g, step)) CHECK(batch == next++);
      if (p.local->group_steps[static_cast<size_t>(g)] == 1) CHECK(local_batches(p, g, 0).size() == 1);
    }
  }
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
  CHECK(asked->local->group_steps == std::vector<int>{1});
}

TEST_CASE("local plan: parallel.local_steps sets H; a slower link needs a larger H") {
  ClusterModel c = throttled();
  const PlannerInput in = input(c, small_model(c), 128);
  const Plan sync = make_plan(in);
  CHECK(local_plan_for(in, sync, config::SyncPolicy::local, 7)->local->inner_steps == 7);
  CHECK(local_plan_for(in, sync, config::SyncPolicy::local, 7)->local->group_steps.size() == 4);
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
  CHECK(back.local->group_steps == p.local->group_steps);
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
  j = nlohmann::ordered_json::parse(text);
  j["local"]["group_steps"][0] = j["local"]["group_steps"][0].get<int>() + 1;
  CHECK(error_of([&] { plan_from_json(j.dump(), "plan.json"); }).find("inner steps sum to") != std::string::npos);
  j = nlohmann::ordered_json::parse(text);
  j["layout"]["samples"][0] = 127;
  j["ranks"][0]["samples"] = 127;
  CHECK(error_of([&] { plan_from_json(j.dump(), "plan.json"); }).find("group 0's replicas take 127 samples") !=
        std::string::npos);
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
  CHECK(p->layout.samples == std::vector<int64_t>{128, 128, 128});  // each group's step: the whole batch
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
  const Plan exposed = *local_plan_for(in, sync, config::SyncPolicy::local, 4);  // the least: one step a group
  for (const Plan* p : {&hidden, &exposed}) {
    const std::vector<Schedule> lists = outer_sync_schedules(*p);
    REQUIRE(lists.size() == 4);
    for (const Schedule& s : lists) {
      REQUIRE(s.size() == 2);
      CHECK(s[0].op == Op::outer_sync_finish);
      CHECK(s[1].op == Op::outer_sync_start);
    }
  }
  // H = 4 cannot hide the exchange: each round pays what its 4 steps do not cover. A
  // job step is the latest group's round over H.
  const std::vector<double> step = group_step_seconds(exposed, in.costs, c);
  double round = 0;
  for (size_t g = 0; g < step.size(); ++g) round = std::max(round, exposed.local->group_steps[g] * step[g]);
  const double inner = round / 4;
  const SimResult outer = simulate(outer_sync_schedules(exposed), outer_sync_cost_model(exposed, in.costs, c, inner));
  CHECK(outer.step_seconds >= exposed.local->outer_exchange_seconds - round);
  CHECK(exposed.predicted.step_seconds == doctest::Approx(inner + outer.step_seconds / 4));
  CHECK(4 * exposed.predicted.step_seconds >= exposed.local->outer_exchange_seconds);
  // Chosen H hides it: the round outlasts the exchange, and the step is the inner step
  // plus the outer update spread over the round.
  CHECK(hidden.local->inner_steps * hidden.predicted.step_seconds >= hidden.local->outer_exchange_seconds);
  CHECK(hidden.predicted.step_seconds < exposed.predicted.step_seconds);
}

TEST_CASE("local plan: a group's own outer pass takes its share of the round's steps") {
  // Equal inner steps; the second group's round also holds 2 steps' worth of outer work.
  CHECK(steps_by_speed(6, {1.0, 1.0}) == std::vector<int>{3, 3});
  CHECK(steps_by_speed(6, {1.0, 1.0}, {0.0, 2.0}) == std::vector<int>{4, 2});  // both rounds end at 4
  CHECK(error_of([] { steps_by_speed(6, {1.0, 1.0}, {0.0}); }).find("1 round costs for 2 groups") != std::string::npos);
}

TEST_CASE("local plan: H is the cheapest round per job step up to kMaxRoundSteps, the smallest near it") {
  // Equal groups, no outer pass: every even count splits exactly; the least one wins.
  CHECK(choose_round_steps({1.0, 1.0}, {}, 2) == 2);
  CHECK(round_step_seconds({1.0, 1.0}, {}, 3) == doctest::Approx(2.0 / 3));
  // The second group's round also holds 4 steps' worth of outer work: a round of c steps
  // costs (c + 4) / 2 at best (c even), so 0.5 + 2 / c per job step, least at 32 (0.5625);
  // 28 is the smallest count within 2% of it (0.5714; 26 gives 0.5769, odd counts more).
  CHECK(round_step_seconds({1.0, 1.0}, {0.0, 4.0}, 28) == doctest::Approx(16.0 / 28));
  CHECK(round_step_seconds({1.0, 1.0}, {0.0, 4.0}, 27) == doctest::Approx(16.0 / 27));
  CHECK(choose_round_steps({1.0, 1.0}, {0.0, 4.0}, 2) == 28);
  // An exchange that needs more than kMaxRoundSteps gets its least count.
  CHECK(choose_round_steps({1.0, 1.0}, {0.0, 4.0}, kMaxRoundSteps + 8) == kMaxRoundSteps + 8);
  CHECK(error_of([] { choose_round_steps({1.0, 1.0, 1.0}, {}, 2); }).find("at least 2 steps a round for 3 groups") !=
        std::string::npos);
}
