// parallel.sync deadline in the plan: the instructions the planner emits (CatchUp first,
// ReduceGradsDeadline in place of ReduceGrads, AlignReplica on a hybrid plan), the lists
// still pass check_schedules and simulate, the plan file keeps the policy, and the
// combination deadline does not support is refused naming the setting.
#include <doctest/doctest.h>

#include <algorithm>

#include "tests/unit/error_message.h"
#include "tests/unit/plan_fixtures.h"

#include "plan/deadline_plan.h"
#include "plan/plan_costs.h"
#include "plan/stage_memory.h"
#include "plan/plan_json.h"
#include "plan/planner.h"
#include "plan/policy_plan.h"
#include "plan/simulator.h"

using namespace ht;
using namespace ht::plan;
using namespace ht::plan::fixtures;

TEST_CASE("deadline plan: every reducing rank's list starts with CatchUp and reduces with ReduceGradsDeadline") {
  const ClusterModel c = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB), 1e-5, 1e10);
  const PlannerInput in = input(c, costs(c, 4), 128, "data");
  Plan p = make_plan(in);
  const double sync_step = p.predicted.step_seconds;
  apply_deadline_sync(p, in.costs, in.cluster);
  CHECK(p.sync_policy == plan::SyncPolicy::deadline);
  CHECK(p.layout.reduce_owner == 0);  // the first leader: the cost model charges its hub reduction
  // The leader's reduction costs more than the all-reduce, and the speed-up printed is
  // the deadline plan's own.
  CHECK(p.predicted.step_seconds > sync_step);
  CHECK(p.speedup == doctest::Approx(p.baseline.predicted.step_seconds / p.predicted.step_seconds).epsilon(1e-12));
  CHECK(!hub_steps_optimizer(p));
  const std::vector<Schedule> lists = plan_schedules(p);
  const ScheduleReport report = check_schedules(lists);
  CHECK_MESSAGE(report.ok, report.problem);
  for (size_t r = 0; r < lists.size(); ++r) {
    CAPTURE(r);
    REQUIRE(!lists[r].empty());
    CHECK(lists[r].front().op == Op::catch_up);
    int deadline_reduces = 0;
    for (const Instruction& i : lists[r]) {
      CHECK(i.op != Op::reduce_grads);
      CHECK(i.op != Op::reduce_start);
      deadline_reduces += i.op == Op::reduce_grads_deadline ? 1 : 0;
    }
    CHECK(deadline_reduces == 1);
    CHECK(contains(to_text(lists[r]), "ReduceGradsDeadline stage=0"));
  }
  // The prediction is of these lists, and a step costs at least the slowest compute.
  const SimResult sim = simulate_plan(p, in.costs, in.cluster);
  CHECK(sim.step_seconds == doctest::Approx(p.predicted.step_seconds));
  CHECK(sim.step_seconds > 0);
  // The plan file keeps the policy, so `train --plan` runs the same lists.
  const Plan back = plan_from_json(plan_to_json(p), "test");
  CHECK(back.sync_policy == plan::SyncPolicy::deadline);
  CHECK(plan_schedules(back)[1].front().op == Op::catch_up);
}

TEST_CASE("deadline plan: a pure pipeline keeps its lists (no replica to stand in for a stage)") {
  const ClusterModel c = cluster({1e13, 1e13}, std::vector(2, 64 * kGiB), 1e-4, 2e8);
  const PlannerInput in = input(c, costs(c, 4, 1e6, 4096), 64, "pipeline");
  Plan p = make_plan(in);
  REQUIRE(p.strategy == Strategy::pipeline);
  const std::vector<Schedule> before = plan_schedules(p);
  apply_deadline_sync(p, in.costs, in.cluster);
  CHECK(p.sync_policy == plan::SyncPolicy::deadline);
  const std::vector<Schedule> after = plan_schedules(p);
  REQUIRE(after.size() == before.size());
  for (size_t r = 0; r < after.size(); ++r) CHECK(to_text(after[r]) == to_text(before[r]));
}

TEST_CASE("deadline plan: a hybrid plan's replicas agree on their step after OptimizerStep (AlignReplica)") {
  const ClusterModel c = cluster({2e13, 2e13, 1e13, 1e13}, std::vector(4, 64 * kGiB), 1e-4, 5e8);
  const PlannerInput in = input(c, costs(c, 6), 128);  // auto: 2 x 2 hybrid here (test_planner.cpp)
  Plan p = make_plan(in);
  REQUIRE(p.strategy == Strategy::hybrid);
  const std::vector<Schedule> before = plan_schedules(p);
  apply_deadline_sync(p, in.costs, in.cluster);
  check_plan(p);
  CHECK(p.sync_policy == plan::SyncPolicy::deadline);
  CHECK(p.ranks[0].replica == 0);
  const std::vector<Schedule> lists = plan_schedules(p);
  const ScheduleReport report = check_schedules(lists);
  CHECK_MESSAGE(report.ok, report.problem);
  for (size_t r = 0; r < lists.size(); ++r) {
    CAPTURE(r);
    const Schedule& l = lists[r];
    REQUIRE(!l.empty());
    CHECK(l.front().op == Op::catch_up);
    const auto step = std::find_if(l.begin(), l.end(), [](const Instruction& i) { return i.op == Op::optimizer_step; });
    REQUIRE(step != l.end());
    REQUIRE(step + 1 != l.end());
    CHECK((step + 1)->op == Op::align_replica);
    CHECK((step + 1)->replica == p.ranks[r].replica);
    CHECK(count(l).aligns == 1);
    // The pipeline's own instructions are the sync plan's: only the reduction changed.
    InstructionCounts want = count(before[r]);
    want.reduce_starts = 0;
    want.aligns = 1;
    CHECK(count(l) == want);
    CHECK(contains(to_text(l), "AlignReplica replica=" + std::to_string(p.ranks[r].replica)));
  }
  // Predicted from these lists: the agreement is a collective of the replica's ranks.
  const SimResult sim = simulate_plan(p, in.costs, in.cluster);
  CHECK(sim.step_seconds == doctest::Approx(p.predicted.step_seconds));
  int aligns = 0;
  for (const Span& s : sim.timeline) aligns += s.name == "AlignReplica" && s.category == "comm" ? 1 : 0;
  CHECK(aligns == 4);
}

TEST_CASE("deadline plan: optimizer-state sharding is refused, naming the setting") {
  const ClusterModel c = cluster({2e13, 2e13, 1e13, 1e13}, std::vector(4, 64 * kGiB), 1e-4, 5e8);
  const PlannerInput din = input(c, costs(c, 6), 128, "data");
  Plan sharded = make_plan(din);
  REQUIRE(sharded.strategy == Strategy::data);
  for (RankPlan& r : sharded.ranks) r.optimizer_shard = 0.25;
  const std::string s = error_of([&] { apply_deadline_sync(sharded, din.costs, din.cluster); });
  CHECK(contains(s, "shards stage 0's optimizer state"));
  CHECK(contains(s, "parallel.sync"));
}

TEST_CASE("deadline plan: a stage whose catch-up would not fit one MPI message is refused, naming it") {
  // A catch-up carries the stage's parameters and optimizer state as one message; auto
  // then tries a layout of more stages (plan_for_policy's attempts).
  const ClusterModel c = cluster({2e13, 2e13, 1e13, 1e13}, std::vector(4, 64 * kGiB), 1e-4, 5e8);
  const PlannerInput din = input(c, costs(c, 6), 128, "data");
  Plan p = make_plan(din);
  REQUIRE(p.strategy == Strategy::data);
  Plan at_limit = p;
  at_limit.ranks[1].memory.params = kDeadlineCatchUpMaxBytes / 3;
  at_limit.ranks[1].memory.optimizer = 2 * kDeadlineCatchUpMaxBytes / 3;
  CHECK_NOTHROW(apply_deadline_sync(at_limit, din.costs, din.cluster));
  p.ranks[1].memory.params = 0.8e9;
  p.ranks[1].memory.optimizer = 1.6e9;  // AdamW's two moments: a 200M-parameter stage
  const std::string s = error_of([&] { apply_deadline_sync(p, din.costs, din.cluster); });
  CHECK(contains(s, "stage 0"));
  CHECK(contains(s, "2400000000 bytes of parameters and optimizer state"));
  CHECK(contains(s, "more pipeline stages, or parallel.sync sync"));
}

TEST_CASE("deadline plan: rank 0's replica comes first, its share with it (it evaluates and checkpoints alone)") {
  const ClusterModel c = cluster({2e12, 8e12, 4e12, 2e12}, std::vector(4, 64 * kGiB), 1e-5, 1e10);
  const PlannerInput in = input(c, costs(c, 4), 128, "data");
  Plan p = make_plan(in);
  REQUIRE(p.ranks[0].replica != 0);  // by speed, rank 0 is among the last
  const int64_t share0 = p.ranks[0].samples;
  apply_deadline_sync(p, in.costs, in.cluster);
  check_plan(p);
  CHECK(p.layout.replicas[0][0] == 0);
  CHECK(p.ranks[0].replica == 0);
  CHECK(p.layout.samples[0] == share0);
  for (const RankPlan& r : p.ranks) CHECK(p.layout.samples[static_cast<size_t>(r.replica)] == r.samples);
  CHECK(check_schedules(plan_schedules(p)).ok);
}

TEST_CASE("deadline plan: the reduction is charged its copies at each rank's memory bandwidth") {
  ClusterModel c = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB), 1e-5, 1e10);
  const std::vector<double> bw{8e9, 4e9, 2e9, 2e9};
  for (size_t r = 0; r < 4; ++r) c.ranks[r].memory_bandwidth = bw[r];
  const PlannerInput in = input(c, costs(c, 4), 128, "data");
  Plan p = make_plan(in);
  apply_deadline_sync(p, in.costs, in.cluster);
  REQUIRE(p.layout.replicas.size() == 4);
  REQUIRE(p.layout.reduce_owner == 0);
  // By hand: B gradient bytes; the slowest member (2 GB/s) reads and writes them twice,
  // the leader (rank 0's replica, 8 GB/s) 5 + 3 x 4 times.
  const auto [begin, end] = p.stage_ranges[0];
  const double bytes = stage_footprint(in.costs, begin, end).params * kGradBytesPerParam;
  REQUIRE(bytes > 0);
  double slowest_member = 0;
  for (size_t k = 1; k < 4; ++k)
    slowest_member = std::max(slowest_member, 4 * bytes / bw[static_cast<size_t>(p.layout.replicas[k][0])]);
  const double want = slowest_member + 17 * bytes / 8e9;
  CHECK(deadline_copy_seconds(p, p.layout, in.costs, 0) == doctest::Approx(want).epsilon(1e-12));
  // In the cost table on top of the transfers, under deadline only.
  Plan sync = p;
  sync.sync_policy = plan::SyncPolicy::synchronous;
  const double with = plan_cost_table(p, in.costs, in.cluster).reduce_seconds[0];
  const double without = plan_cost_table(sync, in.costs, in.cluster).reduce_seconds[0];
  CHECK(with - without == doctest::Approx(want).epsilon(1e-9));
  // Where the probe timed passes over buffers of the model's size (a cache may hold them),
  // the copies are charged at that rate: the leader's at 32 GB/s; through a plan file too.
  Plan cached = p;
  cached.ranks[0].device.gradient_bandwidth = 32e9;
  const double leader = 17 * bytes / 32e9;
  CHECK(deadline_copy_seconds(cached, cached.layout, in.costs, 0) == doctest::Approx(slowest_member + leader).epsilon(1e-12));
  const Plan read = plan_from_json(plan_to_json(cached), "the test's plan");
  CHECK(read.ranks[0].device.gradient_bandwidth == 32e9);
  CHECK(read.ranks[1].device.gradient_bandwidth == 0);
  CHECK(deadline_copy_seconds(read, read.layout, in.costs, 0) == doctest::Approx(slowest_member + leader).epsilon(1e-12));
  // No bandwidth measured: nothing charged.
  ClusterModel unmeasured = in.cluster;
  for (DeviceModel& d : unmeasured.ranks) d.memory_bandwidth = 0;
  Plan q = make_plan(input(unmeasured, costs(unmeasured, 4), 128, "data"));
  apply_deadline_sync(q, in.costs, unmeasured);
  CHECK(deadline_copy_seconds(q, q.layout, in.costs, 0) == 0);
}

TEST_CASE("deadline plan: every rank trains; a plan with replicas that leaves one idle is refused, naming it") {
  // Three ranks far slower than rank 0: auto trains on rank 0 alone, unless every rank must.
  const ClusterModel c = cluster({8e12, 2e9, 2e9, 2e9}, std::vector(4, 64 * kGiB), 1e-4, 1e8);
  PlannerInput in = input(c, costs(c, 4), 128);
  const Plan alone = make_plan(in);
  REQUIRE(has_idle_ranks(alone));
  CHECK_NOTHROW(check_deadline_ranks(alone));  // one replica: it runs as under sync
  in.use_every_rank = true;
  CHECK_FALSE(has_idle_ranks(make_plan(in)));
  CHECK_FALSE(has_idle_ranks(plan_for_policy(input(c, costs(c, 4), 128), ht::config::SyncPolicy::deadline, 0)));
  // A data-parallel plan with rank 2 idle, as a plan file made by hand might hold.
  Plan p = make_plan(input(c, costs(c, 4), 128, "data"));
  REQUIRE(p.layout.replicas.size() == 4);
  const int gone = p.layout.replicas[2][0];
  p.layout.replicas.erase(p.layout.replicas.begin() + 2);
  p.layout.samples[0] += p.layout.samples[2];
  p.layout.samples.erase(p.layout.samples.begin() + 2);
  p.layout.micro_batches.erase(p.layout.micro_batches.begin() + 2);
  for (RankPlan& r : p.ranks)
    if (r.rank == gone) r.replica = -1;
  const std::string e = error_of([&] { check_deadline_ranks(p); });
  CHECK(contains(e, "parallel.sync deadline: the plan leaves rank " + std::to_string(gone) + " idle"));
  CHECK(contains(e, "every rank trains"));
  CHECK_THROWS(apply_deadline_sync(p, in.costs, in.cluster));
}

TEST_CASE("deadline plan: where no layout over every rank fits, auto takes one replica over some ranks") {
  // Ranks 2 and 3 cannot hold one block (16 MB of weight state) and rank 1 not the whole
  // model: no plan over every rank fits, and no data-parallel one; a pipeline or rank 0
  // alone does, and its idle ranks keep with it as under sync (it has no stand-in to
  // wait for under deadline either).
  const ClusterModel c = cluster({2e13, 2e13, 1e13, 1e13}, {64 * kGiB, 60e6, 10e6, 10e6}, 1e-4, 5e8);
  const Plan p = plan_for_policy(input(c, costs(c, 6), 128), ht::config::SyncPolicy::deadline, 0);
  CHECK(p.sync_policy == plan::SyncPolicy::deadline);
  CHECK(p.layout.replicas.size() == 1);
  CHECK(has_idle_ranks(p));
  CHECK(p.ranks[2].replica < 0);
  CHECK(p.ranks[3].replica < 0);
  CHECK(check_schedules(plan_schedules(p)).ok);
  // Nothing at all fits: the error says what deadline asked of every attempt.
  const ClusterModel tiny = cluster({2e13, 2e13}, {10e6, 10e6}, 1e-4, 5e8);
  const std::string e =
      error_of([&] { plan_for_policy(input(tiny, costs(tiny, 6), 128), ht::config::SyncPolicy::deadline, 0); });
  CHECK(contains(e, "parallel.sync deadline: no plan in which every rank trains"));
}

TEST_CASE("deadline plan: where the leader's link sets the pace, a note says so with both steps") {
  // 32 equal replicas on a slow network: 62 gradients a step over the leader's link.
  const ClusterModel many = cluster(std::vector(32, 8e12), std::vector(32, 64 * kGiB), 1e-4, 1e9);
  const PlannerInput in = input(many, costs(many, 4, 1e6, 4096), 128, "data");
  Plan p = make_plan(in);
  REQUIRE(p.layout.replicas.size() == 32);
  const double sync_step = p.predicted.step_seconds;
  apply_deadline_sync(p, in.costs, in.cluster);
  const auto note = std::find_if(p.notes.begin(), p.notes.end(),
                                 [](const PlanNote& n) { return n.kind == NoteKind::deadline_leader; });
  REQUIRE(note != p.notes.end());
  CHECK(note->replicas == 32);
  CHECK(note->seconds == doctest::Approx(p.predicted.step_seconds).epsilon(1e-12));
  CHECK(note->other_seconds == doctest::Approx(sync_step).epsilon(1e-12));
  CHECK(note->seconds > kDeadlineNoteRatio * note->other_seconds);
  // The plan file keeps it.
  const Plan back = plan_from_json(plan_to_json(p), "test");
  CHECK(std::count_if(back.notes.begin(), back.notes.end(),
                      [](const PlanNote& n) { return n.kind == NoteKind::deadline_leader && n.replicas == 32; }) == 1);
  // Four replicas on a fast link: the leader's reduction costs little, and no note.
  const ClusterModel few = cluster({8e12, 4e12, 2e12, 2e12}, std::vector(4, 64 * kGiB), 1e-5, 1e10);
  const PlannerInput in4 = input(few, costs(few, 4), 128, "data");
  Plan q = make_plan(in4);
  apply_deadline_sync(q, in4.costs, in4.cluster);
  CHECK(std::none_of(q.notes.begin(), q.notes.end(),
                     [](const PlanNote& n) { return n.kind == NoteKind::deadline_leader; }));
}
