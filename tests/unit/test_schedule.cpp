// The schedule IR on plain lists: 1F1B shape, counts and memory bound over a sweep of
// layouts, and the checker catching each kind of broken schedule by rank and instruction.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"
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
