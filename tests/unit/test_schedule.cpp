// The schedule IR on plain lists: 1F1B shape, counts and memory bound over a sweep of
// layouts, and the checker catching each kind of broken schedule by rank and instruction.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "plan/deadline_plan.h"
#include "plan/schedule.h"

using namespace ht;
using namespace ht::plan;

namespace {

// Ranks dealt round-robin over replicas (replica r, stage s -> s*R + r), plus one idle rank
// at the end of the world that must get an empty schedule.
PipelineLayout round_robin(int stages, int micro_batches, int replicas) {
  PipelineLayout l;
  l.replicas.assign(replicas, std::vector<int>(stages));
  for (int r = 0; r < replicas; ++r)
    for (int s = 0; s < stages; ++s) l.replicas[r][s] = s * replicas + r;
  l.micro_batches.assign(replicas, micro_batches);
  l.samples.assign(replicas, micro_batches);  // one sample each: bytes per micro-batch = per sample
  for (int b = 0; b + 1 < stages; ++b) l.activation_bytes.push_back(1000 * (b + 1));
  l.recompute.assign(replicas, std::vector<bool>(stages));
  for (int r = 0; r < replicas; ++r)
    for (int s = 0; s < stages; ++s) l.recompute[r][s] = (s + r + micro_batches) % 2 == 0;
  return l;
}

std::vector<Instruction> compute_only(const Schedule& sched) {
  std::vector<Instruction> out;
  for (const Instruction& in : sched)
    if (in.op == Op::forward || in.op == Op::backward) out.push_back(in);
  return out;
}

// Data dependencies inside one rank: a Forward's input arrives before it, its output leaves
// after it; likewise for gradients.
void check_local_dependencies(const Schedule& sched, int s, int stages) {
  std::map<std::pair<Op, int>, size_t> first;
  for (size_t i = 0; i < sched.size(); ++i)
    first.try_emplace({sched[i].op, sched[i].micro_batch}, i);
  for (const Instruction& in : sched) {
    const int mb = in.micro_batch;
    if (in.op == Op::forward && s > 0)
      CHECK(first.at({Op::recv_activation, mb}) < first.at({Op::forward, mb}));
    if (in.op == Op::forward && s < stages - 1)
      CHECK(first.at({Op::forward, mb}) < first.at({Op::send_activation, mb}));
    if (in.op == Op::backward && s < stages - 1)
      CHECK(first.at({Op::recv_grad, mb}) < first.at({Op::backward, mb}));
    if (in.op == Op::backward && s > 0)
      CHECK(first.at({Op::backward, mb}) < first.at({Op::send_grad, mb}));
    if (in.op == Op::forward && (s == 0 || s == stages - 1))
      CHECK(first.at({Op::load_micro_batch, mb}) < first.at({Op::forward, mb}));
  }
}

size_t index_of(const Schedule& sched, Op op, int mb) {
  for (size_t i = 0; i < sched.size(); ++i)
    if (sched[i].op == op && sched[i].micro_batch == mb) return i;
  FAIL("no ", op_name(op), " mb=", mb);
  return 0;
}

}  // namespace

TEST_CASE("schedule: 1F1B over S 1..5, M 1..9, replicas 1..3 passes the checker and the formula") {
  for (int S = 1; S <= 5; ++S)
    for (int M = 1; M <= 9; ++M)
      for (int R = 1; R <= 3; ++R) {
        CAPTURE(S);
        CAPTURE(M);
        CAPTURE(R);
        const PipelineLayout layout = round_robin(S, M, R);
        const int world = S * R + 1;
        const std::vector<Schedule> all = build_1f1b(layout, world);
        REQUIRE(all.size() == static_cast<size_t>(world));
        const ScheduleReport report = check_schedules(all);
        CHECK_MESSAGE(report.ok, report.problem);
        CHECK(all[world - 1].empty());

        for (int r = 0; r < R; ++r)
          for (int s = 0; s < S; ++s) {
            CAPTURE(s);
            const Schedule& sched = all[layout.replicas[r][s]];
            CHECK(count(sched) == expected_1f1b_counts(s, S, M, R, layout.recompute[r][s]));
            check_local_dependencies(sched, s, S);

            // 1F1B shape: warm-up forwards, then F/B alternating, then the cool-down.
            CHECK(warmup_forwards(s, S, M) == std::min(S - 1 - s, M));
            const auto steps = compute_only(sched);
            const auto first_b = std::find_if(steps.begin(), steps.end(), [](auto& in) {
              return in.op == Op::backward;
            });
            // The warm-up plus the first steady-state forward (when there is one).
            CHECK(first_b - steps.begin() == std::min(S - s, M));
            for (auto it = first_b + 1; it + 1 < steps.end() && it->op == Op::forward; it += 2)
              CHECK((it + 1)->op == Op::backward);

            // The memory bound: micro-batches forwarded but not yet backwarded.
            int in_flight = 0, peak = 0;
            for (const auto& in : steps) {
              in_flight += in.op == Op::forward ? 1 : -1;
              peak = std::max(peak, in_flight);
            }
            CHECK(peak <= std::min(S - s, M));
            CHECK(in_flight == 0);

            for (size_t i = 0; i < sched.size(); ++i) {
              if (sched[i].op != Op::backward) continue;
              const bool recomputed = i > 0 && sched[i - 1].op == Op::recompute &&
                                      sched[i - 1].micro_batch == sched[i].micro_batch;
              CHECK(recomputed == layout.recompute[r][s]);
            }
            CHECK(sched.back().op == Op::optimizer_step);
          }
      }
}

TEST_CASE("schedule: text form and op names") {
  PipelineLayout l;
  l.replicas = {{0, 1}};
  l.micro_batches = {1};
  l.samples = {1};
  l.activation_bytes = {64};
  const auto all = build_1f1b(l, 2);
  CHECK(to_text(all[0]) ==
        "LoadMicroBatch mb=0 stage=0\nForward mb=0 stage=0\n"
        "SendActivation mb=0 stage=0 peer=1 bytes=64\nRecvGrad mb=0 stage=0 peer=1 bytes=64\n"
        "Backward mb=0 stage=0\nOptimizerStep stage=0\n");
  // The last stage loads the targets before its Forward, after the activation arrives.
  CHECK(to_text(all[1]) ==
        "RecvActivation mb=0 stage=1 peer=0 bytes=64\nLoadMicroBatch mb=0 stage=1\n"
        "Forward mb=0 stage=1\nBackward mb=0 stage=1\nSendGrad mb=0 stage=1 peer=0 bytes=64\n"
        "OptimizerStep stage=1\n");
  CHECK(std::string(op_name(Op::reduce_grads)) == "ReduceGrads");
  CHECK(std::string(op_name(Op::recompute)) == "Recompute");
  CHECK(std::string(op_name(Op::reduce_start)) == "ReduceStart");
  CHECK(std::string(op_name(Op::gather_weights)) == "GatherWeights");
  CHECK(std::string(op_name(Op::share_weights)) == "ShareWeights");
  CHECK(std::string(op_name(Op::await_weights)) == "AwaitWeights");
}

TEST_CASE("schedule: micro-batches split a replica's share near-evenly; messages scale with them") {
  PipelineLayout l;
  l.replicas = {{0, 1}, {2, 3}};
  l.samples = {10, 7};
  l.micro_batches = {4, 7};
  l.activation_bytes = {100};  // per sample
  const std::vector<int64_t> want0 = {3, 3, 2, 2};
  for (int mb = 0; mb < 4; ++mb) CHECK(micro_batch_samples(l, 0, mb) == want0[mb]);
  for (int mb = 0; mb < 7; ++mb) CHECK(micro_batch_samples(l, 1, mb) == 1);
  CHECK_THROWS_WITH_AS(micro_batch_samples(l, 0, 4), doctest::Contains("micro-batch 4"), Error);
  const auto all = build_1f1b(l, 4);
  CHECK(check_schedules(all).ok);
  for (int rank : {0, 2})
    for (const Instruction& in : all[rank])
      if (in.op == Op::send_activation)
        CHECK(in.bytes == 100 * micro_batch_samples(l, rank / 2, in.micro_batch));
}

TEST_CASE("schedule: invalid layouts name the values") {
  PipelineLayout l = round_robin(2, 3, 2);  // ranks 0..3
  CHECK_THROWS_WITH_AS(build_1f1b(l, 3), doctest::Contains("rank 3 is outside the world [0, 3)"),
                       Error);
  PipelineLayout dup = l;
  dup.replicas[1][1] = 0;
  CHECK_THROWS_WITH_AS(build_1f1b(dup, 4), doctest::Contains("rank 0 appears twice"), Error);
  PipelineLayout no_mb = l;
  no_mb.micro_batches[1] = 0;
  CHECK_THROWS_WITH_AS(build_1f1b(no_mb, 4), doctest::Contains("micro_batches[1] = 0"), Error);
  PipelineLayout too_many = l;
  too_many.micro_batches[0] = 4;  // samples[0] = 3
  CHECK_THROWS_WITH_AS(build_1f1b(too_many, 4),
                       doctest::Contains("micro_batches[0] = 4; expected 1 to samples[0] = 3"),
                       Error);
  PipelineLayout one_mb = l;
  one_mb.micro_batches.pop_back();
  CHECK_THROWS_WITH_AS(build_1f1b(one_mb, 4), doctest::Contains("one per replica"), Error);
  PipelineLayout half_costs = l;
  half_costs.forward_seconds.assign(2, {1.0, 1.0});
  CHECK_THROWS_WITH_AS(build_1f1b(half_costs, 4), doctest::Contains("given together"), Error);
  PipelineLayout bytes = l;
  bytes.activation_bytes.push_back(5);
  CHECK_THROWS_WITH_AS(build_1f1b(bytes, 4), doctest::Contains("activation_bytes has 2 entries"),
                       Error);
  PipelineLayout ragged = l;
  ragged.replicas[1].pop_back();
  CHECK_THROWS_WITH_AS(build_1f1b(ragged, 4), doctest::Contains("replica 1 has 1 stages"), Error);
}

TEST_CASE("schedule: checker catches a dropped receive") {
  auto all = build_1f1b(round_robin(2, 3, 1), 2);
  all[1].erase(all[1].begin() + index_of(all[1], Op::recv_activation, 2));
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem.find("rank 0 instruction") != std::string::npos, report.problem);
  CHECK_MESSAGE(report.problem.find("(SendActivation mb=2 stage=0 peer=1 bytes=1000) has no "
                                    "matching RecvActivation on rank 1") != std::string::npos,
                report.problem);
}

TEST_CASE("schedule: checker catches receives swapped out of send order") {
  auto all = build_1f1b(round_robin(2, 3, 1), 2);
  std::swap(all[1][index_of(all[1], Op::recv_activation, 0)],
            all[1][index_of(all[1], Op::recv_activation, 1)]);
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem.find("(SendActivation mb=0 stage=0 peer=1 bytes=1000) is send #0 "
                                    "to rank 1 but receive #0 there is rank 1 instruction 0 "
                                    "(RecvActivation mb=1") != std::string::npos,
                report.problem);
}

TEST_CASE("schedule: checker catches a rendezvous deadlock") {
  // Both ranks send first: fine with eager buffering, stuck with synchronous sends.
  std::vector<Schedule> all(2);
  all[0] = {{Op::forward, 0, 0},
            {Op::send_activation, 0, 0, 1, 8},
            {Op::recv_grad, 0, 0, 1, 8},
            {Op::backward, 0, 0},
            {Op::optimizer_step, -1, 0}};
  all[1] = {{Op::send_grad, 0, 1, 0, 8},
            {Op::recv_activation, 0, 1, 0, 8},
            {Op::forward, 0, 1},
            {Op::backward, 0, 1},
            {Op::optimizer_step, -1, 1}};
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem ==
                    "deadlock under rendezvous sends: rank 0 instruction 1 (SendActivation mb=0 "
                    "stage=0 peer=1 bytes=8); rank 1 instruction 0 (SendGrad mb=0 stage=1 "
                    "peer=0 bytes=8)",
                report.problem);
}

TEST_CASE("schedule: checker catches a duplicated Forward") {
  auto all = build_1f1b(round_robin(3, 4, 1), 3);
  const size_t i = index_of(all[1], Op::forward, 1);
  all[1].insert(all[1].begin() + static_cast<long>(i) + 1, all[1][i]);
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem == "rank 1 instruction " + std::to_string(i + 1) +
                                      " (Forward mb=1 stage=1): micro-batch forwarded a second "
                                      "time on this stage (first at instruction " +
                                      std::to_string(i) + ")",
                report.problem);
}

TEST_CASE("schedule: checker catches a Backward before its Forward") {
  auto all = build_1f1b(round_robin(1, 2, 1), 1);
  const size_t b = index_of(all[0], Op::backward, 0);
  const Instruction backward = all[0][b];
  all[0].erase(all[0].begin() + static_cast<long>(b));
  all[0].insert(all[0].begin(), backward);
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem ==
                    "rank 0 instruction 0 (Backward mb=0 stage=0): comes before the "
                    "micro-batch's Forward",
                report.problem);
}

TEST_CASE("schedule: checker catches a step before the last Backward") {
  auto all = build_1f1b(round_robin(1, 2, 2), 2);
  const Instruction reduce = all[1][all[1].size() - 2];
  REQUIRE(reduce.op == Op::reduce_grads);
  all[1].erase(all[1].end() - 2);
  all[1].insert(all[1].begin() + 1, reduce);
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem.find("rank 1 instruction 1 (ReduceGrads stage=0): comes before "
                                    "the last Backward") != std::string::npos,
                report.problem);
}

TEST_CASE("schedule: checker catches a ReduceGrads after the OptimizerStep") {
  auto all = build_1f1b(round_robin(1, 2, 2), 2);
  std::swap(all[0][all[0].size() - 1], all[0][all[0].size() - 2]);
  const auto report = check_schedules(all);
  CHECK_FALSE(report.ok);
  CHECK_MESSAGE(report.problem.find("(ReduceGrads stage=0): comes after the OptimizerStep") !=
                    std::string::npos,
                report.problem);
}

namespace {

// The ranks of `layout`'s stage s, replica by replica.
std::vector<int> stage_ranks(const PipelineLayout& layout, int s) {
  std::vector<int> out;
  for (const auto& replica : layout.replicas) out.push_back(replica[s]);
  return out;
}

size_t index_of_op(const Schedule& sched, Op op) {
  for (size_t i = 0; i < sched.size(); ++i)
    if (sched[i].op == op) return i;
  FAIL("no ", op_name(op));
  return 0;
}

}  // namespace

TEST_CASE("schedule: ReduceStart comes right before the last Backward (and its Recompute), once, only with replicas") {
  for (int S = 1; S <= 4; ++S)
    for (int M = 1; M <= 5; ++M)
      for (int R = 1; R <= 3; ++R) {
        CAPTURE(S);
        CAPTURE(M);
        CAPTURE(R);
        const PipelineLayout layout = round_robin(S, M, R);
        const auto all = build_1f1b(layout, S * R + 1);
        for (int s = 0; s < S; ++s)
          for (int rank : stage_ranks(layout, s)) {
            const Schedule& sched = all[rank];
            size_t last_backward = 0;
            for (size_t i = 0; i < sched.size(); ++i)
              if (sched[i].op == Op::backward) last_backward = i;
            CHECK(count(sched).reduce_starts == (R > 1 ? 1 : 0));
            if (R == 1) continue;
            const size_t start = index_of_op(sched, Op::reduce_start);
            CHECK(start < last_backward);
            for (size_t k = start + 1; k < last_backward; ++k) CHECK(sched[k].op == Op::recompute);
            CHECK(sched[start].micro_batch == sched[last_backward].micro_batch);
            CHECK(sched[start].stage == s);
            CHECK(start < index_of_op(sched, Op::reduce_grads));
          }
      }
}

TEST_CASE("schedule: GatherWeights follows every OptimizerStep of a sharded stage, and only there") {
  const PipelineLayout layout = round_robin(2, 3, 3);  // stage 0: ranks 0-2, stage 1: ranks 3-5
  auto all = build_1f1b(layout, 7);
  add_weight_sync(all, layout, {WeightSync::own, WeightSync::gather});
  const ScheduleReport report = check_schedules(all);
  CHECK_MESSAGE(report.ok, report.problem);
  for (int s = 0; s < 2; ++s)
    for (int rank : stage_ranks(layout, s)) {
      const Schedule& sched = all[rank];
      InstructionCounts want = expected_1f1b_counts(s, 2, 3, 3, layout.recompute[rank % 3][s]);
      want.gathers = s == 1 ? 1 : 0;
      CHECK(count(sched) == want);
      if (s == 1) {
        CHECK(to_text(sched.back()) == "GatherWeights stage=1");
        CHECK(sched[sched.size() - 2].op == Op::optimizer_step);
      } else {
        CHECK(sched.back().op == Op::optimizer_step);
      }
    }
  CHECK(all[6].empty());
}

TEST_CASE("schedule: a shared hub posts ShareWeights, every other replica awaits it") {
  PipelineLayout layout = round_robin(1, 2, 3);  // ranks 0, 1, 2 as replicas 0, 1, 2
  layout.reduce_owner = 1;
  auto all = build_1f1b(layout, 4);
  add_weight_sync(all, layout, {WeightSync::share});
  const ScheduleReport report = check_schedules(all);
  CHECK_MESSAGE(report.ok, report.problem);
  CHECK(to_text(all[1].back()) == "ShareWeights stage=0");
  CHECK(to_text(all[0].back()) == "AwaitWeights stage=0 peer=1");
  CHECK(to_text(all[2].back()) == "AwaitWeights stage=0 peer=1");
  CHECK(count(all[1]).shares == 1);
  CHECK(count(all[0]).awaits == 1);

  layout.reduce_owner = -1;  // no hub to share
  auto again = build_1f1b(layout, 4);
  CHECK_THROWS_WITH_AS(add_weight_sync(again, layout, {WeightSync::share}),
                       doctest::Contains("stage 0 shares its hub's weights but the layout has no hub"), Error);
  CHECK_THROWS_WITH_AS(add_weight_sync(again, layout, {WeightSync::own, WeightSync::gather}),
                       doctest::Contains("2 entries for 1 stages"), Error);
}

TEST_CASE("schedule: a micro-batch trial's lists run the alternate counts") {
  PipelineLayout layout = round_robin(2, 3, 2);
  CHECK_FALSE(has_trial(layout));
  layout.alternate_micro_batches = {0, 2};
  CHECK(has_trial(layout));
  const PipelineLayout trial = trial_layout(layout);
  CHECK(trial.micro_batches == std::vector<int>{3, 2});
  CHECK(trial.alternate_micro_batches.empty());
  const auto all = build_1f1b(trial, 5);
  CHECK(check_schedules(all).ok);
  CHECK(count(all[layout.replicas[0][0]]).forwards == 3);
  CHECK(count(all[layout.replicas[1][0]]).forwards == 2);
  layout.alternate_micro_batches = {1};
  CHECK_THROWS_WITH_AS(trial_layout(layout), doctest::Contains("1 alternate_micro_batches for 2 replicas"), Error);
}

TEST_CASE("schedule: AlignReplica comes after OptimizerStep, names its replica, and spans that replica alone") {
  const PipelineLayout layout = round_robin(2, 2, 2);  // a 2 x 2 hybrid
  auto built = build_1f1b(layout, 4);
  add_deadline_sync(built, layout);
  REQUIRE(check_schedules(built).ok);
  SUBCASE("before the OptimizerStep") {
    auto all = built;
    const size_t i = index_of_op(all[1], Op::align_replica);
    const Instruction align = all[1][i];
    all[1].erase(all[1].begin() + static_cast<long>(i));
    all[1].insert(all[1].begin() + static_cast<long>(index_of_op(all[1], Op::optimizer_step)), align);
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("comes before the OptimizerStep; the replica agrees") != std::string::npos,
                  report.problem);
  }
  SUBCASE("naming no replica") {
    auto all = built;
    all[2][index_of_op(all[2], Op::align_replica)].replica = -1;
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("names no replica") != std::string::npos, report.problem);
  }
  SUBCASE("a replica's ranks wait for each other, not for the other replica") {
    // Each replica's two ranks fire their AlignReplica together, without the other
    // replica's: the sweep groups the collective by replica, not by stage.
    auto all = built;
    std::set<int> groups;
    for (const Schedule& s : all)
      for (const Instruction& in : s)
        if (in.op == Op::align_replica) groups.insert(collective_group(in));
    CHECK(groups == std::set<int>{0, 1});
    int fired = 0;
    sweep(all, [&](const SweepEvent& e) {
      const Instruction& in = all[static_cast<size_t>(e.at.front().first)][e.at.front().second];
      if (in.op != Op::align_replica) return;
      ++fired;
      CHECK(e.kind == SweepEvent::Kind::collective);
      REQUIRE(e.at.size() == 2);
      std::set<int> ranks{e.at[0].first, e.at[1].first};
      std::set<int> replica;
      for (int rank : layout.replicas[static_cast<size_t>(in.replica)]) replica.insert(rank);
      CHECK(ranks == replica);
    });
    CHECK(fired == 2);
  }
}

TEST_CASE("schedule: checker catches misplaced and one-sided reduction and weight instructions") {
  const PipelineLayout layout = round_robin(1, 3, 2);  // ranks 0 and 1 replicate stage 0
  const auto built = build_1f1b(layout, 2);

  SUBCASE("a ReduceStart on one rank of the group only") {
    auto all = built;
    all[1].erase(all[1].begin() + static_cast<long>(index_of_op(all[1], Op::reduce_start)));
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("stage 0's ReduceStart is held by ranks 0 but not by rank 1") !=
                      std::string::npos,
                  report.problem);
  }
  SUBCASE("a ReduceStart before an earlier Backward") {
    auto all = built;
    const size_t i = index_of_op(all[0], Op::reduce_start);
    const Instruction start = all[0][i];
    all[0].erase(all[0].begin() + static_cast<long>(i));
    all[0].insert(all[0].begin() + static_cast<long>(index_of(all[0], Op::backward, 1)), start);
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("(ReduceStart mb=2 stage=0): rank 0 instruction") != std::string::npos,
                  report.problem);
    CHECK_MESSAGE(report.problem.find("comes between it and the last Backward") != std::string::npos,
                  report.problem);
  }
  SUBCASE("a ReduceStart of another micro-batch") {
    auto all = built;
    for (auto* sched : {&all[0], &all[1]}) (*sched)[index_of_op(*sched, Op::reduce_start)].micro_batch = 1;
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("expected the Backward of micro-batch 1 after it") != std::string::npos,
                  report.problem);
  }
  SUBCASE("two ReduceStarts") {
    auto all = built;
    for (auto* sched : {&all[0], &all[1]}) {
      const size_t i = index_of_op(*sched, Op::reduce_start);
      sched->insert(sched->begin() + static_cast<long>(i), (*sched)[i]);
    }
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("already started") != std::string::npos, report.problem);
  }
  SUBCASE("a GatherWeights before the OptimizerStep") {
    auto all = built;
    add_weight_sync(all, layout, {WeightSync::gather});
    std::swap(all[0][all[0].size() - 1], all[0][all[0].size() - 2]);
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("(GatherWeights stage=0): comes before the OptimizerStep") !=
                      std::string::npos,
                  report.problem);
  }
  SUBCASE("a GatherWeights on one rank only") {
    auto all = built;
    add_weight_sync(all, layout, {WeightSync::gather});
    all[1].pop_back();
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("GatherWeights is held by ranks 0 but not by rank 1") != std::string::npos,
                  report.problem);
  }
  SUBCASE("an AwaitWeights without a ShareWeights") {
    auto all = built;
    PipelineLayout hub = layout;
    hub.reduce_owner = 0;
    add_weight_sync(all, hub, {WeightSync::share});
    all[0].pop_back();
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("(AwaitWeights stage=0 peer=0) has no matching ShareWeights of stage 0 on "
                                      "rank 0") != std::string::npos,
                  report.problem);
  }
  SUBCASE("a ShareWeights nobody awaits") {
    auto all = built;
    PipelineLayout hub = layout;
    hub.reduce_owner = 0;
    add_weight_sync(all, hub, {WeightSync::share});
    all[1].pop_back();
    const auto report = check_schedules(all);
    CHECK_FALSE(report.ok);
    CHECK_MESSAGE(report.problem.find("(ShareWeights stage=0): rank 1 of stage 0's group waits for it 0 times; "
                                      "expected 1") != std::string::npos,
                  report.problem);
  }
}

TEST_CASE("schedule: the sweep fires pairs, collectives and the hub's word once each, in dependency order") {
  // Rank 1 waits for rank 0's word, rank 0 posts it only after a pair with rank 2; ranks 0
  // and 1 then meet in a collective. Local ops fire alone.
  std::vector<Schedule> all(3);
  all[0] = {{Op::send_activation, 0, 0, 2, 8}, {Op::share_weights, -1, 0}, {Op::reduce_grads, -1, 0}};
  all[1] = {{Op::forward, 0, 0}, {Op::await_weights, -1, 0, 0}, {Op::reduce_grads, -1, 0}};
  all[2] = {{Op::recv_activation, 0, 1, 0, 8}};
  std::vector<SweepEvent> events;
  const std::vector<size_t> pos = sweep(all, [&](const SweepEvent& e) { events.push_back(e); });
  CHECK(pos == std::vector<size_t>{3, 3, 1});
  using K = SweepEvent::Kind;
  using At = std::vector<std::pair<int, size_t>>;
  REQUIRE(events.size() == 5);
  CHECK((events[0].kind == K::pair && events[0].at == At{{0, 0}, {2, 0}}));
  CHECK((events[1].kind == K::local && events[1].at == At{{0, 1}}));
  CHECK((events[2].kind == K::local && events[2].at == At{{1, 0}}));
  CHECK((events[3].kind == K::await && events[3].at == At{{1, 1}, {0, 1}}));
  CHECK((events[4].kind == K::collective && events[4].at == At{{0, 2}, {1, 2}}));

  // Without the word, rank 1 stops at its AwaitWeights and rank 0 at the collective.
  all[0].erase(all[0].begin() + 1);
  CHECK(sweep(all, [](const SweepEvent&) {}) == std::vector<size_t>{1, 1, 1});
  all[2][0].peer = 3;
  CHECK_THROWS_WITH_AS(sweep(all, [](const SweepEvent&) {}),
                       doctest::Contains("sweep: rank 2 instruction 0 (RecvActivation mb=0 stage=1 peer=3 bytes=8)"),
                       Error);
}
