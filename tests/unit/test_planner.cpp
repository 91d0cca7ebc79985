// The planner end to end on hand-built clusters and costs (no probe, no catalogue unless
// named): data-parallel shares, pipeline and hybrid layouts, the memory strategies and
// their order, the baseline, slow links, the bad inputs, and the plan file.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"
#include "tests/unit/plan_fixtures.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "models/models.h"
#include "plan/batch_split.h"
#include "plan/memory_fit.h"
#include "plan/plan_costs.h"
#include "plan/plan_facts_json.h"
#include "plan/plan_json.h"
#include "plan/planner.h"
#include "plan/stage_memory.h"
#include "report/plan_text.h"
#include "runtime/executor.h"

using namespace ht;
using namespace ht::plan;
using namespace ht::plan::fixtures;

TEST_CASE("planner: data-parallel shares follow speed, 4:2:1:1 gives 2x over equal") {
  const ClusterModel c = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB));
  const PlannerInput in = input(c, costs(c, 4), 128);
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.strategy == Strategy::data);
  CHECK(p.layout.samples == std::vector<int64_t>{64, 32, 16, 16});
  CHECK(p.baseline.layout.samples == std::vector<int64_t>{32, 32, 32, 32});
  // Free links and steps: the step is compute, so the speed-up is the analytic 8/4.
  CHECK(p.speedup == doctest::Approx(2.0).epsilon(0.01));
  CHECK(p.baseline.fits);
  for (const RankPlan& r : p.ranks) {
    CHECK(r.memory_strategies.empty());
    CHECK(r.busy_fraction == doctest::Approx(1.0).epsilon(0.01));
  }
  CHECK(p.candidates > 1);  // 1, 2 and 4 stages were on the table
}

TEST_CASE("planner: a cluster whose links dominate pipelines the model instead") {
  // 200 MB/s links make the 16 MB all-reduce cost twice the compute, while the pipeline
  // moves 4 KB per sample: the search must find that.
  const ClusterModel c = cluster({1e13, 1e13}, std::vector(2, 64 * kGiB), 1e-4, 2e8);
  const PlannerInput in = input(c, costs(c, 4, 1e6, 4096), 64);
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.strategy == Strategy::pipeline);
  CHECK(p.stage_ranges == std::vector<std::pair<int, int>>{{0, 2}, {2, 4}});
  CHECK(p.layout.micro_batches[0] >= 2);
  // The same cluster forced to data parallel is slower.
  const Plan dp = make_plan(input(c, costs(c, 4, 1e6, 4096), 64, "data"));
  CHECK(dp.strategy == Strategy::data);
  CHECK(dp.predicted.step_seconds > p.predicted.step_seconds);
  // Under a dynamic loss scale (agreed within one stage group) auto plans one stage: one
  // rank alone, since the all-reduce costs more than the second rank's compute gives
  // back (the two-rank data-parallel plan above is slower).
  PlannerInput one = input(c, costs(c, 4, 1e6, 4096), 64);
  one.one_stage = true;
  const Plan single = make_plan(one);
  CHECK(single.stage_ranges.size() == 1);
  CHECK(single.ranks[1].replica == -1);
  CHECK(single.predicted.step_seconds < dp.predicted.step_seconds);
}

TEST_CASE("planner: hybrid layouts put like devices on one stage across replicas") {
  // Two fast and two slow ranks on 500 MB/s links: a 4-way all-reduce of 24 MB of
  // gradients costs more than two 2-way ones plus the pipeline's small transfers, so
  // 2 x 2 hybrid, each replica a fast and a slow rank, the slow stage given fewer blocks.
  const ClusterModel c = cluster({2e13, 2e13, 1e13, 1e13}, std::vector(4, 64 * kGiB), 1e-4, 5e8);
  const PlannerInput in = input(c, costs(c, 6), 128);
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  INFO(report::note_text(p.notes[1]));
  REQUIRE(p.strategy == Strategy::hybrid);
  for (const auto& replica : p.layout.replicas) {
    REQUIRE(replica.size() == 2);
    std::vector<double> speeds{c.ranks[replica[0]].flops, c.ranks[replica[1]].flops};
    CHECK(speeds[0] != speeds[1]);
  }
  // The stage on the slow ranks holds fewer blocks.
  const int slow_stage = p.ranks[2].stage;
  const auto [b, e] = p.stage_ranges[slow_stage];
  CHECK(e - b < 3);
}

namespace {

// The shortfall of a plan refused over its one layout for memory (FAILs where a plan is
// made, or where it is refused otherwise).
Shortfall only_memory_shortfall(const PlannerInput& in) {
  try {
    make_plan(in);
  } catch (const NoPlanFits& e) {
    REQUIRE(e.shapes.size() == 1);
    REQUIRE(e.shapes[0].problem.kind == LayoutProblemKind::memory);
    return e.shapes[0].problem.shortfall;
  }
  FAIL("expected NoPlanFits");
  return {};
}

// Two replicas of two stages (blocks 0-1 and 2-3), 32 samples each in 2 micro-batches;
// rank 0 (replica 0, stage 0) holds `memory`, the others plenty.
Plan hybrid_skeleton(double memory) {
  Plan p;
  p.world_size = 4;
  p.blocks = 4;
  p.global_batch = 64;
  p.stage_ranges = {{0, 2}, {2, 4}};
  p.layout.replicas = {{0, 1}, {2, 3}};
  p.layout.samples = {32, 32};
  p.layout.micro_batches = {2, 2};
  p.layout.activation_bytes = {65536};
  for (int k = 0; k < 4; ++k) {
    RankPlan r;
    r.rank = k;
    r.device.id = "dev" + std::to_string(k);
    r.device.memory_bytes = k == 0 ? memory : 64 * kGiB;
    r.replica = k / 2;
    r.stage = k % 2;
    std::tie(r.block_begin, r.block_end) = p.stage_ranges[static_cast<size_t>(r.stage)];
    p.ranks.push_back(r);
  }
  sync_rank_shares(p);
  return p;
}

}  // namespace

TEST_CASE("planner: memory strategies in order: recompute, micro-batches that fit alone, sharding, micro-batches") {
  const ClusterModel c = cluster({1e12, 1e12, 1e12, 1e12}, std::vector(4, 64 * kGiB));
  const BlockCosts k = costs(c, 4);
  // Rank 0: 32 MB of weight state; 2 micro-batches of 16 in flight x 2 MB = 64 MB; and,
  // as it evaluates the whole model, stage 1's 8 MB of weights, and while it accumulates
  // over micro-batches one block's 4 MB of gradients (so every cap below is 12 MB above
  // the stage's own figures).
  SUBCASE("rank 0 holds the whole model's weights, the other ranks their stage's") {
    Plan p = hybrid_skeleton(64 * kGiB);
    REQUIRE_FALSE(fit_memory(p, k));
    const double all = 4 * std::accumulate(k.params.begin(), k.params.end(), 0.0);
    CHECK(p.ranks[0].memory.params == doctest::Approx(all));
    CHECK(p.ranks[2].memory.params == doctest::Approx(all / 2));  // the same stage, not rank 0
    CHECK(p.ranks[1].memory.params == doctest::Approx(all / 2));
  }
  SUBCASE("recompute alone") {
    // Recompute: 2 x 16 x 64 KiB inputs + 16 x 2 MB rebuilt = 34.1 MB, 78.1 MB in all.
    Plan p = hybrid_skeleton(92e6);
    REQUIRE_FALSE(fit_memory(p, k));
    CHECK(p.ranks[0].memory_strategies == std::vector{MemoryStrategy::recompute});
    CHECK(p.ranks[0].recompute);
    CHECK(p.layout.recompute[0][0]);
    CHECK_FALSE(p.layout.recompute[1][0]);
    CHECK(p.layout.micro_batches[0] == 2);
    // What it needed, then what recomputation saved, in bytes.
    const auto& steps = p.ranks[0].memory_steps;
    REQUIRE(steps.size() == 2);
    CHECK(steps[0].kind == MemoryStepKind::over_capacity);
    CHECK(steps[0].capacity == 92e6);
    CHECK(steps[0].use.total() > 92e6);
    CHECK(steps[0].use.params == doctest::Approx(16e6));
    CHECK(steps[1].kind == MemoryStepKind::recompute);
    CHECK(steps[1].activations_before == doctest::Approx(steps[0].use.activations));
    CHECK(steps[1].activations_after == doctest::Approx(p.ranks[0].memory.activations));
    CHECK(steps[1].activations_after < steps[1].activations_before);
    for (int r = 1; r < 4; ++r) CHECK(p.ranks[r].memory_strategies.empty());
    check_plan(p);
  }
  SUBCASE("recompute taken back where its replica's micro-batches, grown for another rank, make it needless") {
    // Rank 0 alone takes recompute (as above); rank 1, capped at 45 MB, then needs 4
    // micro-batches of 8 for the replica, and at those rank 0 fits without recomputing
    // (2 in flight x 8 samples x 2 MB = 32 MB with its 44 MB: 76 MB of 92).
    Plan p = hybrid_skeleton(92e6);
    p.ranks[1].device.memory_bytes = 45e6;
    REQUIRE_FALSE(fit_memory(p, k));
    CHECK(p.layout.micro_batches[0] > 2);
    CHECK_FALSE(p.ranks[0].recompute);
    CHECK_FALSE(p.layout.recompute[0][0]);
    CHECK(p.ranks[0].memory_strategies.empty());
    const auto& steps = p.ranks[0].memory_steps;
    REQUIRE(steps.size() == 3);
    CHECK(steps[1].kind == MemoryStepKind::recompute);
    CHECK(steps[2].kind == MemoryStepKind::recompute_dropped);
    CHECK(steps[2].activations_after == doctest::Approx(p.ranks[0].memory.activations));
    CHECK(steps[2].activations_after > steps[2].activations_before);
    CHECK(p.ranks[0].memory.total() <= 92e6);
    check_plan(p);
  }
  SUBCASE("recompute + micro-batches") {
    // 3 micro-batches of 11: 67.4 MB; 4 of 8: 61.05 MB fits 62 MB.
    Plan p = hybrid_skeleton(62e6);
    REQUIRE_FALSE(fit_memory(p, k));
    CHECK(p.ranks[0].memory_strategies == std::vector{MemoryStrategy::recompute, MemoryStrategy::micro_batches});
    CHECK(p.layout.micro_batches == std::vector<int>{4, 2});  // the other replica keeps 2
    CHECK(p.ranks[1].micro_batches == 4);  // the whole replica follows
    const MemoryStep& more = p.ranks[0].memory_steps.back();
    CHECK(more.kind == MemoryStepKind::micro_batches);
    CHECK(more.micro_batches == 4);
    CHECK(more.micro_batch_size == 8);
    CHECK(p.ranks[0].memory.total() <= 62e6);
  }
  SUBCASE("all three, sharding by free memory") {
    // Below the 32 MB of weight state: micro-batches alone cannot fit, so the optimiser
    // state is sharded with rank 2 first, then micro-batches close the rest.
    Plan p = hybrid_skeleton(42e6);
    REQUIRE_FALSE(fit_memory(p, k));
    CHECK(p.ranks[0].memory_strategies == std::vector{MemoryStrategy::recompute, MemoryStrategy::optimizer_sharding,
                                                      MemoryStrategy::micro_batches});
    CHECK(p.ranks[2].memory_strategies == std::vector{MemoryStrategy::optimizer_sharding});
    CHECK(p.ranks[1].optimizer_shard == 1);  // stage 1's group is untouched
    const double s0 = p.ranks[0].optimizer_shard, s2 = p.ranks[2].optimizer_shard;
    CHECK(s0 + s2 == doctest::Approx(1.0));
    CHECK(s0 < 0.01);  // rank 2 has 64 GiB free, rank 0 about 12 MB
    REQUIRE(p.ranks[2].memory_steps.size() == 1);
    const MemoryStep& kept = p.ranks[2].memory_steps[0];
    CHECK(kept.kind == MemoryStepKind::shard_for_peer);
    CHECK(kept.for_rank == 0);
    CHECK(kept.stage == 0);
    CHECK(kept.kept_fraction == doctest::Approx(s2));
    for (const RankPlan& r : p.ranks) CHECK(r.memory.total() <= r.device.memory_bytes);
  }
  SUBCASE("without sharding (parallel.sync deadline), the same cap leaves rank 0 short, saying so") {
    Plan p = hybrid_skeleton(42e6);
    const std::optional<Shortfall> s = fit_memory(p, k, false);
    REQUIRE(s);
    CHECK(s->rank == 0);
    CHECK_FALSE(s->sharding_possible);
    for (const RankPlan& r : p.ranks) CHECK(r.optimizer_shard == 1);
  }
  SUBCASE("nothing fits: the rank and the numbers") {
    Plan p = hybrid_skeleton(24e6 + 1);  // params (the whole model's) + grads alone
    const std::optional<Shortfall> s = fit_memory(p, k);
    REQUIRE(s);
    CHECK(s->rank == 0);
    CHECK(s->device == "dev0");
    CHECK(s->capacity == 24e6 + 1);
    CHECK(s->stage == 0);
    CHECK(s->block_begin == 0);
    CHECK(s->block_end == 2);
    CHECK(s->samples == 32);
    CHECK(s->after_strategies);
    CHECK(s->sharding_possible);
    CHECK(s->sharded == (p.ranks[0].optimizer_shard < 1));
    CHECK(s->need.total() > s->capacity);
  }
}

TEST_CASE("planner: a rank short of memory for its weights shards before it takes many micro-batches") {
  // Rank 1: 32 MB of weights and gradients, 32 MB of AdamW state, 4 MB of activations a
  // sample, 60 MB in all. Micro-batches alone cannot fit (32 of 1 sample: 72 MB with one
  // block's 4 MB of gradients while accumulating); the state goes to rank 0 (rank 1 has
  // nothing free to keep any), and then 6 micro-batches of at most 6 samples fit:
  // 32 + 4 + 24 MB. Micro-batches first would run 32 of 1 sample.
  const ClusterModel c = cluster({1e12, 1e12}, {64 * kGiB, 60e6});
  const PlannerInput in = input(c, costs(c, 4), 64, "data");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.ranks[1].memory_strategies == std::vector{MemoryStrategy::optimizer_sharding, MemoryStrategy::micro_batches});
  CHECK(p.ranks[1].optimizer_shard == 0);
  CHECK(p.ranks[0].optimizer_shard == 1 - p.ranks[1].optimizer_shard);
  CHECK(p.layout.micro_batches[1] == 6);
  CHECK(p.ranks[1].memory.total() <= 60e6);
}

TEST_CASE("planner: in data parallelism a short rank gets more micro-batches, not recompute") {
  // One sample in flight at a time: recomputation would add the input to what it holds.
  const ClusterModel c = cluster({1e12, 1e12}, {64 * kGiB, 4 * 1e6 * 16 + 20e6});
  const PlannerInput in = input(c, costs(c, 4), 64, "data");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.ranks[1].memory_strategies == std::vector{MemoryStrategy::micro_batches});
  CHECK_FALSE(p.ranks[1].recompute);
  // 32 samples x 4 MB = 128 MB; with one block's 4 MB of gradients while accumulating,
  // 4 x 4 MB = 16 MB fit beside the 64 MB of state.
  CHECK(p.layout.micro_batches[1] == 8);
  CHECK_FALSE(p.baseline.fits);
  REQUIRE(p.baseline.shortfalls.size() == 1);
  CHECK(p.baseline.shortfalls[0].rank == 1);
  CHECK(p.baseline.shortfalls[0].need.total() > p.baseline.shortfalls[0].capacity);
  CHECK_FALSE(p.baseline.shortfalls[0].after_strategies);
  // A whole model beyond any rank, with no partner to shard with across a pipeline: no plan.
  const ClusterModel tiny = cluster({1e12, 1e12}, {16e6, 16e6});
  try {
    make_plan(input(tiny, costs(tiny, 4), 64));
    FAIL("expected NoPlanFits");
  } catch (const NoPlanFits& e) {
    CHECK(contains(e.what(), "no plan fits"));
    CHECK(e.world == 2);
    CHECK(e.strategy == "auto");
    REQUIRE(!e.shapes.empty());
    // Every shape tried, one per rank and stage count, each with its reason.
    for (const RuledOutShape& shape : e.shapes)
      if (shape.problem.kind == LayoutProblemKind::memory)
        CHECK(shape.problem.shortfall.need.total() > shape.problem.shortfall.capacity);
    CHECK(std::any_of(e.shapes.begin(), e.shapes.end(),
                      [](const RuledOutShape& s) { return s.stages == 1 && s.replicas == 2; }));
  }
}

TEST_CASE("planner: a fast rank whose memory holds fewer samples than its speed earns takes what fits, the rest go to the others") {
  // Rank 0 twice as fast (43 of 64 samples by speed) holds its weights and gradients
  // (16 MB) and 5 MB more: 2 samples of 2 MB at one micro-batch; more micro-batches add
  // a block's gradients (4 MB, and 2 MB a sample: 6), and sharding leaves it no
  // optimiser state to shed. Before, the layout was refused for rank 0's 43 samples.
  const ClusterModel c = cluster({2e12, 1e12}, {16e6 + 5e6, 64 * kGiB});
  const PlannerInput in = input(c, costs(c, 2), 64, "data");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CAPTURE(p.ranks[0].micro_batches);
  CAPTURE(p.ranks[0].optimizer_shard);
  CHECK(p.ranks[0].samples == 2);
  CHECK(p.ranks[0].micro_batches == 1);
  CHECK(p.ranks[1].samples == 62);
}

TEST_CASE("planner: a share of many samples gets the least micro-batch count that fits, at most kMaxMicroBatches") {
  // As above, micro-batches of 4 fit rank 1 and 5 do not; its share of 80,000 samples
  // needs thousands of them (past the counts tried one by one: bisected).
  const ClusterModel c = cluster({1e12, 1e12}, {64 * kGiB, 4 * 1e6 * 16 + 20e6});
  const BlockCosts k = costs(c, 4);
  const PlannerInput in = input(c, k, 80000, "data");
  const Plan p = make_plan(in);
  check_plan(p);
  const RankPlan& r = p.ranks[1];
  const int m = p.layout.micro_batches[static_cast<size_t>(r.replica)];
  CHECK(m > 4096);
  CHECK(m <= kMaxMicroBatches);
  CHECK(r.memory.total() <= r.device.memory_bytes);
  RankPlan fewer = r;
  fewer.micro_batches = m - 1;
  fewer.micro_batch_size = (r.samples + m - 2) / (m - 1);
  CHECK(rank_memory(p, k, fewer).total() > r.device.memory_bytes);
  // At most 2^16 micro-batches a step, and 16 samples a micro-batch between the two ranks
  // however the optimiser state is sharded: of 84 MB a rank keeping share s of it holds
  // 32 MB of weights and gradients, 32s MB of state, a block's 4 MB of gradients while
  // accumulating, and 12 - 8s samples of 4 MB (the other 4 + 8s). So at most 1,048,576
  // samples a step. (800,000 fit since shares are capped by memory: 262,144 on the rank
  // keeping the state, 537,856 on the other.)
  const ClusterModel small = cluster({1e12, 1e12}, {4 * 1e6 * 16 + 20e6, 4 * 1e6 * 16 + 20e6});
  try {
    make_plan(input(small, costs(small, 4), 1200000, "data"));
    FAIL("expected NoPlanFits");
  } catch (const NoPlanFits& e) {
    CHECK(contains(e.what(), "no plan fits"));
    REQUIRE(!e.shapes.empty());
    for (const RuledOutShape& shape : e.shapes)
      if (shape.problem.kind == LayoutProblemKind::memory)
        CHECK(shape.problem.shortfall.micro_batches <= kMaxMicroBatches);
  }
}

TEST_CASE("planner: under auto a fast rank behind a slow link is left idle, as a slow rank is") {
  // Four equal ranks; rank 3's links take 50 ms and carry 1 KB/s: its share of the
  // all-reduce would take hours, and no cut of the speed order (all equal) leaves it out.
  ClusterModel c = cluster({1e12, 1e12, 1e12, 1e12}, {64 * kGiB, 64 * kGiB, 64 * kGiB, 64 * kGiB});
  for (size_t j = 0; j < 3; ++j) {
    set_latency(c, 3, j, 0.05);
    set_bandwidth(c, 3, j, 1e3);
  }
  const PlannerInput in = input(c, costs(c, 4), 64);
  const Plan p = make_plan(in);
  check_plan(p);
  CHECK(p.ranks[3].replica < 0);
  for (int r = 0; r < 3; ++r) CHECK(p.ranks[r].replica >= 0);
  CHECK(p.predicted.step_seconds < 10);
  const auto idle = std::find_if(p.notes.begin(), p.notes.end(),
                                 [](const PlanNote& n) { return n.kind == NoteKind::idle_ranks; });
  REQUIRE(idle != p.notes.end());
  CHECK(idle->ranks == std::vector<int>{3});
  CHECK(idle->other_seconds > 100 * idle->seconds);  // every rank: its link sets the pace
  // Asked to use every rank (parallel.strategy data), it does.
  CHECK(make_plan(input(c, costs(c, 4), 64, "data")).ranks[3].replica >= 0);
}

TEST_CASE("planner: a device that cannot hold the model gets fewer layers of a pipeline") {
  // Rank 1 holds 1.5 blocks of weight state: data parallel cannot place it (one replica
  // per rank, no sharding partner for all of it), the pipeline gives it one block.
  const double block_state = 1e6 * 16;
  const ClusterModel c = cluster({1e12, 1e12}, {64 * kGiB, 1.5 * block_state + 8e6});
  const PlannerInput in = input(c, costs(c, 4, 1e5), 32, "pipeline");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.ranks[1].block_end - p.ranks[1].block_begin == 1);
  CHECK_FALSE(p.baseline.fits);  // DDP: the whole model on rank 1
  CHECK(p.baseline.stage_ranges.size() == 1);  // DDP
  REQUIRE(p.baseline.shortfalls.size() == 1);
  CHECK(p.baseline.shortfalls[0].rank == 1);
  CHECK(p.baseline.shortfalls[0].block_begin == 0);
  CHECK(p.baseline.shortfalls[0].block_end == 4);
  // DeepSpeed's uniform split of the same shape gives rank 1 two blocks: also too many.
  const auto note = std::find_if(p.notes.begin(), p.notes.end(),
                                 [](const PlanNote& n) { return n.kind == NoteKind::uniform_baseline; });
  REQUIRE(note != p.notes.end());
  CHECK(note->stages == 2);
  REQUIRE(note->problem);
  CHECK(note->problem->shortfall.rank == 1);
  CHECK(note->problem->shortfall.block_begin == 2);
  CHECK(note->problem->shortfall.block_end == 4);
}

TEST_CASE("planner: the pipeline split counts the other stages' weights that rank 0 holds") {
  // Rank 0 twice as fast, 3 blocks of 16 MB of state (4 MB of weights), 1 MB of
  // activations a sample, 2 samples in 2 micro-batches, 39 MB each. The fastest split
  // gives rank 0 two blocks: 32 MB + 4 MB of activations (stage 0 holds two micro-batches)
  // fit its stage alone, but rank 0 also holds the third block's weights and one block's
  // gradients while it accumulates: 44 MB. Rank 0 on one block needs 30 MB (16 + 4 + 2 +
  // the other two blocks' 8), rank 1 on two 38 MB: the only plan, which a split blind to
  // rank 0's extra weights never tried.
  const ClusterModel c = cluster({2e12, 1e12}, {39e6, 39e6});
  const PlannerInput in = input(c, costs(c, 3, 1e6), 2, "pipeline");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  const RankPlan& r0 = p.ranks[0];
  CHECK(r0.block_end - r0.block_begin == 1);
  CHECK(r0.memory.params == doctest::Approx(12e6));  // the whole model's weights
  CHECK(p.ranks[1].block_end - p.ranks[1].block_begin == 2);
}

TEST_CASE("planner: a GPU rank 0 streams the other stages' weights from host memory, holding the largest") {
  // 4 blocks, rank 0 half as fast: its stage is one block (16 MB of state, 2 MB of
  // activations, 4 MB of gradients while it accumulates: 22 MB). Holding the other three
  // blocks' weights (12 MB) it needs 34 MB of its 30; streaming them one at a time to
  // evaluate, the largest (4 MB): 26 MB.
  ClusterModel c = cluster({1e12, 2e12}, {30e6, 64 * kGiB});
  CHECK_THROWS_AS(make_plan(input(c, costs(c, 4, 1e6), 2, "pipeline")), NoPlanFits);
  c.ranks[0].kind = DeviceKind::cuda;
  const PlannerInput in = input(c, costs(c, 4, 1e6), 2, "pipeline");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.ranks[0].block_end - p.ranks[0].block_begin == 1);
  CHECK(p.ranks[0].memory.params == doctest::Approx(4e6 + 4e6));  // its own block's and one other's
  CHECK(p.ranks[0].memory.total() <= 30e6);
  // What its host keeps: the other three blocks' weights (12 MB) and, as a checkpoint
  // streams the optimizer state through it, one block's (1e6 parameters x 8 bytes); rank
  // 1 releases the block outside its stage as it is built. This cluster gives no host memory: the note
  // says so and names the rank keeping the most. Both are kept in the plan file.
  CHECK(p.ranks[0].host.other_weights == doctest::Approx(3 * 4e6));
  CHECK(p.ranks[0].host.checkpoint_state == doctest::Approx(1e6 * in.costs.optimizer_bytes_per_param));
  CHECK(p.ranks[0].host.device == 0);
  CHECK(p.ranks[1].host.total() == 0);
  const auto host = std::find_if(p.notes.begin(), p.notes.end(), [](const PlanNote& n) { return n.kind == NoteKind::host_memory; });
  REQUIRE(host != p.notes.end());
  CHECK(host->ranks == std::vector<int>{0});
  CHECK(host->bytes == doctest::Approx(p.ranks[0].host.total()));
  CHECK(host->other_bytes == 0);
  CHECK(report::note_text(*host).find("so it was not checked") != std::string::npos);
  const Plan back = plan_from_json(plan_to_json(p), "plan.json");
  CHECK(std::count_if(back.notes.begin(), back.notes.end(),
                      [&](const PlanNote& n) { return n.kind == NoteKind::host_memory && n.bytes == host->bytes && n.ranks == host->ranks; }) == 1);
  CHECK(back.ranks[0].host.checkpoint_state == p.ranks[0].host.checkpoint_state);
  // A data-parallel plan of CPU ranks keeps the whole model on every device, and rank 0
  // writes its own optimizer state from where it is: nothing beside it.
  const Plan data = make_plan(input(cluster({1e12, 1e12}, {64 * kGiB, 64 * kGiB}), costs(c, 4, 1e6), 2, "data"));
  CHECK(std::none_of(data.notes.begin(), data.notes.end(), [](const PlanNote& n) { return n.kind == NoteKind::host_memory; }));
}

TEST_CASE("planner: every host holds what its ranks keep beside their devices, summed over its ranks") {
  // Two GPU ranks, 4 blocks of 1e6 parameters, as a pipeline of 2 + 2 blocks. Rank 0
  // keeps blocks 2-3's weights (8e6) and, as a checkpoint streams the optimizer state
  // through it, one block's (1e6 x 8 = 8e6): 16e6; rank 1 releases blocks 0-1's weights
  // as they are built. A third rank, idle in a one-stage plan, keeps the whole model's
  // (16e6).
  const auto two_gpus = [](const std::string& host0, const std::string& host1, double memory) {
    ClusterModel c = cluster({1e12, 1e12}, {64 * kGiB, 64 * kGiB});
    for (DeviceModel& d : c.ranks) {
      d.kind = DeviceKind::cuda;
      d.host_memory_bytes = memory;
    }
    c.ranks[0].host = host0;
    c.ranks[1].host = host1;
    return c;
  };
  const ClusterModel roomy = two_gpus("h", "h", 17e6);
  const PlannerInput in = input(roomy, costs(roomy, 4, 1e6), 8, "pipeline");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  REQUIRE(p.stage_ranges == std::vector<std::pair<int, int>>{{0, 2}, {2, 4}});
  REQUIRE(p.ranks[0].block_begin == 0);
  CHECK(p.ranks[0].host.total() == doctest::Approx(16e6));
  CHECK(p.ranks[1].host.total() == 0);
  const auto note = std::find_if(p.notes.begin(), p.notes.end(), [](const PlanNote& n) { return n.kind == NoteKind::host_memory; });
  REQUIRE(note != p.notes.end());
  CHECK(note->ranks == std::vector<int>{0, 1});
  CHECK(note->bytes == doctest::Approx(16e6));
  CHECK(note->other_bytes == doctest::Approx(17e6));
  // One byte less than that on their host: refused, naming the host, the rank keeping the
  // most and its parts.
  const ClusterModel tight = two_gpus("h", "h", 16e6 - 1);
  try {
    make_plan(input(tight, costs(tight, 4, 1e6), 8, "pipeline"));
    FAIL("expected NoPlanFits");
  } catch (const NoPlanFits& e) {
    REQUIRE(!e.shapes.empty());
    const Shortfall& s = e.shapes[0].problem.shortfall;
    REQUIRE(e.shapes[0].problem.kind == LayoutProblemKind::memory);
    CHECK(s.host);
    CHECK(s.rank == 0);
    CHECK(s.host_name == "h");
    CHECK(s.capacity == 16e6 - 1);
    CHECK(s.host_need.other_weights == doctest::Approx(8e6));
    CHECK(s.host_need.checkpoint_state == doctest::Approx(8e6));
    CHECK(s.host_others == 0);
    CHECK(report::shortfall_text(s) ==
          "rank 0 (dev0) fits its device, but its host h's memory, 15.3 MiB, cannot hold the 15.3 MiB it keeps there: "
          "7.6 MiB of weights of blocks outside its stage and 7.6 MiB of one block's optimizer state as a checkpoint "
          "streams; 1 B short");
    // A plan file's shortfall keeps the host's figures.
    const Shortfall back = read_shortfalls(shortfalls_json({s}), "shortfalls").at(0);
    CHECK(back.host);
    CHECK(back.host_name == "h");
    CHECK(back.host_need.total() == s.host_need.total());
    CHECK(back.host_others == s.host_others);
    CHECK(back.capacity == s.capacity);
  }
  // Data parallel keeps the whole model on each device, and nothing beside it but rank 0's
  // copy of one block's optimizer state off its GPU as a checkpoint streams (which 1 byte
  // less room refuses); an idle rank keeps all of it in host memory (a relayout may bring
  // it in).
  const Plan data = make_plan(input(two_gpus("h", "h", 8e6), costs(tight, 4, 1e6), 8, "data"));
  CHECK(data.ranks[0].host.total() == doctest::Approx(8e6));
  CHECK(data.ranks[0].host.checkpoint_state == doctest::Approx(8e6));
  CHECK(data.ranks[1].host.total() == 0);
  CHECK_THROWS_AS(make_plan(input(two_gpus("h", "h", 8e6 - 1), costs(tight, 4, 1e6), 8, "data")), NoPlanFits);
  RankPlan idle = data.ranks[1];
  idle.replica = idle.stage = -1;
  idle.block_begin = idle.block_end = 0;
  idle.samples = 0;
  CHECK(host_memory(data, in.costs, idle).other_weights == doctest::Approx(16e6));
  // In a plan of several stages it releases them, idle or not.
  CHECK(host_memory(p, in.costs, idle).total() == 0);
}

TEST_CASE("planner: an idle rank 0 still holds the whole model's weights, which must fit it") {
  // Rank 0's links take 50 ms and carry 1 KB/s, so under auto it is left idle; it still
  // evaluates and checkpoints, with all 4 blocks' weights (16 MB) on its device.
  const auto slow_rank0 = [](double memory) {
    ClusterModel c = cluster({1e12, 1e12, 1e12, 1e12}, {memory, 64 * kGiB, 64 * kGiB, 64 * kGiB});
    for (size_t j = 1; j < 4; ++j) {
      set_latency(c, 0, j, 0.05);
      set_bandwidth(c, 0, j, 1e3);
    }
    return c;
  };
  const ClusterModel roomy = slow_rank0(64 * kGiB);
  const Plan p = make_plan(input(roomy, costs(roomy, 4), 64));
  check_plan(p);
  REQUIRE(p.ranks[0].replica < 0);
  CHECK(p.ranks[0].memory.params == doctest::Approx(16e6));
  CHECK(p.ranks[0].memory.total() == doctest::Approx(16e6));
  CHECK(p.ranks[1].memory.params == doctest::Approx(16e6));  // its own replica's
  // A GPU rank 0 keeps them in host memory and streams one block at a time through its
  // device to evaluate: idle, it holds the largest block's weights (4 MB).
  ClusterModel gpu = slow_rank0(64 * kGiB);
  gpu.ranks[0].kind = DeviceKind::cuda;
  const Plan g = make_plan(input(gpu, costs(gpu, 4), 64));
  REQUIRE(g.ranks[0].replica < 0);
  CHECK(g.ranks[0].memory.total() == doctest::Approx(4e6));
  // 10 MB: neither idle nor in any layout can rank 0 hold them; the refusal says so.
  const ClusterModel small = slow_rank0(10e6);
  try {
    make_plan(input(small, costs(small, 4), 64));
    FAIL("expected NoPlanFits");
  } catch (const NoPlanFits& e) {
    const auto idle = std::find_if(e.shapes.begin(), e.shapes.end(), [](const auto& s) {
      return s.problem.kind == LayoutProblemKind::memory && s.problem.shortfall.idle;
    });
    REQUIRE(idle != e.shapes.end());
    CHECK(idle->problem.shortfall.rank == 0);
    CHECK(idle->problem.shortfall.need.total() == doctest::Approx(16e6));
    CHECK(report::shortfall_text(idle->problem.shortfall) ==
          "rank 0 (dev0, 9.5 MiB), idle in this layout, still evaluates and checkpoints the whole model, which "
          "needs 15.3 MiB of its memory for weights, 5.7 MiB short; a rank with room for them must be rank 0");
  }
}

TEST_CASE("planner: rank 0 must hold its evaluation's batch beside its weights and optimizer state") {
  // One rank of 64 MB, 2 blocks of 1e6 parameters: weights 8 MB, AdamW state 16 MB, and
  // between steps (when rank 0 evaluates) no gradients or activations. At 1 MB a sample
  // and 1 KiB beside (BlockCosts::kEvalFixedBytes), 39 samples fit (63.0 MB and 1 KiB);
  // 40 do not (64 MB and 1 KiB), and the refusal names the batch that fits.
  const ClusterModel c = cluster({1e12}, {64e6});
  BlockCosts k = costs(c, 2, 1e4);
  k.eval_bytes_per_sample = 1e6;
  k.eval_batch = 39;
  const Plan p = make_plan(input(c, k, 16, "data"));
  CHECK(p.ranks[0].memory.params + p.ranks[0].memory.optimizer == doctest::Approx(24e6));
  CHECK(!fit_evaluation(p, k));
  k.eval_batch = 0;  // not checked
  CHECK(!fit_evaluation(p, k));
  k.eval_batch = 40;
  const std::optional<Shortfall> direct = fit_evaluation(p, k);
  REQUIRE(direct);
  CHECK(direct->eval_fits == 39);
  const Shortfall s = only_memory_shortfall(input(c, k, 16, "data"));
  CHECK(s.evaluation);
  CHECK(s.rank == 0);
  CHECK(s.eval_batch == 40);
  CHECK(s.eval_fits == 39);
  CHECK(s.need.grads == 0);
  CHECK(s.need.total() == doctest::Approx(64e6 + 1024));
  CHECK(report::shortfall_text(s) ==
        "rank 0 (dev0, 61.0 MiB) trains in its memory but cannot evaluate the whole model in batches of 40 "
        "(train.eval_batch_size, at most eval_max_samples): 61.0 MiB (params 7.6 MiB, optimizer 15.3 MiB, "
        "evaluation 38.1 MiB), 1.0 KiB short; set train.eval_batch_size to at most 39 in this layout");
  // A plan file's shortfall keeps the evaluation's figures.
  const Shortfall back = read_shortfalls(shortfalls_json({s}), "shortfalls").at(0);
  CHECK(back.evaluation);
  CHECK(back.eval_batch == 40);
  CHECK(back.eval_fits == 39);
  CHECK(report::shortfall_text(back) == report::shortfall_text(s));
  // A GPU rank 0 evaluates at the fused-attention figure (nn::Block's): at 0.5 MB a
  // sample, 40 fit.
  ClusterModel gpu = c;
  gpu.ranks[0].kind = DeviceKind::cuda;
  k.eval_fused_bytes_per_sample = 0.5e6;
  const Plan g = make_plan(input(gpu, k, 16, "data"));
  CHECK(!fit_evaluation(g, k));
  // Where even one sample does not fit, it says so.
  k.eval_bytes_per_sample = 50e6;
  const std::optional<Shortfall> none = fit_evaluation(p, k);
  REQUIRE(none);
  CHECK(none->eval_fits == 0);
  CHECK(report::shortfall_text(*none).find("even one sample does not fit: rank 0 needs more memory") != std::string::npos);
}

TEST_CASE("planner: bad inputs get errors naming the numbers") {
  const ClusterModel c = cluster({1e12, 1e12, 1e12, 1e12}, std::vector(4, 64 * kGiB));
  try {
    make_plan(input(c, costs(c, 4), 3, "data"));
    FAIL("expected NoPlanFits");
  } catch (const NoPlanFits& e) {
    CHECK(e.strategy == "data");
    REQUIRE(e.shapes.size() == 1);
    CHECK(e.shapes[0].problem.kind == LayoutProblemKind::batch_below_replicas);
    CHECK(e.shapes[0].problem.global_batch == 3);
    CHECK(e.shapes[0].problem.replicas == 4);
    CHECK(std::string(e.what()) ==
          "planner: the global batch, 3, is smaller than the data-parallel replicas, 4 (one sample each at least)");
  }
  // auto still plans: a pipeline or hybrid needs fewer replicas than samples.
  const Plan p = make_plan(input(c, costs(c, 4), 3));
  CHECK(p.layout.replicas.size() <= 3);
  ClusterModel no_memory = c;
  no_memory.ranks[2].memory_bytes = 0;
  CHECK(contains(error_of([&] { make_plan(input(no_memory, costs(c, 4), 8)); }),
                 "rank 2 (dev2) has memory 0 bytes"));
}

TEST_CASE("planner: a rank far slower on every link is marked for the slow-link policy") {
  ClusterModel c = cluster({1e12, 1e12, 1e12, 1e12}, std::vector(4, 64 * kGiB), 1e-5, 1e10);
  for (size_t j = 0; j < 4; ++j)
    if (j != 3) set_latency(c, 3, j, 5e-3);
  const Plan p = make_plan(input(c, costs(c, 4), 64));
  for (const RankPlan& r : p.ranks) CHECK(r.slow_link == (r.rank == 3));
  // 1 MiB at 10 GB/s plus 5 ms against the others' 10 us: 49x.
  CHECK(p.ranks[3].link_seconds == doctest::Approx(5e-3 + (1 << 20) / 1e10));
  CHECK(p.ranks[3].cluster_link_seconds == doctest::Approx(1e-5 + (1 << 20) / 1e10));
  CHECK(p.sync_policy == plan::SyncPolicy::synchronous);
}

TEST_CASE("planner: ranks are left idle only when that is predicted at least 10% faster") {
  // A fast rank and one at half its speed, over links from slow to fast: the all-reduce
  // the second rank adds costs from far more than its compute is worth to nothing.
  int idle = 0, kept_though_slower = 0;
  for (double bandwidth = 2e8; bandwidth < 2e11; bandwidth *= 1.25) {
    CAPTURE(bandwidth);
    const ClusterModel c = cluster({2e12, 1e12}, std::vector(2, 64 * kGiB), 1e-5, bandwidth);
    const BlockCosts k = costs(c, 4, 1e6, 2e6);  // 2 MB between blocks: no cheap pipeline
    const Plan chosen = make_plan(input(c, k, 16));
    const double all = std::min(make_plan(input(c, k, 16, "data")).predicted.step_seconds,
                                make_plan(input(c, k, 16, "pipeline")).predicted.step_seconds);
    const ClusterModel one_rank = cluster({2e12}, {64 * kGiB});
    const double alone = make_plan(input(one_rank, costs(one_rank, 4, 1e6, 2e6), 16)).predicted.step_seconds;
    const bool left_idle = chosen.ranks[1].replica < 0;
    CHECK(left_idle == (alone < 0.9 * all));
    idle += left_idle;
    kept_though_slower += !left_idle && alone < all;
  }
  CHECK(idle > 0);                // slow links: rank 0 alone
  CHECK(kept_though_slower > 0);  // within the margin: both ranks, though predicted slower
}

TEST_CASE("planner: strategy equal is the baseline itself") {
  const ClusterModel c = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB));
  const PlannerInput in = input(c, costs(c, 4), 128, "equal");
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.strategy == Strategy::equal);
  CHECK(p.layout.samples == std::vector<int64_t>{32, 32, 32, 32});
  CHECK(p.speedup == 1);
}

TEST_CASE("planner: a GPU beside two CPUs trains alone when the CPUs cannot pay for the all-reduce") {
  namespace fs = std::filesystem;
  fs::path root = fs::current_path();
  while (!fs::exists(root / "configs/devices.json") && root.has_parent_path() && root != root.parent_path())
    root = root.parent_path();
  const ClusterModel c = cluster_from_synth("synth:1xrtx4090,2xcpu-16c", (root / "configs/devices.json").string());
  const nn::Sequential model = models::build_cnn({}, 1);
  PlannerInput in;
  in.cluster = c;
  in.costs = block_costs(model, c, config::OptimizerConfig{});
  in.global_batch = 128;
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  // Each CPU would add about 2% of the GPU's compute but an all-reduce over PCIe.
  CHECK(p.ranks[0].samples == 128);
  CHECK(p.ranks[1].replica == -1);
  CHECK(p.ranks[2].replica == -1);
  REQUIRE(p.notes.size() >= 2);
  CHECK(p.notes[0].kind == NoteKind::work_by_device);
  REQUIRE(p.notes[0].work.size() == 1);
  CHECK(p.notes[0].work[0].device == "rtx4090");
  CHECK(p.notes[0].work[0].ranks == 1);
  CHECK(p.notes[0].work[0].fraction == 1);
  CHECK(p.notes[1].kind == NoteKind::idle_ranks);
  CHECK(p.notes[1].ranks == std::vector{1, 2});
  CHECK(p.notes[1].world == 3);
  CHECK(p.notes[1].seconds == p.predicted.step_seconds);
  CHECK(p.notes[1].other_seconds > p.notes[1].seconds / (1 - 0.10));
  // Forced to data parallel over all three, the GPU still takes the large majority.
  in.strategy = config::ParallelStrategy::data;
  const Plan dp = make_plan(in);
  check_fits_and_agrees(dp, in);
  REQUIRE(dp.notes[0].kind == NoteKind::work_by_device);
  REQUIRE(dp.notes[0].work.size() == 2);
  CHECK(dp.notes[0].work[0].device == "rtx4090");
  CHECK(dp.notes[0].work[0].fraction > 0.9);
  CHECK(dp.notes[0].work[0].fraction < 1);
  CHECK(dp.notes[0].work[1].ranks == 2);
  CHECK(dp.predicted.step_seconds > p.predicted.step_seconds);
}

TEST_CASE("plan file: round trip, and malformed files name the problem") {
  const ClusterModel c = cluster({2e13, 2e13, 1e13, 1e13}, std::vector(4, 64 * kGiB), 2e-3, 2e9);
  const Plan p = make_plan(input(c, costs(c, 6), 64));
  const std::string text = plan_to_json(p);
  const Plan q = plan_from_json(text, "plan.json");
  CHECK(plan_to_json(q) == text);
  CHECK(q.layout.replicas == p.layout.replicas);
  CHECK(plan_schedules(q).size() == 4);

  auto error = [](const std::string& t) {
    try {
      plan_from_json(t, "bad.json");
    } catch (const config::ConfigError& e) {
      return std::string(e.what());
    }
    FAIL_CHECK("expected a ConfigError");
    return std::string();
  };
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  CHECK(contains(error("{"), "bad.json"));
  CHECK(contains(error(edit("\"hetrain-plan/2\"", "\"hetrain-plan/9\"")), "format"));
  CHECK(contains(error(edit("\"hetrain-plan/2\"", "\"hetrain-plan/1\"")),
                 "format: \"hetrain-plan/1\" is an older plan format; expected \"hetrain-plan/2\": make the plan again"));
  CHECK(contains(error(edit("\"world_size\": 4", "\"world_size\": 5")),
                 "not a consistent plan: the plan has 4 ranks but world_size 5"));
  CHECK(contains(error(edit("\"global_batch\": 64", "\"global_batch\": 65")),
                 "samples sum to 64 but global_batch is 65"));
  CHECK(contains(error(edit("\"blocks\": 6", "\"blocks\": \"six\"")), "blocks"));
  CHECK(contains(error(edit("\"speedup\"", "\"speed_up\"")), "speedup: missing"));
  REQUIRE(p.layout.replicas.size() == 2);
  CHECK(contains(error(edit("\"reduce_owner\": -1", "\"reduce_owner\": 2")),
                 "layout.reduce_owner is 2; expected -1 (parts in proportion to the shares) or a replica, 0 to 1"));
  CHECK(plan_from_json(edit("\"reduce_owner\": -1", "\"reduce_owner\": 1"), "hub.json").layout.reduce_owner == 1);
  {  // more stages than the replicas hold: refused before a schedule indexes a replica by stage (a segfault)
    nlohmann::json more = nlohmann::json::parse(text);
    auto& ranges = more["stage_ranges"];
    const size_t stages = ranges.size();
    const int b = ranges[0][0], e = ranges[0][1];
    REQUIRE(e - b >= 2);
    ranges[0][1] = b + 1;
    ranges.insert(ranges.begin() + 1, nlohmann::json::array({b + 1, e}));
    CHECK(contains(error(more.dump()), "layout.replicas[0] has " + std::to_string(stages) +
                                           " stages but stage_ranges has " + std::to_string(stages + 1)));
  }
  nlohmann::json old = nlohmann::json::parse(text);  // a plan from before the field
  old["layout"].erase("reduce_owner");
  CHECK(plan_from_json(old.dump(), "old.json").layout.reduce_owner == -1);
  // Notes and memory steps are {kind, that kind's fields}: a field of another kind, an
  // unknown kind and a bad value are refused, naming the path.
  nlohmann::json facts = nlohmann::json::parse(text);
  REQUIRE(facts["notes"][0]["kind"] == "work_by_device");
  facts["notes"][0]["stages"] = 2;
  CHECK(contains(error(facts.dump()), "notes[0].stages"));
  facts = nlohmann::json::parse(text);
  facts["notes"][0]["kind"] = "gossip";
  CHECK(contains(error(facts.dump()), "notes[0].kind"));
  facts = nlohmann::json::parse(text);
  facts["ranks"][1]["memory_steps"] = {{{"kind", "recompute"}, {"activations_before", -1}}};
  CHECK(contains(error(facts.dump()), "ranks[1].memory_steps[0].activations_before"));
  facts["ranks"][1]["memory_steps"] = {{{"kind", "recompute"}, {"capacity", 5}}};
  CHECK(contains(error(facts.dump()), "ranks[1].memory_steps[0].capacity"));
  facts["ranks"][1]["memory_steps"] = {{{"kind", "micro_batches"}, {"micro_batches", 4}, {"micro_batch_size", 8},
                                        {"activations_before", 64}, {"activations_after", 32}}};
  facts["ranks"][1]["memory_strategies"] = {"micro-batches"};
  const Plan stepped = plan_from_json(facts.dump(), "facts.json");
  REQUIRE(stepped.ranks[1].memory_steps.size() == 1);
  CHECK(stepped.ranks[1].memory_steps[0].micro_batches == 4);
  CHECK(stepped.ranks[1].memory_strategies == std::vector{MemoryStrategy::micro_batches});
  CHECK(plan_to_json(plan_from_json(plan_to_json(stepped), "again.json")) == plan_to_json(stepped));
  facts["ranks"][1]["memory_strategies"] = {"swap to disk"};
  CHECK(contains(error(facts.dump()), "ranks[1].memory_strategies[0]"));
  // Optimiser shards: a stage's must sum to 1 once any is below 1.
  nlohmann::json shard = nlohmann::json::parse(text);
  const int stage0_rank = p.layout.replicas[0][0], partner = p.layout.replicas[1][0];
  shard["ranks"][stage0_rank]["optimizer_shard"] = 0.25;
  CHECK(contains(error(shard.dump()), "stage 0's ranks keep optimizer_shard fractions that sum to 1.25; expected 1"));
  shard["ranks"][partner]["optimizer_shard"] = 0.75;
  const Plan sharded = plan_from_json(shard.dump(), "sharded.json");
  CHECK(optimizer_shards(sharded, 0) == std::vector<double>{0.25, 0.75});
  CHECK(stage_reduce_parts(sharded, sharded.layout, 0) == std::vector<double>{0.25, 0.75});
  CHECK(optimizer_shards(sharded, 1).empty());
  // A micro-batch trial's alternate counts travel with the plan, one per replica.
  nlohmann::json trial = nlohmann::json::parse(text);
  trial["layout"]["alternate_micro_batches"] = {2, 0};
  CHECK(plan_from_json(trial.dump(), "trial.json").layout.alternate_micro_batches == std::vector<int>{2, 0});
  CHECK(contains(plan_to_json(plan_from_json(trial.dump(), "trial.json")), "\"alternate_micro_batches\""));
  CHECK_FALSE(contains(text, "alternate_micro_batches"));
  trial["layout"]["alternate_micro_batches"] = {2};
  CHECK(contains(error(trial.dump()), "the layout has 1 alternate_micro_batches for 2 replicas"));
  trial["layout"]["alternate_micro_batches"] = {2, 1000};
  CHECK(contains(error(trial.dump()), "replica 1 alternates with 1000 micro-batches but has"));
}

TEST_CASE("plan: stage memory follows the 1F1B in-flight count and the strategies") {
  const ClusterModel c = cluster({1e12}, {64 * kGiB});
  const BlockCosts k = costs(c, 4);
  const StageFootprint f = stage_footprint(k, 1, 3);
  CHECK(f.params == 2e6);
  CHECK(f.activation_bytes == 2e6);
  CHECK(f.checkpoint_bytes == 65536);  // block 1's input
  StageMemoryParams s;
  s.stage = 0;
  s.stages = 3;
  s.micro_batch_size = 4;
  s.micro_batches = 8;  // min(3 - 0, 8) = 3 in flight
  CHECK(stage_memory(f, s).activations == 3 * 4 * 2e6);
  s.recompute = true;
  CHECK(stage_memory(f, s).activations == 3 * 4 * 65536 + 4 * 2e6);
  s.optimizer_shard = 0.25;
  const MemoryUse m = stage_memory(f, s);
  CHECK(m.params == 8e6);
  CHECK(m.grads == 12e6);  // and one block's more while accumulating over micro-batches
  CHECK(m.optimizer == 0.25 * 16e6);
  s.micro_batches = 1;
  CHECK(stage_memory(f, s).grads == 8e6);
}

TEST_CASE("executor: replicas of a stage must report the same parameter checksum") {
  const Plan p = hybrid_skeleton(64 * kGiB);  // replicas {0, 1} and {2, 3}
  runtime::check_replicas_identical(p, {"aa", "bb", "aa", "bb"}, 50);  // stage 0: 0, 2; stage 1: 1, 3
  const std::string msg =
      error_of([&] { runtime::check_replicas_identical(p, {"aa", "bb", "aa", "cc"}, 50); });
  CHECK(contains(msg, "replicas diverged by step 50: stage 1 has parameter checksum bb on rank 1 "
                      "but cc on rank 3"));
}

TEST_CASE("plan costs: the two-round all-reduce model, by hand") {
  const ClusterModel c = cluster({1e12, 1e12, 1e12, 1e12}, std::vector(4, 64 * kGiB), 1e-5, 1e9);
  // Equal parts: each rank moves max(1 - 1/4, 3 x 1/4) of 4 MB = 3 MB per round at 1 GB/s.
  CHECK(weighted_allreduce_seconds(c, {0, 1, 2, 3}, {0.25, 0.25, 0.25, 0.25}, 4e6) ==
        doctest::Approx(2 * (1e-5 + 3e-3)));
  // A half owner moves 3 x 1/2 = 1.5 x the bytes: the round takes 6 ms.
  CHECK(weighted_allreduce_seconds(c, {0, 1, 2, 3}, {0.5, 0.2, 0.2, 0.1}, 4e6) ==
        doctest::Approx(2 * (1e-5 + 6e-3)));
  // Slowest link of the group sets the round; one rank has nothing to reduce with.
  ClusterModel slow = c;
  set_bandwidth(slow, 2, 3, 1e8);
  CHECK(weighted_allreduce_seconds(slow, {0, 2, 3}, {1.0 / 3, 1.0 / 3, 1.0 / 3}, 3e6) ==
        doctest::Approx(2 * (1e-5 + 2e6 / 1e8)));
  CHECK(weighted_allreduce_seconds(c, {1}, {1.0}, 4e6) == 0);
  // A rank at a fifth of a core per 10 ms answers (0.8^2 x 10 ms) / 2 = 3.2 ms late on
  // average, once per round; the group waits for its latest member.
  ClusterModel quota = c;
  quota.ranks[2].cpu_quota = 0.2;
  quota.ranks[2].cpu_quota_period_s = quota.ranks[3].cpu_quota_period_s = 0.01;
  quota.ranks[3].cpu_quota = 0.6;
  CHECK(wake_seconds(quota.ranks[2]) == doctest::Approx(3.2e-3));
  CHECK(wake_seconds(quota.ranks[0]) == 0);
  CHECK(weighted_allreduce_seconds(quota, {0, 1, 2, 3}, {0.25, 0.25, 0.25, 0.25}, 4e6) ==
        doctest::Approx(2 * (1e-5 + 3e-3 + 3.2e-3)));
  CHECK(weighted_allreduce_seconds(quota, {0, 3}, {0.5, 0.5}, 4e6) ==
        doctest::Approx(2 * (1e-5 + 2e-3 + 0.8e-3)));
  // One owner (a hub) moves 3 x 4 MB a round; round 1 waits only for the hub to wake,
  // round 2 for the latest member to take its sums.
  CHECK(weighted_allreduce_seconds(quota, {0, 1, 2, 3}, {1, 0, 0, 0}, 4e6) ==
        doctest::Approx(2 * (1e-5 + 12e-3) + 3.2e-3));
  CHECK(weighted_allreduce_seconds(quota, {0, 1, 2, 3}, {0, 0, 1, 0}, 4e6) ==
        doctest::Approx(2 * (1e-5 + 12e-3 + 3.2e-3)));
  // Members that own nothing never message each other: their link does not count (a
  // probe's ping-pong between two throttled ranks measures their wake as latency).
  ClusterModel apart = c;
  set_latency(apart, 2, 3, 5e-3);
  set_bandwidth(apart, 2, 3, 1e6);
  CHECK(weighted_allreduce_seconds(apart, {0, 1, 2, 3}, {1, 0, 0, 0}, 4e6) == doctest::Approx(2 * (1e-5 + 12e-3)));
  CHECK(weighted_allreduce_seconds(apart, {0, 1, 2, 3}, {0.25, 0.25, 0.25, 0.25}, 4e6) ==
        doctest::Approx(2 * (5e-3 + 3e6 / 1e6)));
}

TEST_CASE("plan costs: a hub owns the reduction where waking slow owners costs more than its bytes") {
  // Four data-parallel replicas of a small model (0.4 MB of gradients) on fast links.
  ClusterModel c = cluster({4e12, 2e12, 1e12, 1e12}, std::vector(4, 64 * kGiB), 1e-5, 5e9);
  BlockCosts k = costs(c, 4);
  for (size_t b = 0; b < 4; ++b) {
    k.params[b] = 25000;
    k.state_bytes[b] = 25000 * 16;
  }
  PlannerInput in = input(c, k, 128, "data");
  // Without quotas, parts by share move the fewest bytes.
  Plan p = make_plan(in);
  CHECK(p.layout.reduce_owner == -1);
  CHECK(cheapest_reduce_owner(p, k, c).owner == -1);
  // Under CPU quotas every owner would add its wake to both rounds; the largest replica
  // sums alone.
  for (size_t r = 0; r < 4; ++r) {
    in.cluster.ranks[r].cpu_quota = std::vector{0.8, 0.4, 0.2, 0.2}[r];
    in.cluster.ranks[r].cpu_quota_period_s = 0.01;
  }
  p = make_plan(in);
  const auto largest = std::max_element(p.layout.samples.begin(), p.layout.samples.end());
  CHECK(p.layout.reduce_owner == largest - p.layout.samples.begin());
  CHECK(reduce_parts(p.layout)[static_cast<size_t>(p.layout.reduce_owner)] == 1);
  check_fits_and_agrees(p, in);
  CHECK(std::any_of(p.notes.begin(), p.notes.end(), [&](const PlanNote& n) {
    return n.kind == NoteKind::hub_reduces && n.ranks == std::vector{p.layout.replicas[p.layout.reduce_owner][0]} &&
           n.seconds > 0 && n.seconds < n.other_seconds;
  }));
  // The optimiser steps cost nothing in this model: every rank steps its own.
  CHECK(!hub_steps_optimizer(p));
  // ... unless the hub cannot hold the other three replicas' gradients.
  p.ranks[static_cast<size_t>(p.layout.replicas[p.layout.reduce_owner][0])].device.memory_bytes =
      p.ranks[static_cast<size_t>(p.layout.replicas[p.layout.reduce_owner][0])].memory.total() + 1e5;
  CHECK(cheapest_reduce_owner(p, k, in.cluster).owner == -1);
  CHECK(cheapest_reduce_owner(p, k, in.cluster).hub_seconds == 0);
}

TEST_CASE("planner: the hub steps the optimizer for all when the others' steps are slower") {
  // The hub case above, with optimiser steps that take a rank under quota q 1 ms / q.
  ClusterModel c = cluster({4e12, 2e12, 1e12, 1e12}, std::vector(4, 64 * kGiB), 1e-5, 5e9);
  BlockCosts k = costs(c, 4);
  const std::vector<double> quota{0.8, 0.4, 0.2, 0.2};
  for (size_t r = 0; r < 4; ++r) {
    c.ranks[r].cpu_quota = quota[r];
    c.ranks[r].cpu_quota_period_s = 0.01;
    k.step_seconds[r].assign(4, 0.25e-3 / quota[r]);
  }
  for (size_t b = 0; b < 4; ++b) {
    k.params[b] = 25000;
    k.state_bytes[b] = 25000 * 16;
  }
  PlannerInput in = input(c, k, 128, "data");
  const Plan p = make_plan(in);
  REQUIRE(p.layout.reduce_owner >= 0);
  CHECK(hub_steps_optimizer(p));
  check_fits_and_agrees(p, in);
  for (size_t r = 0; r < p.layout.replicas.size(); ++r) {
    const RankPlan& rp = p.ranks[static_cast<size_t>(p.layout.replicas[r][0])];
    CAPTURE(r);
    CHECK(rp.optimizer_shard == (static_cast<int>(r) == p.layout.reduce_owner ? 1 : 0));
    CHECK((rp.memory.optimizer > 0) == (static_cast<int>(r) == p.layout.reduce_owner));
  }
  CHECK(stage_reduce_parts(p, p.layout, 0) == reduce_parts(p.layout));  // the hub's traffic
  const auto note = std::find_if(p.notes.begin(), p.notes.end(),
                                 [](const PlanNote& n) { return n.kind == NoteKind::hub_steps_optimizer; });
  REQUIRE(note != p.notes.end());
  CHECK(note->ranks == std::vector{p.layout.replicas[p.layout.reduce_owner][0]});
  CHECK(note->seconds == p.predicted.step_seconds);
  // Its prediction against every rank stepping: the slowest step (1.25 ms a block) leaves
  // the critical path for the hub's (0.31 ms).
  Plan every = p;
  set_hub_steps_optimizer(every, false);
  predict_plan(every, k, c);
  CHECK(p.predicted.step_seconds < every.predicted.step_seconds - 3e-3);
  // A plan file says so in its shards and reads back the same.
  CHECK(hub_steps_optimizer(plan_from_json(plan_to_json(p), "hub.json")));

  // Not for the equal baseline (every rank steps, as DDP does), not where the all-ranks
  // plan of the idle-rank trial is made, and not without a hub.
  CHECK(!hub_steps_optimizer(make_plan(input(c, k, 128, "equal"))));
  in.hub_may_step_optimizer = false;
  CHECK(!hub_steps_optimizer(make_plan(in)));
  in.hub_may_step_optimizer = true;
  in.cluster = cluster({4e12, 2e12, 1e12, 1e12}, std::vector(4, 64 * kGiB), 1e-5, 5e9);  // no quotas
  CHECK(make_plan(in).layout.reduce_owner == -1);
  CHECK(!hub_steps_optimizer(make_plan(in)));
  CHECK(error_of([&] { set_hub_steps_optimizer(every = make_plan(in), true); }).find("the plan has no hub") !=
        std::string::npos);
}

// fixtures::cluster with the devices named by their rate, so like ranks are alike.
ClusterModel alike(const std::vector<double>& flops, const std::vector<double>& memory) {
  ClusterModel c = cluster(flops, memory, 1e-5, 1e10);
  for (DeviceModel& d : c.ranks) d.id = d.name = "dev" + std::to_string(d.flops / 1e12);
  return c;
}

// `each` ranks of every given FLOP/s (class by class), memory 64 GiB.
ClusterModel classes_of(const std::vector<double>& flops, int each) {
  std::vector<double> f;
  for (double x : flops) f.insert(f.end(), static_cast<size_t>(each), x);
  return alike(f, std::vector(f.size(), 64 * kGiB));
}

void check_subset_plan(const Plan& p, const PlannerInput& in) {
  check_fits_and_agrees(p, in);
  CHECK(has_idle_ranks(p));
  CHECK(static_cast<int64_t>(p.layout.replicas.size()) <= in.global_batch);
  CHECK(std::accumulate(p.layout.samples.begin(), p.layout.samples.end(), int64_t{0}) == in.global_batch);
  CHECK(std::all_of(p.layout.samples.begin(), p.layout.samples.end(), [](int64_t s) { return s >= 1; }));
  int working = 0;
  for (const RankPlan& r : p.ranks) {
    working += r.replica >= 0;
    CHECK((r.replica < 0) == (r.samples == 0 && r.memory.total() == 0));
  }
  CHECK(working == static_cast<int>(p.layout.replicas.size() * p.stage_ranges.size()));
  CHECK(std::isfinite(p.speedup));
  CHECK(p.speedup > 0);
}

TEST_CASE("planner: a world larger than the global batch plans over a subset and leaves the rest idle") {
  SUBCASE("200 ranks of two classes, batch 32") {
    const ClusterModel c = classes_of({8e12, 1e12}, 100);
    const PlannerInput in = input(c, costs(c, 6), 32);
    const Plan p = make_plan(in);
    check_subset_plan(p, in);
    // The whole world as one data-parallel stage is ruled out, and the notes say why.
    const auto whole = std::find_if(p.notes.begin(), p.notes.end(), [](const PlanNote& n) {
      return n.kind == NoteKind::shape && n.ranks_used == 200 && n.stages == 1;
    });
    REQUIRE(whole != p.notes.end());
    REQUIRE(whole->problem);
    CHECK(whole->problem->kind == LayoutProblemKind::batch_below_replicas);
    CHECK(whole->problem->replicas == 200);
  }
  SUBCASE("512 like ranks, batch 32: no plan over all of them, one over 32 replicas") {
    const ClusterModel c = classes_of({8e12}, 512);
    const PlannerInput in = input(c, costs(c, 6), 32);
    const Plan p = make_plan(in);
    check_subset_plan(p, in);
    CHECK(p.layout.replicas.size() == 32);  // with like ranks, fewer replicas only idle more
    CHECK(p.baseline.layout.replicas.size() <= 32);
  }
  SUBCASE("a batch of one on four ranks") {
    const ClusterModel c = classes_of({8e12, 4e12}, 2);
    const PlannerInput in = input(c, costs(c, 4), 1);
    const Plan p = make_plan(in);
    check_subset_plan(p, in);
    CHECK(p.layout.replicas.size() == 1);
  }
}

TEST_CASE("planner: every world size against every small batch plans or says why, and never divides by zero") {
  const BlockCosts k3 = costs(classes_of({8e12, 2e12}, 1), 3);
  for (int half = 1; half <= 5; ++half)
    for (int64_t batch = 1; batch <= 2 * half + 2; ++batch)
      for (const char* strategy : {"auto", "data", "pipeline"}) {
        CAPTURE(half);
        CAPTURE(batch);
        CAPTURE(strategy);
        const ClusterModel c = classes_of({8e12, 2e12}, half);
        const PlannerInput in = input(c, costs(c, 3), batch, strategy);
        const int world = 2 * half;
        try {
          const Plan p = make_plan(in);
          check_plan(p);
          CHECK(std::accumulate(p.layout.samples.begin(), p.layout.samples.end(), int64_t{0}) == batch);
          CHECK(static_cast<int64_t>(p.layout.replicas.size()) <= batch);
        } catch (const NoPlanFits& e) {
          // Only an explicit all-ranks strategy may refuse: data over more ranks than
          // samples, or a pipeline of more stages than blocks.
          CHECK(std::string(strategy) != "auto");
          if (std::string(strategy) == "data") CHECK(batch < world);
        } catch (const Error& e) {
          CHECK(std::string(strategy) == "pipeline");
          CHECK(world > static_cast<int>(k3.params.size()));
          CHECK(contains(e.what(), "needs a block per stage"));
        }
      }
}

TEST_CASE("device classes: like devices on like links, a slow link or a profile splits them") {
  ClusterModel c = alike({8e12, 8e12, 2e12, 8e12, 2e12}, std::vector(5, 64 * kGiB));
  CHECK(device_classes(c) == std::vector<std::vector<int>>{{0, 1, 3}, {2, 4}});
  ClusterModel slow = c;  // rank 3 on a slower link to everyone
  for (size_t x = 0; x < 5; ++x)
    if (x != 3) set_bandwidth(slow, 3, x, 1e9);
  CHECK(device_classes(slow) == std::vector<std::vector<int>>{{0, 1}, {2, 4}, {3}});
  ClusterModel profiled = c;  // rank 4 measured
  profiled.block_seconds.assign(5, {});
  profiled.block_seconds[4] = {1e-3};
  CHECK(device_classes(profiled) == std::vector<std::vector<int>>{{0, 1, 3}, {2}, {4}});
  ClusterModel capped = c;
  capped.ranks[1].memory_bytes = kGiB;
  CHECK(device_classes(capped) == std::vector<std::vector<int>>{{0, 3}, {1}, {2, 4}});
}

TEST_CASE("planner: the search depends on the device classes, not on how many ranks each has") {
  // Three classes; 4 or 64 ranks each. The stage counts up to the 4 blocks divide both
  // prefix sizes alike, so the two searches try the same shapes and orders.
  const std::vector<double> flops{8e12, 4e12, 1e12};
  const ClusterModel small = classes_of(flops, 4), big = classes_of(flops, 64);
  const PlannerInput in_small = input(small, costs(small, 4), 4096);
  const PlannerInput in_big = input(big, costs(big, 4), 4096);
  const Plan ps = make_plan(in_small), pb = make_plan(in_big);
  CHECK(ps.candidates == pb.candidates);
  CHECK(ps.stage_ranges.size() == pb.stage_ranges.size());
  check_fits_and_agrees(pb, in_big);
  // Like ranks get like shares: within one sample of each other in every class.
  for (size_t k = 0; k < flops.size(); ++k) {
    int64_t lo = INT64_MAX, hi = 0;
    for (size_t r = 64 * k; r < 64 * (k + 1); ++r)
      if (pb.ranks[r].replica >= 0 && r != 0) {
        lo = std::min(lo, pb.ranks[r].samples);
        hi = std::max(hi, pb.ranks[r].samples);
      }
    CAPTURE(k);
    if (hi > 0) CHECK(hi - lo <= 1);
  }
}

TEST_CASE("planner: under auto one more like rank never makes the predicted step much slower") {
  // A model that needs a pipeline of several stages on these ranks: a rank count with no
  // divisor near that (11, 13) once planned far slower than the count before it. A plan
  // over every rank is kept unless fewer are kIdleMinGain (10%) faster, so one more rank
  // may cost up to 1 / 0.9 of the step, no more.
  const int most = 17;
  double before = 0;
  for (int n = 2; n <= most; ++n) {
    CAPTURE(n);
    const ClusterModel c = cluster(std::vector(static_cast<size_t>(n), 8e12), std::vector(static_cast<size_t>(n), 0.3 * kGiB),
                                   1e-4, 1e9);
    const Plan p = make_plan(input(c, costs(c, 12, 4e6), 64));
    check_plan(p);
    if (n > 2) CHECK(p.predicted.step_seconds <= before / 0.9 * (1 + 1e-12));
    before = p.predicted.step_seconds;
  }
}

TEST_CASE("planner: a plan that must be one stage (fp16, a dynamic loss scale) gets no pipeline over fewer ranks") {
  for (int n = 2; n <= 9; ++n) {
    CAPTURE(n);
    const ClusterModel c = cluster(std::vector(static_cast<size_t>(n), 8e12), std::vector(static_cast<size_t>(n), 0.3 * kGiB),
                                   1e-4, 1e9);
    PlannerInput in = input(c, costs(c, 12, 4e6), 64);
    in.one_stage = true;
    try {
      const Plan p = make_plan(in);
      CHECK(p.stage_ranges.size() == 1);
    } catch (const NoPlanFits&) {
      // none fits in one stage: said so, not planned as a pipeline the job would refuse
    }
  }
}

TEST_CASE("planner: under auto equal ranks whose reduction costs more than they add leave all but one idle") {
  // Four equal ranks on 10 MB/s links, a model of 4 x 1M parameters: the all-reduce of 16
  // MB costs seconds where one rank's whole step is milliseconds. No rank is slower than
  // another, so no speed step offers a count: the fastest alone is tried all the same.
  // The rule is that of the data-parallel arithmetic: k equal ranks take C / k + A(k),
  // A growing with k, so the best is one of them or all of them.
  const ClusterModel c = cluster({1e13, 1e13, 1e13, 1e13}, std::vector(4, 64 * kGiB), 1e-4, 1e7);
  const PlannerInput in = input(c, costs(c, 4, 1e6, 4096), 64);
  const Plan p = make_plan(in);
  check_fits_and_agrees(p, in);
  CHECK(p.strategy == Strategy::data);
  int used = 0;
  for (const RankPlan& r : p.ranks) used += r.replica >= 0 ? 1 : 0;
  CHECK(used == 1);
  const Plan all = make_plan(input(c, costs(c, 4, 1e6, 4096), 64, "data"));
  CHECK(p.predicted.step_seconds * 10 < all.predicted.step_seconds);
  // Asked for data parallelism, every rank is used as asked.
  for (const RankPlan& r : all.ranks) CHECK(r.replica >= 0);
}

TEST_CASE("planner: a fast rank 0 of little memory is short only of its evaluation, which the layout reports") {
  // Rank 0 is 10x faster but holds 40 MB: its share by speed (909 of 1000) trains there
  // in micro-batches (32 MB of weights, gradients and AdamW state, 20 KB a sample). Its
  // evaluation does not fit at any share: weights and state 24 MB beside 40 samples of
  // 1 MB. The layout's shortfall is the evaluation, with the batch that fits (15), not a
  // training one of a share capped for it (the shares do not change what evaluating
  // holds, so the planner does not search capped shares for it).
  const ClusterModel c = cluster({1e13, 1e12}, {40e6, 1e9});
  BlockCosts k = costs(c, 2, 1e4);
  k.eval_bytes_per_sample = 1e6;
  k.eval_batch = 40;
  const Shortfall s = only_memory_shortfall(input(c, k, 1000, "data"));
  CHECK(s.evaluation);
  CHECK(s.rank == 0);
  CHECK(s.eval_fits == 15);
  // At the batch named, the share by speed is the plan.
  k.eval_batch = 15;
  const Plan p = make_plan(input(c, k, 1000, "data"));
  REQUIRE(p.layout.samples.size() == 2);
  CHECK(p.layout.samples[0] >= 900);
  CHECK(p.layout.samples[0] + p.layout.samples[1] == 1000);
}
