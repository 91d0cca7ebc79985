// Pipeline stage partitioning: even splits on even hardware, proportional splits on
// uneven hardware, optimality against brute force, memory-driven splits, the errors of
// infeasible instances and the DeepSpeed-"uniform" baseline.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/plan_facts.h"
#include "plan/stage_partition.h"

using namespace ht;
using namespace ht::plan;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

DeviceModel device(const std::string& id, double memory) {
  DeviceModel d;
  d.id = id;
  d.name = id;
  d.memory_bytes = memory;
  return d;
}

// S devices with the given per-block speed factors (seconds per block = base * factor).
StagePartitionInput input(int blocks, std::vector<double> slowdown, double capacity = 1e30) {
  StagePartitionInput in;
  for (size_t s = 0; s < slowdown.size(); ++s) {
    std::string id = "dev";
    id += std::to_string(s);
    in.devices.push_back(device(id, capacity));
    in.compute_seconds.emplace_back(static_cast<size_t>(blocks), slowdown[s]);
  }
  in.memory_bytes.assign(static_cast<size_t>(blocks), 1.0);
  in.activation_bytes.assign(static_cast<size_t>(blocks), 0.0);
  return in;
}

// Every contiguous split of B blocks into S non-empty stages, by choosing S-1 cut points.
void all_splits(int B, int S, std::vector<int>& cuts, int from,
                std::vector<std::vector<std::pair<int, int>>>& out) {
  if (static_cast<int>(cuts.size()) == S - 1) {
    std::vector<std::pair<int, int>> r;
    int i = 0;
    for (int c : cuts) { r.emplace_back(i, c); i = c; }
    r.emplace_back(i, B);
    out.push_back(r);
    return;
  }
  for (int c = from; c < B; ++c) {
    cuts.push_back(c);
    all_splits(B, S, cuts, c + 1, out);
    cuts.pop_back();
  }
}

double bottleneck_of(const StagePartitionInput& in, const std::vector<std::pair<int, int>>& r,
                     bool& fits) {
  const int S = static_cast<int>(r.size());
  double worst = 0;
  fits = true;
  for (int s = 0; s < S; ++s) {
    double t = 0, m = 0, a = 0, w = 0;
    for (int b = r[static_cast<size_t>(s)].first; b < r[static_cast<size_t>(s)].second; ++b) {
      t += in.compute_seconds[static_cast<size_t>(s)][static_cast<size_t>(b)];
      m += in.memory_bytes[static_cast<size_t>(b)];
      a += in.activation_bytes[static_cast<size_t>(b)];
      if (!in.workspace_bytes.empty()) w = std::max(w, in.workspace_bytes[static_cast<size_t>(b)]);
    }
    const int held = std::min(S - s, in.micro_batches);
    if (m + held * in.micro_batch_size * a + in.micro_batch_size * w > in.devices[static_cast<size_t>(s)].memory_bytes)
      fits = false;
    worst = std::max(worst, t * in.micro_batch_size);
  }
  return worst;
}

}  // namespace

TEST_CASE("stage partition: equal devices and equal blocks split evenly") {
  const auto p = partition_stages(input(12, {1, 1, 1, 1}));
  REQUIRE(p.ranges.size() == 4);
  for (int s = 0; s < 4; ++s) {
    CHECK(p.ranges[static_cast<size_t>(s)].first == 3 * s);
    CHECK(p.ranges[static_cast<size_t>(s)].second == 3 * s + 3);
    CHECK(p.stage_seconds[static_cast<size_t>(s)] == doctest::Approx(3.0));
  }
  CHECK(p.bottleneck_seconds == doctest::Approx(3.0));
  CHECK(p.unfit_stages.empty());
}

TEST_CASE("stage partition: a device 2x faster gets about 2x the blocks") {
  // Device 0 takes 1 s per block, device 1 takes 2 s: 12 blocks -> 8 and 4.
  const auto p = partition_stages(input(12, {1, 2}));
  CHECK(p.ranges[0] == std::pair{0, 8});
  CHECK(p.ranges[1] == std::pair{8, 12});
  CHECK(p.bottleneck_seconds == doctest::Approx(8.0));
  // Micro-batch size scales the per-micro-batch time, not the split.
  auto in = input(12, {2, 1});
  in.micro_batch_size = 4;
  const auto q = partition_stages(in);
  CHECK(q.ranges[0] == std::pair{0, 4});
  CHECK(q.bottleneck_seconds == doctest::Approx(32.0));
}

TEST_CASE("stage partition: optimal against brute force on small random instances") {
  std::mt19937 rng(20240607);
  std::uniform_real_distribution<double> cost(0.1, 5.0), mem(0.5, 3.0);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int S = 1 + static_cast<int>(rng() % 3);
    const int B = S + static_cast<int>(rng() % static_cast<unsigned>(9 - S));
    StagePartitionInput in;
    in.micro_batch_size = 1 + static_cast<int>(rng() % 2);
    in.micro_batches = 1 + static_cast<int>(rng() % 4);
    for (int s = 0; s < S; ++s) {
      // Appending, not "d" + to_string(s): GCC 12 warns falsely (-Wrestrict) on the latter.
      std::string id = "d";
      id += std::to_string(s);
      in.devices.push_back(device(id, 4.0 + 10.0 * mem(rng) / 3.0));
      std::vector<double> row;
      for (int b = 0; b < B; ++b) row.push_back(cost(rng));
      in.compute_seconds.push_back(row);
    }
    for (int b = 0; b < B; ++b) {
      in.memory_bytes.push_back(mem(rng));
      in.activation_bytes.push_back(mem(rng) / 4);
      // Every other instance with the blocks' workspaces (a stage holds its largest once).
      if (trial % 2 == 1) in.workspace_bytes.push_back(mem(rng) / 2);
    }
    std::vector<std::vector<std::pair<int, int>>> splits;
    std::vector<int> cuts;
    all_splits(B, S, cuts, 1, splits);
    double brute = 1e300;
    for (const auto& r : splits) {
      bool fits = false;
      const double v = bottleneck_of(in, r, fits);
      if (fits) brute = std::min(brute, v);
    }
    CAPTURE(trial);
    if (brute == 1e300) {
      ++infeasible;
      CHECK_THROWS_AS(partition_stages(in), ht::Error);
      continue;
    }
    ++feasible;
    const auto p = partition_stages(in);
    bool fits = false;
    CHECK(bottleneck_of(in, p.ranges, fits) == doctest::Approx(p.bottleneck_seconds));
    CHECK(fits);
    CHECK(p.bottleneck_seconds == doctest::Approx(brute));
  }
  // The generator must exercise both outcomes or the test proves less than it claims.
  CHECK(feasible > 50);
  CHECK(infeasible > 5);
}

TEST_CASE("stage partition: memory caps force a different split than time alone") {
  // Device 0 is 3x faster, so time alone gives it 9 of 12 blocks; it can hold only 5.
  auto in = input(12, {1, 3});
  const auto free = partition_stages(in);
  CHECK(free.ranges[0] == std::pair{0, 9});
  in.devices[0].memory_bytes = 5.0;
  const auto capped = partition_stages(in);
  CHECK(capped.ranges[0] == std::pair{0, 5});
  CHECK(capped.stage_memory_bytes[0] <= 5.0);
  CHECK(capped.bottleneck_seconds == doctest::Approx(21.0));
  // In-flight activations count too: stage 0 of 2 keeps min(2, M) micro-batches.
  in = input(4, {1, 1});
  in.activation_bytes.assign(4, 1.0);
  in.micro_batches = 8;
  in.devices[0].memory_bytes = 3.0;  // 1 block: 1 + 2*1 = 3 bytes; 2 blocks need 6
  const auto act = partition_stages(in);
  CHECK(act.ranges[0] == std::pair{0, 1});
  CHECK(act.stage_memory_bytes[0] == doctest::Approx(3.0));
  CHECK(act.stage_memory_bytes[1] == doctest::Approx(3.0 + 3.0));
  // And a block's workspace, once per stage, the largest of its blocks': with block 1's
  // 2 bytes stage 0 cannot hold blocks 0-1 (2 + 2 > 3.5), with both at 1 it can (2 + 1).
  in = input(4, {1, 1});
  in.devices[0].memory_bytes = 3.5;
  in.workspace_bytes = {1.0, 2.0, 0.0, 0.0};
  CHECK(partition_stages(in).ranges[0] == std::pair{0, 1});
  in.workspace_bytes = {1.0, 1.0, 0.0, 0.0};
  const auto ws = partition_stages(in);
  CHECK(ws.ranges[0] == std::pair{0, 2});
  CHECK(ws.stage_memory_bytes[0] == doctest::Approx(2.0 + 1.0));
  CHECK(ws.stage_memory_bytes[1] == doctest::Approx(2.0));
}

namespace {

// The failure partition_stages reports for `in`; a test failure when it finds a split.
StageSplitFailure split_failure(const StagePartitionInput& in) {
  try {
    partition_stages(in);
  } catch (const StageSplitError& e) {
    return e.failure;
  }
  FAIL_CHECK("expected a StageSplitError");
  return {};
}

}  // namespace

TEST_CASE("stage partition: infeasible cases produce a named error") {
  SUBCASE("a block that no stage can hold alone") {
    auto in = input(12, {1, 1, 1}, 8 * kGiB);
    in.devices[2].id = "rtx3060";
    in.devices[2].memory_bytes = 12 * kGiB;  // the roomiest, so the one the error names
    in.memory_bytes[7] = 13 * kGiB;
    try {
      partition_stages(in);
      FAIL("expected an error");
    } catch (const StageSplitError& e) {
      CHECK(std::string(e.what()) == "no pipeline split of 12 blocks over 3 devices fits");
      const StageSplitFailure& f = e.failure;
      CHECK(f.problem == StageSplitProblem::block_too_large);
      CHECK(f.blocks == 12);
      CHECK(f.stages == 3);
      CHECK(f.block == 7);
      CHECK(f.needed == 13 * kGiB);
      CHECK(f.stage == 2);
      CHECK(f.device == "rtx3060");
      CHECK(f.capacity == 12 * kGiB);
    }
  }
  SUBCASE("every block fits somewhere but no split does") {
    auto in = input(4, {1, 1}, 1.5);  // one block per stage fits, two do not
    const StageSplitFailure f = split_failure(in);
    CHECK(f.problem == StageSplitProblem::no_contiguous_split);
    CHECK(f.needed == 4);    // the weight state of all blocks
    CHECK(f.capacity == 3);  // both stages
  }
  SUBCASE("a stage that can hold none of the blocks it could get") {
    // Six blocks over three stages: every block fits stage 0 or 2, which could take it,
    // but stage 1 (which could get blocks 1-4) holds none.
    auto in = input(6, {1, 1, 1}, 10.0);
    in.devices[1].id = "tiny";
    in.devices[1].memory_bytes = 0.5;
    const StageSplitFailure f = split_failure(in);
    CHECK(f.problem == StageSplitProblem::stage_too_small);
    CHECK(f.stage == 1);
    CHECK(f.device == "tiny");
    CHECK(f.block == 1);  // the lightest, the first of equals
    CHECK(f.needed == 1);
    CHECK(f.capacity == 0.5);
  }
  SUBCASE("a block that only a tiny stage could take") {
    auto in = input(3, {1, 1, 1}, 10.0);  // one block per stage: block 1 can go only to stage 1
    in.devices[1].id = "tiny";
    in.devices[1].memory_bytes = 0.5;
    const StageSplitFailure f = split_failure(in);
    CHECK(f.problem == StageSplitProblem::block_too_large);
    CHECK(f.block == 1);
    CHECK(f.stage == 1);
    CHECK(f.device == "tiny");
  }
  SUBCASE("more stages than blocks") {
    CHECK_THROWS_WITH_AS(partition_stages(input(2, {1, 1, 1})),
                         doctest::Contains("3 stages but only 2 blocks"), ht::Error);
  }
  SUBCASE("mis-sized inputs") {
    auto in = input(4, {1, 1});
    in.compute_seconds[1].pop_back();
    CHECK_THROWS_AS(partition_stages(in), ht::Error);
  }
}

TEST_CASE("stage partition: uniform baseline matches its definition and reports misfits") {
  // 10 blocks over 4 stages: 3, 3, 2, 2 — the remainder goes to the first stages.
  auto in = input(10, {1, 1, 1, 4});
  const auto u = uniform_partition(in);
  REQUIRE(u.ranges.size() == 4);
  CHECK(u.ranges[0] == std::pair{0, 3});
  CHECK(u.ranges[1] == std::pair{3, 6});
  CHECK(u.ranges[2] == std::pair{6, 8});
  CHECK(u.ranges[3] == std::pair{8, 10});
  CHECK(u.bottleneck_seconds == doctest::Approx(8.0));  // 2 blocks at 4 s on stage 3
  CHECK(u.unfit_stages.empty());
  CHECK(partition_stages(in).bottleneck_seconds <= u.bottleneck_seconds);

  in.devices[1].id = "small";
  in.devices[1].memory_bytes = 2.0;  // its 3 one-byte blocks need 3
  const auto v = uniform_partition(in);
  CHECK(v.unfit_stages == std::vector{1});
  CHECK(v.ranges[1] == std::pair{3, 6});
  CHECK(v.stage_memory_bytes[1] == doctest::Approx(3.0));
}

TEST_CASE("stage partition: the whole-model stage also holds every other block's weights") {
  // Six blocks of state 4 (weights 1), stage 0 twice as fast: 4 blocks to 2 when memory
  // does not matter. Rank 0 on stage 0 with a capacity of 18: four blocks are 16, plus the
  // other two blocks' weights 18, which fits; at 17 it takes three (12 + 3 = 15).
  StagePartitionInput in = input(6, {1.0, 2.0}, 100);
  in.memory_bytes.assign(6, 4.0);
  in.weight_bytes.assign(6, 1.0);
  CHECK(partition_stages(in).ranges[0] == std::pair{0, 4});
  in.whole_model_stage = 0;
  in.whole_model_capacity = 18;
  StagePartition p = partition_stages(in);
  CHECK(p.ranges[0] == std::pair{0, 4});
  CHECK(p.stage_memory_bytes[0] == doctest::Approx(18));
  in.whole_model_capacity = 17;
  p = partition_stages(in);
  CHECK(p.ranges[0] == std::pair{0, 3});
  CHECK(p.stage_memory_bytes[0] == doctest::Approx(15));
  // Streaming the others from host memory (a GPU rank 0), it holds the largest one only:
  // four blocks and one other's weights, 17.
  in.whole_model_streamed = true;
  p = partition_stages(in);
  CHECK(p.ranges[0] == std::pair{0, 4});
  CHECK(p.stage_memory_bytes[0] == doctest::Approx(17));
  in.weight_bytes[5] = 2;  // the largest outside the stage now: 18 does not fit 17
  p = partition_stages(in);
  CHECK(p.ranges[0] == std::pair{0, 3});
  in.weight_bytes[5] = 1;
  in.whole_model_streamed = false;
  // Another device of the stage group tighter for the stage's own blocks than rank 0 is
  // with the extra weights: its capacity binds.
  in.whole_model_capacity = 1000;
  in.devices[0].memory_bytes = 9;
  p = partition_stages(in);
  CHECK(p.ranges[0] == std::pair{0, 2});
  CHECK(p.stage_memory_bytes[0] == doctest::Approx(8));
  // Too little for rank 0 with the others' weights: the error says so.
  StagePartitionInput tight = input(2, {1.0, 1.0}, 4);
  tight.memory_bytes.assign(2, 4.0);
  tight.weight_bytes.assign(2, 1.0);
  tight.whole_model_stage = 0;
  tight.whole_model_capacity = 4.5;
  tight.whole_model_device = "gpu0";
  const StageSplitFailure f = split_failure(tight);
  CHECK(f.problem == StageSplitProblem::block_too_large);
  CHECK(f.block == 0);
  CHECK(f.needed == 5);  // its state 4 and the other block's weights 1
  CHECK(f.stage == f.whole_model_stage);
  // Rank 0 binds: its device and capacity are named, not the stage group's smallest's.
  CHECK(f.device == "rank 0's gpu0");
  CHECK(f.device_memory == 4.5);
  CHECK(f.capacity == 4.5);
  // Bad input names the field.
  in.whole_model_stage = 2;
  CHECK_THROWS_WITH_AS(partition_stages(in), doctest::Contains("whole_model_stage 2"), Error);
  in.whole_model_stage = 0;
  in.weight_bytes.pop_back();
  CHECK_THROWS_WITH_AS(partition_stages(in), doctest::Contains("weight_bytes has 5 entries"), Error);
  in.weight_bytes.push_back(1.0);
  in.whole_model_capacity = 0;
  CHECK_THROWS_WITH_AS(partition_stages(in), doctest::Contains("whole_model_capacity = 0"), Error);
}
