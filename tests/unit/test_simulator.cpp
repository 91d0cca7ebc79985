// The simulator against closed-form pipeline results with hand-written cost models (1F1B
// bubble, slowest-stage bound, message delays, data-parallel stragglers, activation peaks),
// its error reports, the Chrome trace it shares with the executor, and the all-reduce
// rounds the cost model charges to ReduceGrads and GatherWeights.
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/cluster_model.h"
#include "plan/deadline_plan.h"
#include "plan/plan_costs.h"
#include "plan/schedule.h"
#include "plan/simulator.h"
#include "report/trace.h"

using namespace ht;
using namespace ht::plan;

namespace {

// One replica per row, ranks numbered replica-major: replica r, stage s -> r*S + s.
PipelineLayout layout(int stages, int micro_batches, int replicas = 1, bool recompute = false) {
  PipelineLayout l;
  l.replicas.assign(replicas, std::vector<int>(stages));
  for (int r = 0; r < replicas; ++r)
    for (int s = 0; s < stages; ++s) l.replicas[r][s] = r * stages + s;
  l.micro_batches.assign(replicas, micro_batches);
  l.samples.assign(replicas, micro_batches);  // one sample each: bytes per micro-batch = per sample
  l.activation_bytes.assign(stages - 1, 4096);
  if (recompute) l.recompute.assign(replicas, std::vector<bool>(stages, true));
  return l;
}

std::vector<Schedule> build(const PipelineLayout& l) {
  const int world = static_cast<int>(l.replicas.size() * l.replicas[0].size());
  return build_1f1b(l, world);
}

// Forward/backward seconds by rank; every other op is free unless `step` is set.
CostModel compute_costs(std::vector<double> f, std::vector<double> b, double step = 0) {
  CostModel c;
  c.compute_seconds = [f, b, step](int rank, const Instruction& in) {
    switch (in.op) {
      case Op::forward: return f.at(rank);
      case Op::backward: return b.at(rank);
      case Op::optimizer_step: return step;
      default: return 0.0;
    }
  };
  return c;
}

size_t instruction_total(const std::vector<Schedule>& all) {
  size_t n = 0;
  for (const Schedule& s : all) n += s.size();
  return n;
}

// busy + comm + idle == step on every rank with work: no time lost or counted twice.
void check_accounting(const SimResult& r) {
  for (size_t k = 0; k < r.busy_seconds.size(); ++k)
    CHECK(r.busy_seconds[k] + r.comm_seconds[k] + r.idle_seconds[k] ==
          doctest::Approx(r.step_seconds));
}

}  // namespace

TEST_CASE("sim: one stage, one replica runs back to back") {
  for (int m : {1, 4, 7}) {
    const double f = 0.25, b = 0.5, step = 0.125;
    const SimResult r = simulate(build(layout(1, m)), compute_costs({f}, {b}, step));
    CHECK(r.step_seconds == doctest::Approx(m * (f + b) + step));
    CHECK(r.utilisation[0] == doctest::Approx(1.0));
    CHECK(r.bubble_fraction == doctest::Approx(0.0));
    CHECK(r.idle_seconds[0] == doctest::Approx(0.0));
    check_accounting(r);
  }
}

TEST_CASE("sim: equal stages give the classic 1F1B bubble (S-1)/(M+S-1)") {
  // Ratios other than the builder's nominal F=1, B=2 too: the order of communication must
  // not add stalls of its own when messages are free.
  for (auto [f, b] : {std::pair{1.0, 2.0}, std::pair{1.0, 1.0}, std::pair{0.3, 1.7}})
    for (int s = 1; s <= 5; ++s)
      for (int m = 1; m <= 9; ++m) {
        CAPTURE(s);
        CAPTURE(m);
        CAPTURE(f);
        const SimResult r = simulate(build(layout(s, m)), compute_costs(std::vector(s, f),
                                                                         std::vector(s, b)));
        CHECK(r.step_seconds == doctest::Approx((m + s - 1) * (f + b)));
        CHECK(r.bubble_fraction == doctest::Approx(double(s - 1) / (m + s - 1)));
        for (int k = 0; k < s; ++k)
          CHECK(r.utilisation[k] == doctest::Approx(double(m) / (m + s - 1)));
        check_accounting(r);
      }
}

TEST_CASE("sim: unequal stages are paced by the slowest") {
  // With t_s = f_s + b_s and zero comm, 1F1B has no clean closed form once the slowest
  // stage k is not last (a slow first stage hides the others' latency behind its own
  // warm-up, so the step can be just M*t_0). What holds, and is checked:
  //  lower: stage k cannot start before its first input, sum_{s<k} f_s, must run M*t_k, and
  //         its last gradient still crosses sum_{s<k} b_s; and micro-batch 0 alone takes
  //         sum t_s. step >= max(sum t, max_k [sum_{s<k} t_s + M*t_k]).
  //  upper: step <= sum t + (M-1) * max t (micro-batch 0 crosses everything, then the
  //         slowest stage gates one more micro-batch per t_max).
  //  exact: when the slowest stage is the last one the two bounds meet (k = S-1 in the
  //         lower bound is the upper bound), so step = sum t + (M-1) * t_{S-1}.
  // The upper bound assumes dataflow order. build_1f1b fixes each rank's order of blocking
  // receives from a nominal timing: F = 1, B = 2 without estimates, where a stage whose B/F
  // differs can post a receive before independent compute and stall (the last two cases:
  // +1 s and +0.75 s over the bound, constant in M); so without estimates upper and exact
  // are checked at B = 2F only. With the layout's estimates the order follows the real
  // costs and the last case meets the bound; the one before keeps +0.5 s (`slack`), because
  // under rendezvous a sender also waits for its receiver to finish the compute in
  // progress, which no order of the pairs avoids (an eager or non-blocking send does).
  struct Case {
    std::vector<std::pair<double, double>> stages;
    double slack;  // over the upper bound with estimates
  };
  const std::vector<Case> cases = {
      {{{1, 2}, {2, 4}, {1, 2}}, 0},           {{{3, 6}, {1, 2}, {1, 2}}, 0},
      {{{1, 2}, {1, 2}, {2, 4}}, 0},           {{{1, 2}, {1.5, 3}, {1, 2}, {0.5, 1}}, 0},
      {{{0.5, 1}, {1, 1}, {0.25, 2}, {2, 3}}, 0.5}, {{{2, 1}, {1, 3}}, 0},
  };
  for (const Case& c : cases) {
    const int s = static_cast<int>(c.stages.size());
    std::vector<double> f, b, t;
    for (auto [fs, bs] : c.stages) {
      f.push_back(fs);
      b.push_back(bs);
      t.push_back(fs + bs);
    }
    const double sum = std::accumulate(t.begin(), t.end(), 0.0);
    const double slowest = *std::max_element(t.begin(), t.end());
    const bool last_is_slowest = t.back() == slowest;
    bool nominal = true;  // B = 2F on every stage, the ratio build_1f1b orders by
    for (int k = 0; k < s; ++k) nominal = nominal && b[k] == 2 * f[k];
    for (int m = 1; m <= 8; ++m) {
      CAPTURE(s);
      CAPTURE(m);
      CAPTURE(t[0]);
      double lower = sum, before = 0;
      for (int k = 0; k < s; ++k) {
        lower = std::max(lower, before + m * t[k]);
        before += t[k];
      }
      const double upper = sum + (m - 1) * slowest;
      const SimResult plain = simulate(build(layout(s, m)), compute_costs(f, b));
      PipelineLayout estimated = layout(s, m);
      estimated.forward_seconds = {f};
      estimated.backward_seconds = {b};
      const SimResult timed = simulate(build(estimated), compute_costs(f, b));
      for (const SimResult* r : {&plain, &timed}) {
        CHECK(r->step_seconds >= doctest::Approx(lower));
        check_accounting(*r);
      }
      if (nominal) CHECK(plain.step_seconds <= doctest::Approx(upper));
      if (nominal && last_is_slowest) CHECK(plain.step_seconds == doctest::Approx(upper));
      CHECK(timed.step_seconds <= doctest::Approx(plain.step_seconds));
      CHECK(timed.step_seconds <= doctest::Approx(upper + c.slack));
      if (m > 2 && c.slack > 0) CHECK(timed.step_seconds > doctest::Approx(upper));
      if (last_is_slowest && c.slack == 0) CHECK(timed.step_seconds == doctest::Approx(upper));
    }
  }
}

TEST_CASE("sim: messages delay a two-stage pipeline by one transfer each way") {
  // M = 1: F0, activation over the link, F1, B1, gradient back, B0.
  const double f0 = 1, f1 = 2, b0 = 3, b1 = 4, c = 0.5;
  CostModel costs = compute_costs({f0, f1}, {b0, b1});
  costs.message_seconds = [c](int, int, int64_t bytes) {
    CHECK(bytes == 4096);
    return c;
  };
  SimResult r = simulate(build(layout(2, 1)), costs);
  CHECK(r.step_seconds == doctest::Approx(f0 + c + f1 + b1 + c + b0));
  CHECK(r.comm_seconds[0] == doctest::Approx(2 * c));  // both ends busy for the transfer
  CHECK(r.comm_seconds[1] == doctest::Approx(2 * c));
  CHECK(r.idle_seconds[1] == doctest::Approx(f0 + b0));  // waits for F0, then after it sent
  check_accounting(r);

  // More micro-batches: every transfer is on some path, so the step grows with c and
  // never undercuts the zero-comm step.
  for (int m = 2; m <= 6; ++m) {
    const double no_comm =
        simulate(build(layout(2, m)), compute_costs({f0, f1}, {b0, b1})).step_seconds;
    r = simulate(build(layout(2, m)), costs);
    CHECK(r.step_seconds >= no_comm + 2 * c - 1e-12);
    CHECK(r.comm_seconds[0] == doctest::Approx(2 * m * c));
    check_accounting(r);
  }
}

TEST_CASE("sim: data parallel reduction waits for the slowest replica") {
  // S = 1, three replicas of different speeds: ReduceGrads starts when the slowest arrives
  // and lasts the longest member's reduce time; then every rank steps.
  const int m = 3;
  const std::vector<double> f = {1, 2, 0.5}, b = {2, 3, 1};
  const std::vector<double> reduce = {0.25, 0.5, 0.375};
  const double step = 0.125;
  CostModel costs = compute_costs(f, b, step);
  costs.reduce_seconds = [reduce](int rank, int stage) {
    CHECK(stage == 0);
    return reduce.at(rank);
  };
  const SimResult r = simulate(build(layout(1, m, 3)), costs);
  double slowest = 0;
  for (int k = 0; k < 3; ++k) slowest = std::max(slowest, m * (f[k] + b[k]));
  CHECK(r.step_seconds == doctest::Approx(slowest + 0.5 + step));
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(r.comm_seconds[k] == doctest::Approx(0.5));
    CHECK(r.idle_seconds[k] == doctest::Approx(slowest - m * (f[k] + b[k])));
    CHECK(r.busy_seconds[k] == doctest::Approx(m * (f[k] + b[k]) + step));
  }
  check_accounting(r);
}

TEST_CASE("sim: AlignReplica waits for its replica's last stage and lasts the slowest word between them") {
  // A 2 x 2 hybrid (ranks r*2 + s) with deadline's instructions: each replica's two ranks
  // agree after their OptimizerSteps, over their own words (replica 1's slower one).
  PipelineLayout l = layout(2, 2, 2);
  std::vector<Schedule> all = build(l);
  add_deadline_sync(all, l);
  REQUIRE(check_schedules(all).ok);
  // Replica 1 computes twice as slowly; the word from rank 2 to 3 takes 0.25 s, every
  // other 0.125 s, and no other message costs anything.
  CostModel costs = compute_costs({1, 1, 2, 2}, {2, 2, 4, 4}, 0.5);
  costs.message_seconds = [](int src, int dst, int64_t bytes) {
    if (bytes != kAlignBytes) return 0.0;
    return src == 2 && dst == 3 ? 0.25 : 0.125;
  };
  const SimResult r = simulate(all, costs);
  auto span_of = [&](int rank) {
    for (const Span& s : r.timeline)
      if (s.rank == rank && s.name == "AlignReplica" && s.category == "comm") return s;
    FAIL("no AlignReplica span on rank ", rank);
    return Span{};
  };
  auto step_end = [&](int rank) {
    for (const Span& s : r.timeline)
      if (s.rank == rank && s.name == "OptimizerStep") return s.end_s;
    return -1.0;
  };
  for (int replica = 0; replica < 2; ++replica) {
    CAPTURE(replica);
    const Span a = span_of(2 * replica), b = span_of(2 * replica + 1);
    // Starts when the later of the two ranks has stepped; both end together.
    CHECK(a.start_s == doctest::Approx(std::max(step_end(2 * replica), step_end(2 * replica + 1))));
    CHECK(b.start_s == doctest::Approx(a.start_s));
    CHECK(a.end_s - a.start_s == doctest::Approx(replica == 1 ? 0.25 : 0.125));
    CHECK(b.end_s == doctest::Approx(a.end_s));
  }
  check_accounting(r);
}

TEST_CASE("sim: 1F1B holds min(S-s, M) micro-batches of activations per stage") {
  for (int s = 1; s <= 4; ++s)
    for (int m = 1; m <= 6; ++m)
      for (bool recompute : {false, true}) {
        CAPTURE(s);
        CAPTURE(m);
        CAPTURE(recompute);
        CostModel costs = compute_costs(std::vector(s, 1.0), std::vector(s, 2.0));
        costs.activation_bytes = [](int, int stage) { return int64_t{1000} * (stage + 1); };
        costs.checkpoint_bytes = [](int, int stage) { return int64_t{10} * (stage + 1); };
        const SimResult r = simulate(build(layout(s, m, 1, recompute)), costs);
        for (int k = 0; k < s; ++k) {
          const int64_t in_flight = std::min(s - k, m);
          const int64_t full = 1000 * (k + 1), stash = 10 * (k + 1);
          // With recompute the in-flight micro-batches keep only their checkpoints, and one
          // at a time is rebuilt in full for its Backward.
          CHECK(r.peak_activation_bytes[k] == (recompute ? in_flight * stash + full
                                                         : in_flight * full));
        }
      }
}

TEST_CASE("sim: broken schedules are reported by rank and instruction") {
  const Instruction send_act{Op::send_activation, 0, 0, 1, 64};
  const Instruction recv_act{Op::recv_activation, 0, 1, 0, 64};
  const Instruction send_grad{Op::send_grad, 0, 1, 0, 64};
  const Instruction recv_grad{Op::recv_grad, 0, 0, 1, 64};
  auto message = [](const std::vector<Schedule>& all) {
    try {
      simulate(all, CostModel{});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Both ranks send first: under rendezvous neither send can complete.
  std::string m = message({{send_act, recv_grad}, {send_grad, recv_act}});
  CHECK(m.find("deadlock") != std::string::npos);
  CHECK(m.find("rank 0 instruction 0 (SendActivation") != std::string::npos);
  CHECK(m.find("rank 1 instruction 0 (SendGrad") != std::string::npos);
  // The receiver never posts the receive.
  m = message({{send_act}, {}});
  CHECK(m.find("unmatched communication") != std::string::npos);
  CHECK(m.find("rank 1, which has finished") != std::string::npos);
  // A send meets the receive of another micro-batch.
  Instruction other = recv_act;
  other.micro_batch = 1;
  m = message({{send_act}, {other}});
  CHECK(m.find("micro-batch or bytes differ") != std::string::npos);
  // A peer outside the world.
  Instruction stray = send_act;
  stray.peer = 5;
  CHECK(message({{stray}, {}}).find("peer is not another rank") != std::string::npos);
  // A reduction one member cannot reach: rank 1 waits for data rank 0 never sends.
  const Instruction reduce{Op::reduce_grads, -1, 0};
  m = message({{reduce}, {recv_act, reduce}});
  CHECK(m.find("deadlock") != std::string::npos);
  CHECK(m.find("waits for the ReduceGrads of stage 0 on rank 1 instruction 0") !=
        std::string::npos);
}

TEST_CASE("trace: the simulated timeline is Chrome trace JSON, one event per instruction") {
  const std::vector<Schedule> all = build(layout(3, 4));
  CostModel costs = compute_costs({1, 1.5, 0.5}, {2, 3, 1}, 0.25);
  costs.message_seconds = [](int, int, int64_t) { return 0.125; };
  const SimResult r = simulate(all, costs);
  const auto trace = nlohmann::json::parse(report::to_chrome_trace(r.timeline, "3x4 1F1B"));
  CHECK(trace.at("displayTimeUnit") == "ms");
  CHECK(trace.at("otherData").at("title") == "3x4 1F1B");
  size_t work = 0, idle = 0, forwards = 0;
  std::vector<std::string> lanes;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") {
      if (e.at("name") == "thread_name") lanes.push_back(e.at("args").at("name"));
      continue;
    }
    CHECK(e.at("ph") == "X");
    CHECK(e.at("pid") == 0);
    const int rank = e.at("tid");
    CHECK((rank >= 0 && rank < 3));
    CHECK(e.at("dur").get<double>() >= 0);
    (e.at("cat") == "idle" ? idle : work) += 1;
    if (e.at("name") == "Forward" && e.at("cat") == "compute") {
      ++forwards;
      CHECK(e.at("args").at("micro_batch").get<int>() >= 0);
      CHECK(e.at("args").at("stage") == rank);
      const double f[] = {1, 1.5, 0.5};  // seconds -> microseconds
      CHECK(e.at("dur").get<double>() == doctest::Approx(f[rank] * 1e6));
    }
  }
  CHECK(work == instruction_total(all));
  CHECK(idle > 0);  // stages 1 and 2 wait for their first activation at least
  CHECK(forwards == 12);
  CHECK(lanes == std::vector<std::string>{"rank 0", "rank 1", "rank 2"});
}

TEST_CASE("trace: spans are validated") {
  CHECK_THROWS_AS(report::to_chrome_trace({{0, "Forward", "compute", 2, 1}}, "t"), Error);
  CHECK_THROWS_AS(report::to_chrome_trace({{0, "Forward", "busy", 0, 1}}, "t"), Error);
  CHECK_THROWS_AS(report::to_chrome_trace({{-1, "Forward", "compute", 0, 1}}, "t"), Error);
  const auto empty = nlohmann::json::parse(report::to_chrome_trace({}, "empty"));
  CHECK(empty.at("traceEvents").empty());
}

TEST_CASE("sim: a sharded stage's GatherWeights is charged after the slowest OptimizerStep") {
  // S = 1, three replicas: ReduceGrads (round 1) when the slowest arrives, each rank's step,
  // then GatherWeights (round 2, the updated weights) once the slowest step is done,
  // lasting the longest member's gather. All costs are dyadic, so the sums are exact.
  const int m = 2;
  const std::vector<double> f = {1, 2, 0.5}, b = {2, 3, 1};
  const std::vector<double> step = {0.125, 0.25, 0.5}, gather = {0.125, 0.25, 0.375};
  CostModel costs;
  costs.compute_seconds = [f, b, step](int rank, const Instruction& in) {
    switch (in.op) {
      case Op::forward: return f.at(rank);
      case Op::backward: return b.at(rank);
      case Op::optimizer_step: return step.at(rank);
      default: return 0.0;
    }
  };
  costs.reduce_seconds = [](int, int) { return 0.5; };
  costs.gather_seconds = [gather](int rank, int stage) {
    CHECK(stage == 0);
    return gather.at(rank);
  };
  const PipelineLayout l = layout(1, m, 3);
  std::vector<Schedule> all = build(l);
  const SimResult own = simulate(all, costs);
  add_weight_sync(all, l, {WeightSync::gather});
  const SimResult r = simulate(all, costs);
  const double slowest = m * (2 + 3);  // rank 1's compute
  CHECK(own.step_seconds == slowest + 0.5 + 0.5);
  CHECK(r.step_seconds == slowest + 0.5 + 0.5 + 0.375);
  CHECK(r.timeline.size() >= instruction_total(all));
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(r.comm_seconds[k] == 0.5 + 0.375);
    CHECK(r.busy_seconds[k] == m * (f[k] + b[k]) + step[k]);
    const auto gathered = std::find_if(r.timeline.begin(), r.timeline.end(), [k](const Span& s) {
      return s.rank == k && s.name == std::string("GatherWeights") && s.category == std::string("comm");
    });
    REQUIRE(gathered != r.timeline.end());
    CHECK(gathered->start_s == slowest + 0.5 + 0.5);
    CHECK(gathered->end_s == r.step_seconds);
    // ReduceStart posts the overlapped reduction: a zero-length span, no cost charged.
    const auto started = std::find_if(r.timeline.begin(), r.timeline.end(), [k](const Span& s) {
      return s.rank == k && s.name == std::string("ReduceStart");
    });
    REQUIRE(started != r.timeline.end());
    CHECK(started->start_s == started->end_s);
  }
  check_accounting(r);
}

TEST_CASE("sim: replicas that share the hub's weights wait for its word, one message after its step") {
  const PipelineLayout base = layout(1, 1, 3);
  PipelineLayout l = base;
  l.reduce_owner = 0;
  std::vector<Schedule> all = build(l);
  add_weight_sync(all, l, {WeightSync::share});
  CostModel costs;
  costs.compute_seconds = [](int rank, const Instruction& in) {
    if (in.op == Op::optimizer_step) return rank == 0 ? 1.0 : 0.0;  // the hub steps for all
    return in.op == Op::forward ? 1.0 : in.op == Op::backward ? 2.0 : 0.0;
  };
  costs.reduce_seconds = [](int, int) { return 0.5; };
  costs.message_seconds = [](int src, int dst, int64_t bytes) {
    CHECK(src == 0);
    CHECK(dst != 0);
    CHECK(bytes == 1);
    return 0.25;
  };
  const SimResult r = simulate(all, costs);
  CHECK(r.step_seconds == 3 + 0.5 + 1 + 0.25);
  CHECK(r.comm_seconds[0] == 0.5);          // the hub posts its word and is done
  for (int k = 1; k < 3; ++k) {
    CAPTURE(k);
    CHECK(r.comm_seconds[k] == 0.5 + 0.25);  // the word in flight
    CHECK(r.idle_seconds[k] == 1);           // the hub's step
  }
  check_accounting(r);

  // Without the hub's ShareWeights the replicas wait for ever: named as unmatched.
  all[0].pop_back();
  CHECK_THROWS_WITH_AS(simulate(all, costs),
                       doctest::Contains("rank 1 instruction 6 (AwaitWeights stage=0 peer=0) waits for rank 0, which "
                                         "has finished its schedule"),
                       Error);
}

TEST_CASE("plan costs: a sharded stage's all-reduce splits into ReduceGrads and GatherWeights rounds") {
  // Four ranks on 1 GB/s, 10 us links; rank 2 at a fifth of a core per 10 ms wakes
  // (0.8^2 x 10 ms) / 2 = 3.2 ms late. A hub (rank 0) owning everything moves 3 x 4 MB a
  // round: round 1 waits for the owners' wake (none), round 2 for every member's.
  ClusterModel c;
  c.ranks.resize(4);
  c.links = Links::uniform(4, 1e-5, 1e9);
  c.ranks[2].cpu_quota = 0.2;
  c.ranks[2].cpu_quota_period_s = 0.01;
  const std::vector<int> group = {0, 1, 2, 3};
  const AllreduceRounds hub = weighted_allreduce_rounds(c, group, {1, 0, 0, 0}, 4e6);
  CHECK(hub.first == doctest::Approx(1e-5 + 12e-3));
  CHECK(hub.second == doctest::Approx(1e-5 + 12e-3 + 3.2e-3));
  CHECK(hub.first + hub.second == doctest::Approx(weighted_allreduce_seconds(c, group, {1, 0, 0, 0}, 4e6)));
  // With rank 2 an owner, its wake delays both rounds.
  const AllreduceRounds equal = weighted_allreduce_rounds(c, group, {0.25, 0.25, 0.25, 0.25}, 4e6);
  CHECK(equal.first == doctest::Approx(1e-5 + 3e-3 + 3.2e-3));
  CHECK(equal.second == doctest::Approx(equal.first));
  CHECK(weighted_allreduce_rounds(c, {1}, {1}, 4e6) == AllreduceRounds{0, 0});
}
