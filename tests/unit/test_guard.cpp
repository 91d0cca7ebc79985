// The bad-node guard's decisions on fixed sequences: the norm check against the median
// of the accepted norms, the sticky verdict within a step, quarantine after repeated
// offences within the window and release after its steps, the rescale to the kept
// samples, and one process skipping the update of a poisoned step.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "comm/local_communicator.h"
#include "models/models.h"
#include "runtime/deadline_sync.h"
#include "runtime/executor.h"
#include "runtime/fault_injection.h"
#include "runtime/guard.h"
#include "runtime/task.h"
#include "tests/harness/synthetic_task.h"
#include "tests/unit/error_message.h"

using namespace ht;
using namespace ht::runtime;

namespace {

config::GuardConfig guard_config(double ratio, int64_t window, int64_t after, int64_t steps) {
  config::GuardConfig g;
  g.norm_ratio = ratio;
  g.window = window;
  g.quarantine_after = after;
  g.quarantine_steps = steps;
  return g;
}

}  // namespace

TEST_CASE("guard: a norm is an outlier above ratio x the median of the history, once it has enough") {
  const std::vector<double> five{1, 2, 3, 100, 4};  // median 3, whatever one large value
  CHECK(!norm_outlier(30, five, 10, 20));
  CHECK(norm_outlier(30.001, five, 10, 20));
  CHECK(!norm_outlier(1e9, {1, 2, 3, 4}, 10, 20));  // 4 < kMinNormHistory
  CHECK(norm_outlier(41, {1, 2, 3, 4}, 10, 4));     // a window of 4 needs only 4; median 2.5
  CHECK(!norm_outlier(1e9, five, 0, 20));           // ratio 0: no norm check
  CHECK(norm_outlier(25.001, {1, 2, 3, 4, 5, 100}, 7.1428, 20) == (25.001 > 7.1428 * 3.5));
}

TEST_CASE("guard: non-finite and outlying contributions are left out, and the verdict sticks for the step") {
  ContributionGuard g(guard_config(10, 20, 3, 5));
  // The norm judged is that of the rank's own mean gradient: sqrt(sum of squares) x
  // global / samples. 20 samples of 80: sum of squares 0.25 is a norm of 2.
  for (int step = 0; step < 5; ++step) {
    g.begin_step();
    CHECK(g.judge(0, 0.25, 20, 80) == Verdict::kept);
  }
  g.begin_step();
  CHECK(g.judge(0, 0.25 * 99, 20, 80) == Verdict::kept);    // norm 19.9 <= 10 x 2
  g.begin_step();
  CHECK(g.judge(0, 0.25 * 101, 20, 80) == Verdict::norm);  // norm 20.1 > 10 x 2
  CHECK(g.judge(1, 0.25, 20, 80) == Verdict::norm);        // sticky: the next group too
  g.begin_step();
  // The same contribution's norm from twice the share: the mean gradient's norm is unchanged.
  CHECK(g.judge(0, 1.0, 40, 80) == Verdict::kept);
  g.begin_step();
  CHECK(g.judge(0, std::numeric_limits<double>::quiet_NaN(), 20, 80) == Verdict::non_finite);
  CHECK(g.judge(1, 0.25, 20, 80) == Verdict::non_finite);
  g.begin_step();
  CHECK(g.judge(0, std::numeric_limits<double>::infinity(), 20, 80) == Verdict::non_finite);
  g.begin_step();
  // Fewer than kMinNormSamples samples are not judged by norm; non-finite ones still are.
  CHECK(g.judge(0, 1e6, kMinNormSamples - 1, 80) == Verdict::kept);
  CHECK(g.judge(0, std::numeric_limits<double>::quiet_NaN(), 1, 80) == Verdict::non_finite);
  g.begin_step();
  // Each group has its own history: group 1 has none yet, so its norm is not judged.
  CHECK(g.judge(1, 1e6, 20, 80) == Verdict::kept);
  CHECK(g.judge(0, 0.25, 20, 80) == Verdict::kept);
}

TEST_CASE("guard: left-out norms do not join the history, so a run of outliers stays out") {
  ContributionGuard g(guard_config(10, 5, 3, 5));
  for (int step = 0; step < 5; ++step) {
    g.begin_step();
    CHECK(g.judge(0, 1, 16, 16) == Verdict::kept);
  }
  for (int step = 0; step < 20; ++step) {
    g.begin_step();
    CHECK(g.judge(0, 400, 16, 16) == Verdict::norm);  // norm 20 against a median of 1, every time
  }
  g.begin_step();
  CHECK(g.judge(0, 1, 16, 16) == Verdict::kept);
}

TEST_CASE("guard: quarantine after quarantine_after offences within the window, then release") {
  Quarantine q(guard_config(10, 4, 2, 3), 3);
  using V = Verdict;
  const V k = V::kept, n = V::non_finite;
  CHECK(q.record({k, n, k}).empty());  // step 1: member 1's first offence
  CHECK(q.record({k, k, k}).empty());  // 2
  CHECK(q.record({k, k, k}).empty());  // 3
  CHECK(q.record({k, k, k}).empty());  // 4
  CHECK(q.record({k, V::norm, k}).empty());  // 5: step 1 left the window (steps 2..5)
  CHECK(!q.quarantined(1));
  CHECK(q.record({k, n, n}) == std::vector<int>{1});  // 6: the second within 4 steps
  for (int step = 7; step <= 9; ++step) {  // quarantined for 3 steps
    CHECK(q.quarantined(1));
    CHECK(q.record({k, V::quarantined, k}).empty());
  }
  CHECK(!q.quarantined(1));  // tried again at step 10, its offences forgotten
  CHECK(q.record({k, n, k}).empty());
  CHECK(!q.quarantined(0));
  CHECK(!q.quarantined(2));  // one offence at step 6
}

TEST_CASE("guard: a quarantine resumed under the replicas in another order follows the ranks") {
  // Members are a stage's replicas in replica order: world ranks 0, 2, 1, 3 before.
  using V = Verdict;
  const V k = V::kept, n = V::non_finite;
  Quarantine a(guard_config(10, 4, 2, 5), 4);
  CHECK(a.record({k, n, k, k}).empty());
  CHECK(a.record({k, n, k, k}) == std::vector<int>{1});  // member 1: world rank 2
  CHECK(a.record({k, k, n, k}).empty());                 // member 2 (rank 1): one offence
  const std::vector<std::vector<int>> before{{0}, {2}, {1}, {3}}, after{{0}, {1}, {2}, {3}};
  const std::vector<int64_t> moved = reorder_quarantine(a.state(), before, after, 0);
  REQUIRE_FALSE(moved.empty());
  Quarantine b(guard_config(10, 4, 2, 5), 4);
  b.restore(moved.data(), moved.size());
  CHECK(b.quarantined(2));  // world rank 2, now member 2
  CHECK_FALSE(b.quarantined(1));
  // Rank 1's offence moved with it: a second quarantines it (member 1 now), as under `a`.
  CHECK(b.record({k, n, k, k}) == std::vector<int>{1});
  CHECK(a.record({k, k, n, k}) == std::vector<int>{2});
  // Back to the first order: the same state as the run that never moved.
  const std::vector<int64_t> back = reorder_quarantine(b.state(), after, before, 0);
  CHECK(back == a.state());
  // Other ranks, another count or a malformed state: nothing to take.
  CHECK(reorder_quarantine(a.state(), before, {{0}, {1}, {2}, {4}}, 0).empty());
  CHECK(reorder_quarantine(a.state(), before, {{0}, {1}, {2}}, 0).empty());
  CHECK(reorder_quarantine(a.state(), before, after, 1).empty());
  std::vector<int64_t> cut = a.state();
  cut.pop_back();
  CHECK(reorder_quarantine(cut, before, after, 0).empty());
}

TEST_CASE("guard: a checkpoint's guard state for another order of the replicas, as a resume takes it") {
  using nlohmann::json;
  // Two stages, two replicas: world ranks 0 and 1 run stage 0, 2 and 3 stage 1.
  const json before = {{"world", 4}, {"replicas", {{0, 2}, {1, 3}}}, {"stages", {{0, 2}, {2, 4}}}};
  const json swapped = {{"world", 4}, {"replicas", {{1, 3}, {0, 2}}}, {"stages", {{0, 2}, {2, 4}}}};
  const json crossed = {{"world", 4}, {"replicas", {{2, 0}, {3, 1}}}, {"stages", {{0, 2}, {2, 4}}}};
  // Member 1 (world rank 1 on stage 0) quarantined until step 30, one offence at step 9.
  const std::string state = json{{"norms", {{0, {1.0, 2.0}}}}, {"quarantine", {12, 2, 0, 30, 0, 1, 9}}}.dump();
  const json a = json::parse(guard_state_for(state, before, swapped, 0, 0, 0));
  CHECK(a["quarantine"] == json{12, 2, 30, 0, 1, 9, 0});  // follows rank 1, now member 0
  CHECK(a["norms"] == json::parse(state)["norms"]);     // rank 0 runs stage 0 still
  // Rank 0 now runs stage 1 (one replica of each stage holds another's ranks, so no
  // quarantine carries over): a state of norms alone, a pipeline's, loses them, since they
  // were of stage 0's parameter groups (kept, a group's norms were judged against another
  // stage's, and a stage of one replica could leave every step out).
  CHECK(guard_state_for(state, before, crossed, 0, 1, 0).empty());
  // A checkpoint's rank past an int is refused, not wrapped onto rank 1 (which would take
  // the quarantine), as is one outside the world.
  for (const json& bad : {json((int64_t{1} << 32) + 1), json(4), json(-1), json("1")}) {
    json odd = before;
    odd["replicas"][1][0] = bad;
    CHECK(contains(error_of([&] { guard_state_for(state, odd, swapped, 0, 0, 0); }), "guard.layout: replica rank"));
  }
  const std::string norms = json{{"norms", {{0, {1.0, 2.0}}}}}.dump();
  CHECK(json::parse(guard_state_for(norms, before, crossed, 0, 1, 1))["norms"].empty());
  CHECK(json::parse(guard_state_for(norms, before, crossed, 2, 0, 0))["norms"].empty());
  CHECK(json::parse(guard_state_for(norms, before, swapped, 2, 1, 1))["norms"] == json::parse(norms)["norms"]);
  // Either side of local groups (a group's guard is of its members only): nothing carried
  // over (a 2-rank synchronous run's quarantine of 2 members failed a 1-member group's
  // resume as a corrupt file).
  json grouped = before;
  grouped["local_groups"] = json{{0}, {1}};
  CHECK(guard_state_for(state, before, grouped, 0, 0, 0).empty());
  CHECK(guard_state_for(state, grouped, before, 0, 0, 0).empty());
  // Another world, other stages, or ranks the column does not hold: nothing carried over.
  json other = before;
  other["world"] = 5;
  CHECK(guard_state_for(state, before, other, 0, 0, 0).empty());
  other = before;
  other["stages"] = {{0, 1}, {1, 4}};
  CHECK(guard_state_for(state, before, other, 0, 0, 0).empty());
  CHECK(stage_in(crossed, 0) == 1);
  CHECK(stage_in(crossed, 7) == -1);
}

TEST_CASE("guard: a quarantine's state survives the trip a deadline catch-up gives it") {
  // A rank that takes another's state must then decide every later step as that one does.
  using V = Verdict;
  const V k = V::kept, n = V::non_finite;
  Quarantine a(guard_config(10, 4, 2, 3), 3), b(guard_config(10, 4, 2, 3), 3);
  CHECK(a.record({k, n, k}).empty());
  CHECK(a.record({n, k, k}).empty());
  CHECK(a.record({k, n, k}) == std::vector<int>{1});  // member 1 quarantined for 3 steps
  CHECK(a.record({k, k, k}).empty());
  const std::vector<int64_t> st = a.state();
  b.restore(st.data(), st.size());
  CHECK(b.state() == st);
  CHECK(b.quarantined(1) == a.quarantined(1));
  CHECK(b.quarantined(1));
  // Member 0's offence at step 2 is still in both windows: a second quarantines it alike.
  CHECK(a.record({n, k, k}) == std::vector<int>{0});
  CHECK(b.record({n, k, k}) == std::vector<int>{0});
  CHECK(b.state() == a.state());

  Quarantine two(guard_config(10, 4, 2, 3), 2);
  CHECK_THROWS_WITH_AS(two.restore(st.data(), st.size()), doctest::Contains("for 3 members"), Error);
  CHECK_THROWS_WITH_AS(b.restore(st.data(), st.size() - 1), doctest::Contains("run past"), Error);
  std::vector<int64_t> longer = st;
  longer.push_back(7);
  CHECK_THROWS_WITH_AS(b.restore(longer.data(), longer.size()), doctest::Contains("left over"), Error);
  std::vector<int64_t> negative = st;
  negative[0] = -1;
  CHECK_THROWS_WITH_AS(b.restore(negative.data(), negative.size()), doctest::Contains("steps recorded"), Error);
  CHECK(b.state() == a.state());  // a refused state changes nothing
}

TEST_CASE("guard: the sum over kept samples is rescaled to their mean") {
  // Contributions pre-scaled by 1 / 40; 30 of the 40 samples kept.
  const Tensor t = Tensor::from_vector({3.f / 40, -6.f / 40, 0.f}, {3}, cpu_backend());
  rescale_to_kept({t}, 40, 30);
  const std::vector<float> v = t.to_vector();
  // Three roundings (of 3/40, of the factor 4/3, of the product), each within u
  // relative: within 3 u x 0.1 = 2.4 ulps of 0.1, and likewise of -0.2.
  CHECK(std::fabs(v[0] - 0.1f) <= 3 * (std::nextafter(0.1f, 1.f) - 0.1f));
  CHECK(std::fabs(v[1] + 0.2f) <= 3 * (std::nextafter(0.2f, 1.f) - 0.2f));
  CHECK(v[2] == 0.f);
  const Tensor same = Tensor::from_vector({1.f, 2.f}, {2}, cpu_backend());
  rescale_to_kept({same}, 40, 40);  // all kept: untouched, bit for bit
  rescale_to_kept({same}, 40, 0);   // none kept: nothing to average
  CHECK(same.to_vector() == std::vector<float>{1.f, 2.f});
}

namespace {

// A 2-block MLP on synthetic data, a pure function of the stream position.
ht::testing::SyntheticMlpTask make_task() { return {{6, 8, 3}, {0.3f, 0.7f, false, 1}}; }

std::vector<std::vector<float>> values(const std::vector<nn::NamedTensor>& ts) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, t] : ts) out.push_back(t.to_vector());
  return out;
}

}  // namespace

TEST_CASE("guard: one process skips the update of a step whose gradient is not finite, and says so") {
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(3);
  comm::LocalCommunicator world;
  config::TrainConfig train;
  train.batch_size = 8;
  const plan::Plan plan = runtime::single_process_plan(static_cast<int>(model.size()), 8, 2);
  runtime::Executor ex(plan, model, task, world, train, std::chrono::seconds(1));
  runtime::FaultInjector faults({runtime::parse_fault("nan:rank=0,at=2")}, 0);
  ex.inject(&faults);
  std::vector<std::vector<float>> before = values(ex.parameters());
  for (int64_t step = 1; step <= 3; ++step) {
    CAPTURE(step);
    faults.begin_step(step);
    const runtime::StepResult r = ex.step((step - 1) * 8, 1e-2f, false);
    const std::vector<std::vector<float>> after = values(ex.parameters());
    CHECK(r.update_skipped == (step == 2));
    CHECK((after == before) == (step == 2));  // bit for bit, and moved otherwise
    REQUIRE(r.guard_events.size() == (step == 2 ? 1u : 0u));
    if (step == 2) {
      CHECK(r.guard_events[0].rank == 0);
      CHECK(r.guard_events[0].verdict == Verdict::non_finite);
      CHECK(r.guard_events[0].samples == 8);
    }
    for (const auto& v : after)
      for (float x : v) CHECK(std::isfinite(x));
    before = after;
  }
  // AdamW counted two updates, not three: the skipped step did not advance it.
  for (const auto& [name, t] : ex.optimizer()->state())
    if (t.dtype() == DType::i32) CHECK(t.to_ints().at(0) == 2);
}

TEST_CASE("guard: sum_of_squares is the sum in double to 1e-5, finite for finite values, NaN or infinite for those") {
  // 5,000 values (blocks of 1,024 and a rest) of magnitudes 2^-8 .. 2^7, mixed signs.
  std::vector<float> v(5000);
  double exact = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::ldexp(static_cast<float>((i * 7919) % 1000 + 1) / 1000.f, static_cast<int>(i % 16) - 8) *
           (i % 3 == 0 ? -1.f : 1.f);
    exact += static_cast<double>(v[i]) * static_cast<double>(v[i]);
  }
  const auto tensor = [](const std::vector<float>& x) {
    return Tensor::from_vector(x, {static_cast<int64_t>(x.size())}, cpu_backend());
  };
  // Every term is positive: each float operation errs by at most 2^-24 of its result,
  // which is at most the whole sum, and a value passes through its square, up to
  // 1024 / 16 additions in its lane and 16 more into its block's sum: 81.
  CHECK(std::fabs(sum_of_squares(tensor(v)) - exact) <= 81 * std::ldexp(exact, -24));
  // 1e20 squares past float's range (3.4e38): a finite gradient all the same.
  std::vector<float> big = v;
  big[1500] = 1e20f;
  const double with_big = sum_of_squares(tensor(big));
  CHECK(std::isfinite(with_big));
  CHECK(with_big == doctest::Approx(1e40).epsilon(1e-6));
  std::vector<float> nan = v;
  nan[4999] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(sum_of_squares(tensor(nan))));
  std::vector<float> inf = v;
  inf[7] = -std::numeric_limits<float>::infinity();
  CHECK(std::isinf(sum_of_squares(tensor(inf))));
  CHECK(sum_of_squares(tensor({})) == 0);
}

TEST_CASE("guard: quarantining every member fails naming it, where the job would train nothing on") {
  Quarantine q(guard_config(10, 4, 2, 3), 2);
  using V = Verdict;
  const V k = V::kept, n = V::non_finite;
  CHECK(q.record({n, k}).empty());
  CHECK(q.record({n, n}) == std::vector<int>{0});  // member 0 quarantined; member 1 trains
  CHECK(q.quarantined(0));
  try {
    q.record({V::quarantined, n});  // member 1's second offence: none would be left
    FAIL("expected an error");
  } catch (const ht::Error& e) {
    CHECK(std::string(e.what()).find("quarantined every one of the 2 contributions to this stage by step 3") !=
          std::string::npos);
  }
}

TEST_CASE("deadline log: a late contribution applied is trained, though its own step counted it dropped") {
  // Step 5 closed without rank 2's 16 samples (dropped); step 6 applied them, a step
  // stale, in place of its own (dropped in turn). The trainer's count of samples trained
  // takes them back: 96 drawn, 32 dropped, 16 of those applied late.
  ht::runtime::DeadlineLog log;
  ht::comm::StepRecord late;
  late.step = 5;
  late.contributors = {{0, 48, 0}};
  late.samples = late.fresh_samples = 48;
  late.samples_dropped = 16;
  late.closed_short = true;
  ht::comm::StepRecord applied;
  applied.step = 6;
  applied.contributors = {{0, 48, 0}, {2, 16, 1}};
  applied.samples = 64;
  applied.fresh_samples = 48;
  applied.samples_dropped = 16;
  applied.closed_short = true;
  applied.staleness_applied = 1;
  CHECK_FALSE(log.add(late).empty());
  CHECK_FALSE(log.add(applied).empty());
  CHECK(log.samples_dropped() == 32);
  CHECK(log.stale_samples() == 16);
  // The window's loss is over its fresh samples (96, two predictions each), and a window
  // that brought none has no loss: a hybrid plan's rank 0 caught up past its steps, or
  // realigned to them, and holds none of their losses (the trainer's record leaves it out).
  late.loss_sum = 19.2, applied.loss_sum = 9.6;
  ht::runtime::DeadlineLog windows;
  windows.add(late);
  windows.add(applied);
  const std::optional<double> both = windows.take_window_loss(2);
  REQUIRE(both);
  CHECK(*both == doctest::Approx(28.8 / 192).epsilon(1e-12));
  CHECK_FALSE(windows.take_window_loss(2));
  ht::comm::StepRecord caught_up_past;
  caught_up_past.step = 7;
  caught_up_past.contributors = {{1, 64, 0}};
  caught_up_past.samples = 64;  // fresh_samples 0 and loss_sum 0: the loss forgotten
  windows.add(caught_up_past);
  CHECK_FALSE(windows.take_window_loss(2));
}
