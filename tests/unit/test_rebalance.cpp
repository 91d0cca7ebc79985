// Rebalancing while training (plan/rebalance.h) on hand-built clusters: calibration from
// measurements, the re-split and its memory caps, the measured all-reduce, and the
// tuner's keep / undo / settle decisions.
#include <doctest/doctest.h>

#include <map>
#include <optional>

#include "tests/unit/error_message.h"
#include "tests/unit/plan_fixtures.h"

#include "core/stats.h"
#include "plan/memory_fit.h"

#include "comm/local_communicator.h"
#include "plan/rebalance.h"
#include "plan/resumed_shares.h"
#include "runtime/executor.h"
#include "runtime/deadline_rebalance.h"
#include "runtime/rebalancer.h"

using namespace ht;
using namespace ht::plan;
using namespace ht::plan::fixtures;

namespace {

// A window of `steps` identical steps.
RankMeasure steady(int steps, double work, double optimizer, double wall, double reduce) {
  RankMeasure m;
  for (int i = 0; i < steps; ++i) {
    m.work_s.push_back(work);
    m.optimizer_s.push_back(optimizer);
    m.wall_s.push_back(wall);
    m.reduce_s.push_back(reduce);
  }
  return m;
}

// A rank's steps alternating between two micro-batch counts (a trial), odd steps first:
// work `tried` seconds in the steps of `count`, `old` in the steps of `old_count`.
RankMeasure alternating(int steps, int count, double tried, int old_count, double old) {
  RankMeasure m;
  for (int i = 0; i < steps; ++i) {
    const bool odd = i % 2 == 0;
    m.work_s.push_back(odd ? tried : old);
    m.micro_batches.push_back(odd ? count : old_count);
    m.optimizer_s.push_back(0);
    m.wall_s.push_back(0.30);
    m.reduce_s.push_back(0);
  }
  return m;
}

// Two equal ranks by the model, data parallel over 100 samples: 50 / 50.
struct TwoEqual {
  ClusterModel c = cluster({1e12, 1e12}, std::vector(2, 64 * kGiB));
  PlannerInput in = input(c, costs(c, 2), 100, "data");
  Plan plan = make_plan(in);
};

// A deadline leader over TwoEqual's two members, checking every 10 steps, whose decision
// keeps the shares and records what it was given.
struct DeadlineLeader {
  TwoEqual t;
  std::vector<int64_t> shares = t.plan.layout.samples;
  std::vector<RankMeasure> seen;  // the last check's windows, by rank
  int checks = 0;
  runtime::DeadlineRebalancer rebalancer{[this](const Plan& current, const std::vector<RankMeasure>& measured) {
                                           seen = measured;
                                           ++checks;
                                           Rebalance d;
                                           d.plan = current;
                                           return d;
                                         },
                                         10, t.plan, {0, 1}, 1000};
  // Member `member`'s step `step` at `work` seconds of work, at its share.
  void report(int member, int64_t step, double work) {
    rebalancer.report(member, step,
                      runtime::DeadlineRebalancer::row(work, 0.001, work + 0.002, 0.001, work, 0.001, 0.0001, 1,
                                                       shares[static_cast<size_t>(member)]),
                      shares);
  }
  void close(int64_t step) { rebalancer.decide(step, shares); }
};

}  // namespace

TEST_CASE("rebalance: calibration scales each rank's costs to what it measured") {
  TwoEqual t;
  REQUIRE(t.plan.layout.samples == std::vector<int64_t>{50, 50});
  // Rank 0: 50 samples in 0.15 s (3 ms each); rank 1 twice as slow; steps of 1 and 2 ms.
  const std::vector<RankMeasure> m{steady(5, 0.15, 1e-3, 0.4, 0.05), steady(5, 0.30, 2e-3, 0.4, 0.2)};
  const BlockCosts k = calibrated_costs(t.plan, t.in.costs, t.c, m);
  CHECK(k.seconds_per_sample[0][0] + k.seconds_per_sample[0][1] == doctest::Approx(3e-3));
  CHECK(k.seconds_per_sample[1][0] + k.seconds_per_sample[1][1] == doctest::Approx(6e-3));
  // The model had no step times: the measured step is spread by parameter count.
  CHECK(k.step_seconds[1][0] == doctest::Approx(1e-3));
  CHECK(k.step_seconds[1][1] == doctest::Approx(1e-3));
  // Medians, not means: one step caught in a stopped stretch does not move the figure.
  std::vector<RankMeasure> noisy = m;
  noisy[0].work_s[2] = 10.0;
  CHECK(calibrated_costs(t.plan, t.in.costs, t.c, noisy).seconds_per_sample[0][0] ==
        doctest::Approx(k.seconds_per_sample[0][0]));
  // The all-reduce: per step the least time any member waited, then the median.
  CHECK(measured_reduce_seconds(t.plan, m) == std::vector<double>{0.05});
  CHECK(measured_step_seconds(m) == doctest::Approx(0.4));
  noisy[1].wall_s[1] = 3.0;  // one step of one rank in a stopped stretch
  CHECK(measured_step_seconds(noisy) == doctest::Approx(0.4));
  noisy[1].wall_s.assign(5, 0.5);  // a slower rank sets the step
  CHECK(measured_step_seconds(noisy) == doctest::Approx(0.5));
  CHECK(measured_reduce_seconds(t.plan, {RankMeasure{}, RankMeasure{}}) == std::vector<double>{-1});
  // Windows of unequal length (one trimmed at a speed change) pair their last steps:
  // both end at the check's step.
  RankMeasure longer = steady(10, 0.1, 0, 0.4, 0.030), shorter = steady(10, 0.1, 0, 0.4, 0.020);
  for (int k = 0; k < 10; ++k) longer.reduce_s.push_back(0.001), longer.work_s.push_back(0.1);
  CHECK(measured_reduce_seconds(t.plan, {longer, shorter}) == std::vector<double>{0.001});
  CHECK(error_of([&] { calibrated_costs(t.plan, t.in.costs, t.c, {m[0]}); }).find("1 measurements for 2 ranks") !=
        std::string::npos);
}

TEST_CASE("rebalance: a rank under a CPU quota is charged its CPU time over the quota") {
  TwoEqual t;
  t.c.ranks[1].cpu_quota = 0.4;
  t.c.ranks[1].cpu_quota_period_s = 0.01;
  // Both ranks did their 50 samples in 0.15 s of wall time, but rank 1 spent 0.12 s of
  // CPU on them: in one burst of its period it ran at a whole core's speed, and in the
  // long run it gets 0.4 of one, so its work costs 0.12 / 0.4 = 0.3 s. Its optimiser
  // step likewise: 1 ms of CPU is 2.5 ms.
  std::vector<RankMeasure> m{steady(5, 0.15, 1e-3, 0.4, 0.05), steady(5, 0.15, 1e-3, 0.4, 0.05)};
  m[0].work_cpu_s.assign(5, 0.12);  // no quota: the wall time stands
  m[1].work_cpu_s.assign(5, 0.12);
  m[1].optimizer_cpu_s.assign(5, 1e-3);
  const BlockCosts k = calibrated_costs(t.plan, t.in.costs, t.c, m);
  CHECK(k.seconds_per_sample[0][0] + k.seconds_per_sample[0][1] == doctest::Approx(3e-3));
  CHECK(k.seconds_per_sample[1][0] + k.seconds_per_sample[1][1] == doctest::Approx(6e-3));
  CHECK(k.step_seconds[1][0] + k.step_seconds[1][1] == doctest::Approx(2.5e-3));
  // A rank that was throttled while it worked measured more than CPU / q: that stands.
  m[1].work_s.assign(5, 0.5);
  CHECK(calibrated_costs(t.plan, t.in.costs, t.c, m).seconds_per_sample[1][0] * 2 == doctest::Approx(1e-2));
  CHECK(resplit(t.plan, t.plan, k).layout.samples == std::vector<int64_t>{67, 33});
  CHECK(error_of([&] { calibrated_costs(t.plan, t.in.costs, cluster({1e12}, {kGiB}), m); })
            .find("a cluster of 1 ranks for a plan of 2") != std::string::npos);
}

TEST_CASE("rebalance: a quota'd rank's communication CPU is a fixed cost of its step") {
  TwoEqual t;
  t.c.ranks[1].cpu_quota = 0.4;
  t.c.ranks[1].cpu_quota_period_s = 0.01;
  // Equal work, but rank 1 spends 4 ms of CPU a step copying its messages: 10 ms of its
  // quota. Rank 0 has no quota: its copies are inside the all-reduce it measured.
  std::vector<RankMeasure> m{steady(5, 0.15, 1e-3, 0.4, 0.05), steady(5, 0.15, 1e-3, 0.4, 0.05)};
  m[0].comm_cpu_s.assign(5, 4e-3);
  m[1].comm_cpu_s = {4e-3, 4e-3, 9.0, 4e-3, 4e-3};  // a median: one step's stall does not count
  const BlockCosts k = calibrated_costs(t.plan, t.in.costs, t.c, m);
  CHECK(comm_overhead_seconds(k, 0) == 0);
  CHECK(comm_overhead_seconds(k, 1) == doctest::Approx(10e-3));
  CHECK(comm_overhead_seconds(calibrated_costs(t.plan, t.in.costs, t.c, {m[0], RankMeasure(m[1])}), 5) == 0);
  // The re-split gives rank 1 fewer samples: at 3 ms a sample, 10 ms is 3.3 of them.
  const Plan p = resplit(t.plan, t.plan, k);
  CHECK(p.layout.samples == std::vector<int64_t>{52, 48});
  // The simulator charges it once a step, before rank 1's first work: it sets the step.
  Plan before = t.plan, after = t.plan;
  predict_plan(before, calibrated_costs(t.plan, t.in.costs, t.c, {m[0], steady(5, 0.15, 1e-3, 0.4, 0.05)}), t.c);
  predict_plan(after, k, t.c);
  CHECK(after.predicted.step_seconds - before.predicted.step_seconds == doctest::Approx(10e-3));
  // Re-split, the step is rank 0's 52 x 3 ms: 6 ms over the step without the overhead.
  Plan resplit_plan = p;
  predict_plan(resplit_plan, k, t.c);
  CHECK(resplit_plan.predicted.step_seconds - before.predicted.step_seconds == doctest::Approx(6e-3));
}

TEST_CASE("rebalance: the re-split counts a rank's fixed cost per call, as the simulator does") {
  // Two ranks at 6 ms a sample; rank 1's calls cost 15 ms a micro-batch besides: 2.5
  // samples' worth, so 51 / 49 (306 and 309 ms) beats 50 / 50 (300 and 315 ms).
  TwoEqual t;
  t.in.costs.call_seconds[1] = {7.5e-3, 7.5e-3};
  Plan p = resplit(t.plan, t.plan, t.in.costs);
  CHECK(p.layout.samples == std::vector<int64_t>{51, 49});
  Plan even = t.plan;
  predict_plan(p, t.in.costs, t.c);
  predict_plan(even, t.in.costs, t.c);
  CHECK(p.predicted.step_seconds == doctest::Approx(even.predicted.step_seconds - 6e-3));
}

TEST_CASE("rebalance: a sharded rank's measured step is its part's; a rank keeping no state tells nothing") {
  TwoEqual t;
  // Rank 0 steps a quarter of the state in 1 ms: the whole state would take 4 ms.
  t.plan.ranks[0].optimizer_shard = 0.25;
  t.plan.ranks[1].optimizer_shard = 0.75;
  std::vector<RankMeasure> m{steady(5, 0.15, 1e-3, 0.4, 0.05), steady(5, 0.15, 3e-3, 0.4, 0.05)};
  BlockCosts k = calibrated_costs(t.plan, t.in.costs, t.c, m);
  CHECK(k.step_seconds[0][0] + k.step_seconds[0][1] == doctest::Approx(4e-3));
  CHECK(k.step_seconds[1][0] + k.step_seconds[1][1] == doctest::Approx(4e-3));
  // The hub steps for both: rank 1's near-zero step keeps the model's figure.
  t.plan.ranks[0].optimizer_shard = 1;
  t.plan.ranks[1].optimizer_shard = 0;
  m[1].optimizer_s.assign(5, 1e-5);
  BlockCosts model = t.in.costs;
  model.step_seconds[1] = {2e-3, 2e-3};
  k = calibrated_costs(t.plan, model, t.c, m);
  CHECK(k.step_seconds[0][0] + k.step_seconds[0][1] == doctest::Approx(1e-3));
  CHECK(k.step_seconds[1] == std::vector<double>{2e-3, 2e-3});
}

TEST_CASE("rebalance: the re-split follows measured speed within each replica's memory") {
  TwoEqual t;
  const std::vector<RankMeasure> m{steady(5, 0.10, 0, 0.3, 0), steady(5, 0.20, 0, 0.3, 0)};
  const BlockCosts k = calibrated_costs(t.plan, t.in.costs, t.c, m);
  const Plan p = resplit(t.plan, t.plan, k);
  CHECK(p.layout.samples == std::vector<int64_t>{67, 33});  // 2 : 1
  CHECK(p.ranks[0].samples == 67);
  CHECK(p.ranks[0].micro_batch_size == 67);
  // Rank 0 capped so that 60 samples do not fit: it keeps what fits, rank 1 the rest.
  TwoEqual small;
  small.plan.ranks[0].device.memory_bytes = rank_memory(small.plan, k, small.plan.ranks[0]).total() * 1.1;
  const Plan capped = resplit(small.plan, small.plan, k);
  CHECK(capped.layout.samples[0] < 60);
  CHECK(capped.layout.samples[0] + capped.layout.samples[1] == 100);
  CHECK(capped.ranks[0].memory.total() <= capped.ranks[0].device.memory_bytes);
}

TEST_CASE("rebalance: the tuner moves shares, undoes a move that measured slower, then settles") {
  TwoEqual t;
  ShareTuner tuner(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  // Rank 1 measures twice as slow: predicted faster at 2 : 1, so the shares move.
  const std::vector<RankMeasure> slow1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.20, 0, 0.30, 0)};
  Rebalance r = tuner.check(t.plan, slow1);
  REQUIRE(r.changed);
  CHECK_FALSE(r.reverted);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{67, 33});
  CHECK(r.current_step_s == doctest::Approx(0.20).epsilon(0.05));  // rank 1's 50 samples
  CHECK(r.plan.predicted.step_seconds == doctest::Approx(0.134).epsilon(0.05));
  CHECK(r.measured_step_s == doctest::Approx(0.30));
  // The new split measured slower (0.36 s > 0.30 s): undone, never tried again.
  const Plan moved = r.plan;
  const std::vector<RankMeasure> worse{steady(9, 0.13, 0, 0.36, 0), steady(9, 0.13, 0, 0.36, 0)};
  r = tuner.check(moved, worse);
  CHECK(r.changed);
  CHECK(r.reverted);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{50, 50});
  // Settling: kSettleChecks checks without a move, then only untried splits.
  for (int i = 0; i < kSettleChecks; ++i) CHECK_FALSE(tuner.check(r.plan, slow1).changed);
  CHECK_FALSE(tuner.check(r.plan, slow1).changed);  // 67 / 33 again: rejected
  const std::vector<RankMeasure> slower1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.40, 0, 0.30, 0)};
  CHECK(tuner.check(r.plan, slower1).plan.layout.samples == std::vector<int64_t>{80, 20});
}

TEST_CASE("rebalance: a slower step after a change is not undone when a rank's own speed changed; shares move on") {
  // The tuner moves to 67 / 33 (rank 1 at 4 ms a sample against rank 0's 2 ms). Then rank
  // 1 slows 3x (12 ms a sample: 0.40 s for its 33): the step measures slower than before
  // the change, but for the slow-down, which the change did not cause. Undone, the shares
  // would go back to 50 / 50, the worst split for the slowed rank, for kSettleChecks
  // checks; kept, they move on from the speeds measured now.
  TwoEqual t;
  ShareTuner tuner(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  const std::vector<RankMeasure> slow1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.20, 0, 0.30, 0)};
  const Plan moved = tuner.check(t.plan, slow1).plan;
  REQUIRE(moved.layout.samples == std::vector<int64_t>{67, 33});
  const std::vector<RankMeasure> throttled{steady(9, 0.134, 0, 0.45, 0), steady(9, 0.40, 0, 0.45, 0)};
  const Rebalance r = tuner.check(moved, throttled);
  CHECK_FALSE(r.reverted);
  CHECK(r.changed);
  CHECK(r.plan.layout.samples[1] < 20);  // about 1 : 6
}

TEST_CASE("rebalance: the settling after an undone change ends when a rank's speed moves") {
  // As above to the undoing (67 / 33 measured slower: back to 50 / 50, settling for
  // kSettleChecks checks). Then rank 1 slows 3x (12 ms a sample, 0.60 s for its 50): the
  // next check re-splits at once, where the settling would have kept 50 / 50 five checks.
  TwoEqual t;
  ShareTuner tuner(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  const std::vector<RankMeasure> slow1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.20, 0, 0.30, 0)};
  const Plan moved = tuner.check(t.plan, slow1).plan;
  const std::vector<RankMeasure> worse{steady(9, 0.13, 0, 0.36, 0), steady(9, 0.13, 0, 0.36, 0)};
  const Rebalance undone = tuner.check(moved, worse);
  REQUIRE(undone.reverted);
  const std::vector<RankMeasure> throttled{steady(9, 0.10, 0, 0.62, 0), steady(9, 0.60, 0, 0.62, 0)};
  const Rebalance r = tuner.check(undone.plan, throttled);
  CHECK(r.changed);
  CHECK(r.plan.layout.samples[1] < 20);
}

TEST_CASE("rebalance: a tuner judges only its own change: with other shares running it undoes nothing") {
  // Under deadline any member may lead, each with its own tuner. This one moved to 67 / 33;
  // then another leader's tuner moved the job to 60 / 40, which measured slower than this
  // tuner's step before its own move. Judged as its own change, that was undone (back to
  // 50 / 50, and 60 / 40 rejected for good); it is not this tuner's change, so nothing is
  // undone, and the shares move from the running ones by measured speed as usual.
  TwoEqual t;
  ShareTuner tuner(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  const std::vector<RankMeasure> slow1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.20, 0, 0.30, 0)};
  REQUIRE(tuner.check(t.plan, slow1).plan.layout.samples == std::vector<int64_t>{67, 33});
  Plan other = t.plan;
  other.layout.samples = {60, 40};
  for (RankPlan& rp : other.ranks) rp.samples = rp.micro_batch_size = other.layout.samples[static_cast<size_t>(rp.replica)];
  const std::vector<RankMeasure> worse{steady(9, 0.12, 0, 0.36, 0), steady(9, 0.16, 0, 0.36, 0)};
  const Rebalance r = tuner.check(other, worse);
  CHECK_FALSE(r.reverted);
  CHECK(r.plan.layout.samples != std::vector<int64_t>{50, 50});
}

TEST_CASE("rebalance: a move that measured faster stays; equal never moves but is recalibrated") {
  TwoEqual t;
  ShareTuner tuner(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  const std::vector<RankMeasure> slow1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.20, 0, 0.30, 0)};
  const Plan moved = tuner.check(t.plan, slow1).plan;
  const std::vector<RankMeasure> better{steady(9, 0.134, 0, 0.14, 0), steady(9, 0.132, 0, 0.14, 0)};
  const Rebalance kept = tuner.check(moved, better);
  CHECK_FALSE(kept.changed);
  CHECK(kept.plan.layout.samples == std::vector<int64_t>{67, 33});

  ShareTuner equal(t.plan, t.in.costs, t.c, false);
  const Rebalance e = equal.check(t.plan, slow1);
  CHECK_FALSE(e.changed);
  CHECK(e.plan.layout.samples == std::vector<int64_t>{50, 50});
  CHECK(e.plan.predicted.step_seconds == doctest::Approx(0.20).epsilon(0.05));
}

TEST_CASE("rebalance: a re-split predicted 1% faster is taken; one back to the shares it left needs 3%") {
  TwoEqual t;
  ShareTuner tuner(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  // Rank 1 measures 4% slower: 51 / 49 is predicted 2% faster, and taken.
  const std::vector<RankMeasure> a{steady(9, 0.100, 0, 0.30, 0), steady(9, 0.104, 0, 0.30, 0)};
  Rebalance r = tuner.check(t.plan, a);
  REQUIRE(r.changed);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{51, 49});
  CHECK(r.plan.predicted.step_seconds < (1 - kResplitMinGain) * r.current_step_s);
  CHECK(r.plan.predicted.step_seconds > (1 - kRebalanceMinGain) * r.current_step_s);
  // There rank 0 measures 1.5% slower a sample: back to 50 / 50 is predicted 2% faster,
  // not enough to go back.
  const Plan moved = r.plan;
  const std::vector<RankMeasure> b{steady(9, 51 * 0.00203, 0, 0.30, 0), steady(9, 49 * 0.002, 0, 0.30, 0)};
  r = tuner.check(moved, b);
  CHECK_FALSE(r.changed);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{51, 49});
  CHECK(tuner.check(moved, b).plan.layout.samples == std::vector<int64_t>{51, 49});
  // 8% slower a sample: 48 / 52 is a new split, and taken.
  const std::vector<RankMeasure> c{steady(9, 51 * 0.00216, 0, 0.30, 0), steady(9, 49 * 0.002, 0, 0.30, 0)};
  r = tuner.check(moved, c);
  CHECK(r.changed);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{48, 52});
}

TEST_CASE("rebalance: where cores are shared a re-split waits for a second check asking the same moves") {
  TwoEqual t;
  ClusterModel shared = t.c;
  for (DeviceModel& d : shared.ranks) d.cores_shared = true;
  ShareTuner tuner(t.plan, t.in.costs, shared, true, std::nullopt, false);
  const std::vector<RankMeasure> slow1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.20, 0, 0.30, 0)};
  const std::vector<RankMeasure> slow0{steady(9, 0.20, 0, 0.30, 0), steady(9, 0.10, 0, 0.30, 0)};
  // The first check that asks is held back; a second in a row asking the same way moves,
  // to the split this check's measurements give.
  Rebalance r = tuner.check(t.plan, slow1);
  CHECK_FALSE(r.changed);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{50, 50});
  const std::vector<RankMeasure> slower1{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.40, 0, 0.30, 0)};
  r = tuner.check(t.plan, slower1);
  REQUIRE(r.changed);
  CHECK(r.plan.layout.samples == std::vector<int64_t>{80, 20});
  // Rank 0 slow in one window, rank 1 in the next: the asks disagree, and nothing moves.
  ShareTuner flip(t.plan, t.in.costs, shared, true, std::nullopt, false);
  for (int i = 0; i < 6; ++i) CHECK_FALSE(flip.check(t.plan, i % 2 ? slow1 : slow0).changed);
  // A check between that asks for nothing starts the count again.
  const std::vector<RankMeasure> even{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.10, 0, 0.30, 0)};
  ShareTuner gap(t.plan, t.in.costs, shared, true, std::nullopt, false);
  CHECK_FALSE(gap.check(t.plan, slow1).changed);
  CHECK_FALSE(gap.check(t.plan, even).changed);
  CHECK_FALSE(gap.check(t.plan, slow1).changed);
  CHECK(gap.check(t.plan, slow1).plan.layout.samples == std::vector<int64_t>{67, 33});
  // Cores of its own: the first check moves (the case above).
  ShareTuner own(t.plan, t.in.costs, t.c, true, std::nullopt, false);
  CHECK(own.check(t.plan, slow1).plan.layout.samples == std::vector<int64_t>{67, 33});
}

TEST_CASE("rebalance: micro-batch trials alternate the counts step by step and keep the faster per sample") {
  TwoEqual t;
  const std::vector<RankMeasure> even{steady(9, 0.15, 0, 0.30, 0), steady(9, 0.15, 0, 0.30, 0)};
  using Counts = std::vector<int>;
  // Shares that stay: the widest micro-batches (replica 0 on a tie) in 4x as many, in
  // every other step.
  ShareTuner tuner(t.plan, t.in.costs, t.c, true);
  const Rebalance tried = tuner.check(t.plan, even);
  REQUIRE(tried.changed);
  CHECK_FALSE(tried.reverted);
  CHECK(tried.trial_seconds_per_sample.empty());
  CHECK(tried.plan.layout.samples == std::vector<int64_t>{50, 50});
  CHECK(tried.plan.layout.micro_batches == Counts{4, 1});
  CHECK(tried.plan.layout.alternate_micro_batches == Counts{1, 0});
  CHECK(tried.plan.ranks[0].micro_batches == 4);
  CHECK(tried.plan.ranks[0].micro_batch_size == 13);
  // Rank 0 does its 50 samples in 0.12 s in the steps of 4, 0.15 in those of 1: kept, the
  // alternation ends, and the shares follow. The window's other steps do not matter: a
  // drift that slowed the whole window would slow both counts.
  const Rebalance kept =
      tuner.check(tried.plan, {alternating(9, 4, 0.12, 1, 0.15), steady(9, 0.15, 0, 0.30, 0)});
  CHECK(kept.changed);
  CHECK_FALSE(kept.reverted);
  REQUIRE(kept.trial_seconds_per_sample.size() == 2);
  CHECK(kept.trial_seconds_per_sample[0] == doctest::Approx(0.15 / 50));
  CHECK(kept.trial_seconds_per_sample[1] == doctest::Approx(0.12 / 50));
  CHECK(kept.plan.layout.micro_batches == Counts{4, 1});
  CHECK(kept.plan.layout.alternate_micro_batches.empty());
  CHECK(kept.plan.layout.samples[0] > kept.plan.layout.samples[1]);
  // The same gain with the whole window 30% slower than the one before the trial (and
  // the tried steps slower than that window): still kept, since only the window's own
  // steps are compared.
  ShareTuner drifted(t.plan, t.in.costs, t.c, true);
  const Rebalance again = drifted.check(t.plan, even);
  const Rebalance kept_anyway =
      drifted.check(again.plan, {alternating(9, 4, 0.156, 1, 0.195), steady(9, 0.195, 0, 0.39, 0)});
  CHECK_FALSE(kept_anyway.reverted);
  CHECK(kept_anyway.plan.layout.micro_batches == Counts{4, 1});

  // Not faster (2% is noise): back. Then 2x for that replica, once; then the other's.
  ShareTuner other(t.plan, t.in.costs, t.c, true);
  const std::vector<std::pair<Counts, bool>> expected{
      {{4, 1}, false}, {{1, 1}, true}, {{2, 1}, false}, {{1, 1}, true},
      {{1, 4}, false}, {{1, 1}, true}, {{1, 2}, false}, {{1, 1}, true}};
  Plan current = t.plan;
  for (const auto& [counts, reverted] : expected) {
    std::vector<RankMeasure> same{steady(9, 0.15, 0, 0.30, 0), steady(9, 0.15, 0, 0.30, 0)};
    for (size_t r = 0; r < 2; ++r) {
      same[r].micro_batches.assign(9, 1);
      if (!current.layout.alternate_micro_batches.empty() && current.layout.alternate_micro_batches[r] > 0)
        same[r] = alternating(9, current.layout.micro_batches[r], 0.147, 1, 0.15);
    }
    const Rebalance r = other.check(current, same);
    CHECK(r.changed);
    CHECK(r.reverted == reverted);
    CHECK(r.plan.layout.micro_batches == counts);
    CHECK(r.plan.layout.alternate_micro_batches.empty() == reverted);
    CHECK(r.plan.layout.samples == std::vector<int64_t>{50, 50});
    current = r.plan;
  }
  CHECK_FALSE(other.check(current, even).changed);  // every replica tried

  // Too few steps of a count to judge (fewer than kMinTrialSteps): undone.
  ShareTuner short_window(t.plan, t.in.costs, t.c, true);
  const Rebalance started = short_window.check(t.plan, even);
  const Rebalance undone =
      short_window.check(started.plan, {alternating(kMinTrialSteps + 1, 4, 0.10, 1, 0.15), steady(9, 0.15, 0, 0.30, 0)});
  CHECK(undone.reverted);
  CHECK(undone.plan.layout.micro_batches == Counts{1, 1});
  CHECK(undone.trial_seconds_per_sample[0] < 0);

  // Too few samples per micro-batch to split (fewer than 2 x kMinMicroBatchSamples), trials
  // off, or a pipeline: no trial.
  Plan narrow = t.plan;
  narrow.layout.micro_batches = {4, 4};  // 12.5 samples each
  sync_rank_shares(narrow);
  CHECK_FALSE(ShareTuner(narrow, t.in.costs, t.c, true).check(narrow, even).changed);
  CHECK_FALSE(ShareTuner(t.plan, t.in.costs, t.c, true, std::nullopt, false).check(t.plan, even).changed);
  const PlannerInput piped = input(t.c, costs(t.c, 2), 100, "pipeline");
  const Plan pipeline = make_plan(piped);
  REQUIRE(pipeline.stage_ranges.size() == 2);
  const std::vector<RankMeasure> staged{steady(9, 0.15, 0, 0.30, 0), steady(9, 0.15, 0, 0.30, 0)};
  CHECK(ShareTuner(pipeline, piped.costs, t.c, true).check(pipeline, staged).plan.layout.micro_batches ==
        pipeline.layout.micro_batches);
}

TEST_CASE("rebalance: ranks left idle are tried at the first check, kept if faster, else undone for good") {
  // A fast rank and one at half its speed: find links slow enough that the planner leaves
  // rank 1 idle, with the plan over both ranks predicted within the trial margin.
  std::optional<ClusterModel> c;
  BlockCosts k;
  Plan idle, all;
  for (double bandwidth = 2e8; bandwidth < 2e11 && !c; bandwidth *= 1.1) {
    const ClusterModel candidate = cluster({2e12, 1e12}, std::vector(2, 64 * kGiB), 1e-5, bandwidth);
    k = costs(candidate, 4, 1e6, 2e6);
    idle = make_plan(input(candidate, k, 16));
    all = make_plan(input(candidate, k, 16, "data"));
    if (idle.ranks[1].replica < 0 && all.predicted.step_seconds <= (1 + kIdleTrialMargin) * idle.predicted.step_seconds)
      c = candidate;
  }
  REQUIRE(c);
  const std::vector<RankMeasure> alone{steady(9, 0.10, 0, 0.30, 0), RankMeasure{}};

  ShareTuner undone(idle, k, *c, true, all);
  const Rebalance tried = undone.check(idle, alone);
  CHECK(tried.changed);
  CHECK(tried.relayout);
  CHECK_FALSE(tried.reverted);
  CHECK(tried.plan.layout.replicas == all.layout.replicas);
  CHECK(tried.plan.ranks[1].replica >= 0);
  // Slower on both ranks: back to rank 0 alone, and never tried again.
  const Rebalance back = undone.check(tried.plan, {steady(9, 0.05, 0, 0.40, 0), steady(9, 0.05, 0, 0.40, 0)});
  CHECK(back.changed);
  CHECK(back.relayout);
  CHECK(back.reverted);
  CHECK(back.plan.layout.replicas == idle.layout.replicas);
  for (int i = 0; i < kSettleChecks + 2; ++i) CHECK_FALSE(undone.check(idle, alone).relayout);

  // Faster: both ranks stay, and later checks move shares within that layout.
  ShareTuner kept(idle, k, *c, true, all);
  const Rebalance stays = kept.check(kept.check(idle, alone).plan, {steady(9, 0.05, 0, 0.20, 0), steady(9, 0.05, 0, 0.20, 0)});
  CHECK_FALSE(stays.relayout);
  CHECK_FALSE(stays.reverted);
  CHECK(stays.plan.layout.replicas == all.layout.replicas);

  // No trial beyond the margin, for `equal` (shares never move), or without idle ranks.
  Plan far = all;
  far.predicted.step_seconds = (1 + kIdleTrialMargin) * idle.predicted.step_seconds * 1.01;
  CHECK_FALSE(ShareTuner(idle, k, *c, true, far).check(idle, alone).relayout);
  CHECK_FALSE(ShareTuner(idle, k, *c, false, all).check(idle, alone).relayout);
  const std::vector<RankMeasure> both{steady(9, 0.10, 0, 0.30, 0), steady(9, 0.10, 0, 0.30, 0)};
  CHECK_FALSE(ShareTuner(all, k, *c, true, all).check(all, both).relayout);
}

TEST_CASE("stats: a run's step is the median of its windows' means, not of its steps") {
  // Under a CPU quota steps alternate between a burst and a wait: 5 and 7.4 ms, whose
  // median step is 7.4 while the windows' mean is 6.2.
  std::vector<double> steps;
  for (int i = 0; i < 40; ++i) steps.push_back(i % 2 ? 7.4 : 5.0);
  CHECK(median(steps) == 7.4);
  CHECK(median_window_mean(steps, 10) == doctest::Approx(6.2));
  // One slow window among three moves the median no further than the middle window.
  std::vector<double> slow = steps;
  for (int i = 0; i < 10; ++i) slow[static_cast<size_t>(i)] = 20;
  CHECK(median_window_mean(std::vector<double>(slow.begin(), slow.begin() + 30), 10) == doctest::Approx(6.2));
  // A partial window at the end is left out; fewer values than a window give their mean.
  steps.push_back(100);
  CHECK(median_window_mean(steps, 10) == doctest::Approx(6.2));
  CHECK(median_window_mean({1, 2, 6}, 10) == doctest::Approx(3));
  CHECK(median_window_mean({}, 10) == 0);
}

TEST_CASE("stats: under local a run's step is taken over whole rounds, each with its round end") {
  // Rounds of 25 steps of 4 ms, the last of each 30 ms longer (the outer exchange's wait
  // and the pass): 5.2 ms a step. Windows of 10 steps miss the round end 6 times in 10.
  std::vector<double> steps;
  for (int i = 0; i < 250; ++i) steps.push_back(i % 25 == 24 ? 34.0 : 4.0);
  CHECK(median_window_mean(steps, 10) == doctest::Approx(4.0));
  CHECK(step_window(25) == 25);
  CHECK(median_window_mean(steps, step_window(25)) == doctest::Approx(5.2));
  // Short rounds: whole rounds of at least 10 steps; no rounds (sync): 10.
  CHECK(step_window(3) == 12);
  CHECK(step_window(10) == 10);
  CHECK(step_window(1) == 10);
  CHECK(step_window(0) == 10);
}

TEST_CASE("rebalancer: a check with no step measured since the last change is not made") {
  // Every 2 steps: a change at the check of step 2 (answered after step 3) clears the
  // window, and step 4 is not recorded (it is the first of the new plan's). The check of
  // step 4 then had nothing to go on: the planner's costs alone re-split the batch back
  // to the probe's split, and a trial was judged against a step of 0 s.
  comm::LocalCommunicator world;
  int decisions = 0;
  size_t steps_seen = 0;
  runtime::Rebalancer rebalancer(
      [&](const Plan& current, const std::vector<RankMeasure>& measured) {
        ++decisions;
        steps_seen = measured.at(0).wall_s.size();
        Rebalance d;
        d.plan = current;
        d.changed = decisions == 1;  // the first check changes the plan
        return d;
      },
      2, world, std::chrono::seconds(10));
  Plan plan = runtime::single_process_plan(2, 8, 1);
  runtime::StepResult step;
  step.wall_s = step.compute_s = 0.01;
  for (int64_t done = 1; done <= 7; ++done) {
    rebalancer.record(step);
    rebalancer.finish_check(plan);  // the trainer's order: the answer after the next step
    rebalancer.start_check(done, 100);
  }
  // Checks at 2 (steps 1-2, a change), 4 (nothing since: skipped) and 6 (steps 5-6),
  // each answered after the step that follows it.
  CHECK(decisions == 2);
  CHECK(steps_seen == 2);
}

TEST_CASE("rebalance: a window drops the steps before its rank's speed changed, and keeps noise") {
  // 20 steps at 10 ms, then 10 at 30 ms (a card throttled 3x after step 20).
  auto window = [](double before, double after) {
    RankMeasure m = steady(20, before, 0.001, before + 0.002, 0.0005);
    const RankMeasure late = steady(10, after, 0.002, after + 0.002, 0.0005);
    for (size_t s = 0; s < m.work_s.size(); ++s) m.work_cpu_s.push_back(0.5 * before);
    for (size_t s = 0; s < late.work_s.size(); ++s) {
      m.work_s.push_back(late.work_s[s]);
      m.optimizer_s.push_back(late.optimizer_s[s]);
      m.wall_s.push_back(late.wall_s[s]);
      m.reduce_s.push_back(late.reduce_s[s]);
      m.work_cpu_s.push_back(0.5 * after);
    }
    return m;
  };
  SUBCASE("3x slower: only the 10 steps since the change stay, in every series") {
    RankMeasure m = window(0.010, 0.030);
    CHECK(drop_steps_before_speed_change(m, 10));
    CHECK(m.work_s == std::vector<double>(10, 0.030));
    CHECK(m.optimizer_s == std::vector<double>(10, 0.002));
    CHECK(m.wall_s == std::vector<double>(10, 0.032));
    CHECK(m.work_cpu_s == std::vector<double>(10, 0.015));
    CHECK(m.optimizer_cpu_s.empty());  // not measured: stays empty
    CHECK(median(m.work_s) == 0.030);
  }
  SUBCASE("3x faster likewise") {
    RankMeasure m = window(0.030, 0.010);
    CHECK(drop_steps_before_speed_change(m, 10));
    CHECK(m.work_s.size() == 10);
  }
  SUBCASE("a move within kSpeedChange is noise: every step stays") {
    RankMeasure m = window(0.010, 0.010 * (1 + 0.9 * kSpeedChange));
    CHECK_FALSE(drop_steps_before_speed_change(m, 10));
    CHECK(m.work_s.size() == 30);
    m = window(0.010, 0.010 * (1 - 0.9 * kSpeedChange));
    CHECK_FALSE(drop_steps_before_speed_change(m, 10));
  }
  SUBCASE("too few steps on either side judge nothing") {
    RankMeasure m = window(0.010, 0.030);
    CHECK_FALSE(drop_steps_before_speed_change(m, kMinSpeedSteps - 1));
    CHECK_FALSE(drop_steps_before_speed_change(m, 30 - kMinSpeedSteps + 1));
    CHECK(m.work_s.size() == 30);
  }
}

TEST_CASE("rebalancer: the first check after a rank's speed changed sees its new speed alone") {
  // Every 10 steps; steps 1-20 at 10 ms, 21-30 at 30 ms. The window keeps three checks'
  // steps, so the check of step 30 held 19 steps at 10 ms (step 1 is not recorded) and 10
  // at 30 ms: its median was the old speed.
  comm::LocalCommunicator world;
  std::vector<double> seen;
  runtime::Rebalancer rebalancer(
      [&](const Plan& current, const std::vector<RankMeasure>& measured) {
        seen = measured.at(0).work_s;
        Rebalance d;
        d.plan = current;
        return d;
      },
      10, world, std::chrono::seconds(10));
  Plan plan = runtime::single_process_plan(2, 8, 1);
  for (int64_t done = 1; done <= 31; ++done) {
    runtime::StepResult step;
    step.compute_s = done <= 20 ? 0.010 : 0.030;
    step.wall_s = step.compute_s + 0.001;
    rebalancer.record(step);
    rebalancer.finish_check(plan);
    rebalancer.start_check(done, 100);
  }
  CHECK(seen == std::vector<double>(10, 0.030));
}

TEST_CASE("deadline rebalancer: a member whose speed changed is judged on its steps since the last check") {
  DeadlineLeader l;
  for (int64_t s = 0; s < 30; ++s) {
    l.report(0, s, 0.010);
    l.report(1, s, s < 20 ? 0.010 : 0.030);
    l.close(s);
  }
  REQUIRE(l.seen.size() == 2);
  CHECK(l.seen[1].work_s == std::vector<double>(10, 0.030));  // steps 20-29
  CHECK(l.seen[0].work_s.size() == 29);                        // steps 1-29: unchanged, all kept
}

TEST_CASE("deadline rebalancer: a member too slow to send kMinSteps rows a check is judged on those it sent") {
  // Member 1 is slowed 3x after step 20 and left out of most steps: it sends rows for
  // steps 22 and 27 only. Before, its window kept its 19 rows of before the slow-down
  // (the speed test needs kMinSteps recent rows): the check of step 29 saw the old speed.
  // After a re-split its window would be short and block every check until it had sent
  // kMinSteps rows (a member slowed 16x: never).
  DeadlineLeader l;
  for (int64_t s = 0; s < 30; ++s) {
    l.report(0, s, 0.010);
    if (s < 20) l.report(1, s, 0.010);
    if (s == 22 || s == 27) l.report(1, s, 0.030);
    l.close(s);
  }
  REQUIRE(l.seen.size() == 2);
  CHECK(l.seen[1].work_s == std::vector<double>(2, 0.030));
  // Once the windows had 2 x kMinSteps steps since they started, one row suffices.
  DeadlineLeader fresh;
  for (int64_t s = 0; s < 20; ++s) {
    fresh.report(0, s, 0.010);
    if (s == 5 || s == 17) fresh.report(1, s, 0.030);
    fresh.close(s);
  }
  // Step 9: member 1's one row (step 5) is judged. Step 19: its rows of steps 5 and 17.
  CHECK(fresh.checks == 2);
  // Nothing from member 1 after step 17: its rows stand while they are within the
  // windows' span (three checks), and then it is away, its window emptied: no check.
  for (int64_t s = 20; s < 50; ++s) {
    fresh.report(0, s, 0.010);
    fresh.close(s);
    if (s == 39) CHECK(fresh.checks == 4);
  }
  CHECK(fresh.checks == 4);  // step 49: step 17 is older than 49 - 30
}

TEST_CASE("rebalance: a resumed job starts from the checkpoint's shares where they fit, and refuses those that do not") {
  TwoEqual t;
  const Plan p = with_resumed_shares(t.plan, {70, 30}, {2, 1}, t.in.costs, t.c);
  CHECK(p.layout.samples == std::vector<int64_t>{70, 30});
  CHECK(p.layout.micro_batches == std::vector<int>{2, 1});
  CHECK(p.ranks[0].samples == 70);
  CHECK(p.ranks[0].micro_batch_size == 35);
  // Predicted again: rank 0's 70 samples set the pace, 7/5 of the even split's.
  CHECK(p.predicted.step_seconds > 1.3 * t.plan.predicted.step_seconds);
  CHECK(error_of([&] { with_resumed_shares(t.plan, {70, 20}, {1, 1}, t.in.costs, t.c); })
            .find("summing to 90") != std::string::npos);
  CHECK(error_of([&] { with_resumed_shares(t.plan, {70, 30}, {1}, t.in.costs, t.c); })
            .find("1 micro-batch counts for 2 replicas") != std::string::npos);
  CHECK(error_of([&] { with_resumed_shares(t.plan, {70, 30}, {71, 1}, t.in.costs, t.c); })
            .find("replica 0's 71 micro-batches for its 70 samples; expected 1 (the plan's) to 70") != std::string::npos);
  CHECK(error_of([&] { with_resumed_shares(t.plan, {70, 30}, {0, 1}, t.in.costs, t.c); })
            .find("replica 0's 0 micro-batches") != std::string::npos);
  // A share of a few samples would hold its rank there: measured by its fixed costs.
  CHECK(error_of([&] { with_resumed_shares(t.plan, {93, 7}, {1, 1}, t.in.costs, t.c); })
            .find("replica 1's share of 7 samples is below 8") != std::string::npos);
  CHECK(with_resumed_shares(t.plan, {92, 8}, {1, 1}, t.in.costs, t.c).layout.samples[1] == 8);
  // Rank 0 holding 60 samples' worth at most: 70 in one micro-batch do not fit, in two they do.
  TwoEqual small;
  small.plan.ranks[0].device.memory_bytes =
      rank_memory(with_shares(small.plan, {60, 40}), small.in.costs, with_shares(small.plan, {60, 40}).ranks[0]).total();
  CHECK(error_of([&] { with_resumed_shares(small.plan, {70, 30}, {1, 1}, small.in.costs, small.c); })
            .find("replica 0's 70 samples in 1 micro-batches need") != std::string::npos);
  CHECK(with_resumed_shares(small.plan, {70, 30}, {2, 1}, small.in.costs, small.c).layout.samples[0] == 70);
}

TEST_CASE("rebalance: a checkpoint's shares follow the ranks into a resumed plan, and bad ones are named") {
  TwoEqual t;
  Plan ran = with_shares(t.plan, {70, 30});
  ran.layout.micro_batches = {2, 1};
  const std::string text = shares_metadata(ran);
  ResumedShares got = shares_for_plan(t.plan, text);
  CHECK(got.samples == std::vector<int64_t>{70, 30});
  CHECK(got.micro_batches == std::vector<int>{2, 1});
  // A new probe ordering the ranks' replicas otherwise: each takes its ranks' share.
  Plan swapped = t.plan;
  std::swap(swapped.layout.replicas[0], swapped.layout.replicas[1]);
  got = shares_for_plan(swapped, text);
  CHECK(got.samples == std::vector<int64_t>{30, 70});
  CHECK(got.micro_batches == std::vector<int>{1, 2});
  // In a micro-batch trial the count before it is kept: the tried one is not judged.
  Plan trial = ran;
  trial.layout.micro_batches = {8, 1};
  trial.layout.alternate_micro_batches = {2, 0};
  CHECK(shares_for_plan(t.plan, shares_metadata(trial)).micro_batches == std::vector<int>{2, 1});
  auto why = [&](const std::string& bad) { return error_of([&] { shares_for_plan(t.plan, bad); }); };
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = text;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK(why("{").find("metadata 'shares'") != std::string::npos);
  CHECK(why(std::string(70000, '[') + std::string(70000, ']')).find("nesting reaches level") != std::string::npos);
  CHECK(why(with("\"world\":2", "\"world\":4")).find("another world or other stages") != std::string::npos);
  CHECK(why(with("[[0],[1]]", "[[0],[2]]")).find("its replicas are not this plan's") != std::string::npos);
  CHECK(why(with("[70,30]", "[70,30,1]")).find("not of 2 replicas") != std::string::npos);
  CHECK(why(with("[70,30]", "[0,100]")).find("shares.samples[0]") != std::string::npos);
  CHECK(why(with("[70,30]", "[-1,101]")).find("shares.samples[0]") != std::string::npos);
  CHECK(why(with("[70,30]", "[70.5,29.5]")).find("shares.samples[0]") != std::string::npos);
  CHECK(why(with("[70,30]", "[9223372036854775807,30]")).find("shares.samples[0]") != std::string::npos);
  CHECK(why(with("[2,1]", "[71,1]")).find("shares.micro_batches[0]") != std::string::npos);
  CHECK(why(with("[2,1]", "[2,0]")).find("shares.micro_batches[1]") != std::string::npos);
  CHECK(why(with("[2,1]", "[2,4294967297]")).find("shares.micro_batches[1]") != std::string::npos);
}

TEST_CASE("deadline rebalancer: the row of a step a stop fell in is not a member's speed") {
  // Member 1 steps at 10 ms to step 23, is stopped, and its first row back (step 38)
  // holds the 5 s of the stop. Kept, it was the member's only row since the last check,
  // the speed test dropped the others for it, and the check moved its share to ~1.
  // Held until its next row, which is its old speed again: dropped then.
  DeadlineLeader l;
  for (int64_t s = 0; s < 50; ++s) {
    l.report(0, s, 0.010);
    if (s < 24 || s > 38) l.report(1, s, 0.010);
    if (s == 38) l.report(1, s, 5.0);
    l.close(s);
    if (s == 39 || s == 49) {
      REQUIRE(l.seen.size() == 2);
      CHECK_FALSE(l.seen[1].work_s.empty());
      CHECK(std::all_of(l.seen[1].work_s.begin(), l.seen[1].work_s.end(), [](double w) { return w == 0.010; }));
    }
  }
  CHECK(l.checks == 5);
}

TEST_CASE("deadline rebalancer: a slow member's late rows count where they arrive, not at the step they were for") {
  // Member 1 slowed after step 20: each of its steps spans `lag` of the others', and
  // its row, sent with its late contribution, arrives `lag` steps after the step it was
  // for. Counted by that step, no row was ever since the last check: its rows of before
  // the slow-down were never dropped and held its median (the CNN's rank slowed 16x
  // moved 62 steps late), and a member slowed past the windows' span (30 steps) was taken
  // for stopped, its window emptied at every check, and never re-split.
  for (const int64_t lag : {16, 40}) {
    CAPTURE(lag);
    DeadlineLeader l;
    std::map<int64_t, double> slow_seen;  // member 1's median work at each check from step 20
    for (int64_t s = 0; s < 20 + 3 * lag; ++s) {
      l.report(0, s, 0.010);
      if (s < 20) l.report(1, s, 0.010);
      // The contribution to step f (f = 20, 20 + lag, ...) arrives while step f + lag closes.
      if (s >= 20 + lag && (s - 20) % lag == 0) l.report(1, s - lag, 0.010 * static_cast<double>(lag));
      const int before = l.checks;
      l.close(s);
      if (l.checks > before && s >= 20) slow_seen[s] = l.seen[1].work_s.empty() ? 0 : median(l.seen[1].work_s);
    }
    // The check after the first late row arrived (step 20 + lag) judges member 1 on it;
    // a row past the stop bound (30 x the 12 ms steps) once the second as long arrives.
    const int64_t arrived = 0.010 * static_cast<double>(lag) > 30 * 0.012 ? 20 + 2 * lag : 20 + lag;
    const int64_t first = arrived / 10 * 10 + 9;
    REQUIRE(slow_seen.count(first));
    CHECK(slow_seen[first] == 0.010 * static_cast<double>(lag));
    // And so does every later check: a member that sends is not away.
    for (const auto& [step, work] : slow_seen)
      if (step > first) CHECK(work == 0.010 * static_cast<double>(lag));
  }
}

TEST_CASE("deadline rebalancer: a held row stands through a restart that leaves its member's share") {
  // Member 1 slowed 40x after step 20 sends a row past the stop bound every 40 steps. Its
  // first (arriving at step 60) is held; the windows restart at step 76 (this rank leads
  // again after another closed step 75), its share unchanged; its second row (step 100)
  // is kept with the held one, and the check of step 109 judges it. Cleared at the
  // restart, the held row had it wait for a third (step 140): a member this slow, whose
  // windows the others' re-splits restart every few checks, was re-split in one run and
  // never in another.
  DeadlineLeader l;
  for (int64_t s = 0; s < 110; ++s) {
    l.report(0, s, 0.010);
    if (s < 20) l.report(1, s, 0.010);
    if (s == 60 || s == 100) l.report(1, s - 40, 0.400);
    if (s != 75) l.close(s);
  }
  REQUIRE(l.seen.size() == 2);
  CHECK(l.seen[1].work_s == std::vector<double>(2, 0.400));
}

TEST_CASE("deadline rebalancer: the windows start afresh when a member back from away sends again") {
  // Member 1 is stopped from step 20 to 70; member 0, meanwhile beside a stopped rank, steps
  // at 8 ms, and at 10 ms again once member 1 is back. A check that mixed member 0's rows
  // of the stop with member 1's first rows back moved shares that the next check moved
  // back.
  DeadlineLeader l;
  for (int64_t s = 0; s < 80; ++s) {
    l.report(0, s, s >= 20 && s < 71 ? 0.008 : 0.010);
    if (s < 20 || s > 70) l.report(1, s, 0.010);
    if (s == 70) l.report(1, s, 5.0);  // the step the stop fell in: held, then dropped
    l.close(s);
  }
  REQUIRE(l.seen.size() == 2);
  CHECK(l.seen[0].work_s == std::vector<double>(8, 0.010));  // steps 72-79
  CHECK(l.seen[1].work_s == std::vector<double>(9, 0.010));  // steps 71-79
}
