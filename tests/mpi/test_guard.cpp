// The bad-node guard under MPI: three ranks of uneven data-parallel shares (the fourth
// idle), a NaN injected into rank 1's gradient in steps 1 to 3 (--inject's fault). Each
// step's result is checked against a float64 reference step over the samples that were
// kept: ranks 0's and 2's while rank 1 is left out (its NaN, then its quarantine), all
// three once it is tried again. Rank 1 is quarantined after its third offence on every
// rank, the replicas stay bit-identical, and the first member reports each exclusion.
//
// The bound. The reference (tests/harness/mlp_step_reference.h) bounds a float32
// evaluation of the gradient of the kept samples' mean, sum / kept. The executor instead
// sums the kept contributions, each pre-scaled by 1 / global, and multiplies the sum by
// the float32 factor global / kept (rescale_to_kept): two more roundings, of the factor
// and of the product, each within u = 2^-24 relative. So |computed - exact| <= bound x
// (1 + u)^2 + |exact| x ((1 + u)^2 - 1), within bound + 3 u (|value| + bound), which is
// what each gradient's bound is widened by. There is no clipping (grad_clip 0), so no
// norm carries that error further; the AdamW checks then take the widened gradient as
// they take the reference's own.
#include <doctest/doctest.h>

#include <numeric>

#include <cmath>
#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/models.h"
#include "mpi_util.h"
#include "plan/plan.h"
#include "runtime/executor.h"
#include "runtime/fault_injection.h"
#include "runtime/stage_gather.h"
#include "runtime/task.h"
#include "tests/harness/mlp_step_reference.h"
#include "tests/harness/synthetic_task.h"

using namespace ht;

namespace {

const std::vector<int64_t> kWidths{10, 12, 12, 4};
const std::vector<int64_t> kShares{9, 5, 10};  // ranks 0, 1, 2; rank 3 idle
constexpr int64_t kBatch = 24;
constexpr float kLr = 1e-2f;
constexpr int kSteps = 6;

ht::testing::SyntheticMlpTask make_task() { return {kWidths, {0.41f, 0.9f, true, 3}}; }

config::TrainConfig train_config() {
  config::TrainConfig t;
  t.batch_size = kBatch;
  t.optimizer.lr = kLr;
  t.grad_clip = 0;
  return t;
}

// One replica per share on ranks 0, 1, ...; the ranks past them idle. Rank 0 in two
// micro-batches, the others in one.
plan::Plan three_replicas(const std::vector<int64_t>& shares = kShares) {
  plan::Plan p;
  p.world_size = 4;
  p.blocks = static_cast<int>(kWidths.size()) - 1;
  p.global_batch = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  p.stage_ranges = {{0, p.blocks}};
  p.layout.samples = shares;
  p.layout.micro_batches.assign(shares.size(), 1);
  p.layout.micro_batches[0] = 2;
  p.layout.recompute.assign(shares.size(), std::vector<bool>(1, false));
  p.ranks.resize(4);
  for (int k = 0; k < 4; ++k) p.ranks[static_cast<size_t>(k)].rank = k;
  for (size_t r = 0; r < shares.size(); ++r) {
    p.layout.replicas.push_back({static_cast<int>(r)});
    plan::RankPlan& rp = p.ranks[r];
    rp.replica = rp.stage = 0;
    rp.replica = static_cast<int>(r);
    rp.block_end = p.blocks;
    rp.samples = shares[r];
    rp.micro_batches = p.layout.micro_batches[r];
  }
  return p;
}

struct State {
  std::map<std::string, std::vector<double>> params, exp_avg, exp_avg_sq;
};

std::vector<double> as_doubles(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return {f.begin(), f.end()};
}

// Collective: rank 0 gets the whole model and its AdamW moments (zeros before any step).
State gather_state(const plan::Plan& p, const runtime::Executor& ex, nn::Sequential& model) {
  const std::vector<nn::NamedTensor> state = runtime::gather_to_root(
      p, ex, model, comm::world(), train_config().optimizer, true, mpi_test::kLong, "the guard test's gather");
  State s;
  for (const auto& [name, t] : model.named_parameters()) {
    s.params[name] = as_doubles(t);
    s.exp_avg[name] = s.exp_avg_sq[name] = std::vector<double>(s.params[name].size(), 0.0);
  }
  auto ends_with = [](const std::string& a, const std::string& b) {
    return a.size() > b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
  };
  for (const auto& [name, t] : state) {
    if (t.dtype() != DType::f32) continue;
    if (ends_with(name, ".exp_avg_sq")) s.exp_avg_sq[name.substr(0, name.size() - 11)] = as_doubles(t);
    else if (ends_with(name, ".exp_avg")) s.exp_avg[name.substr(0, name.size() - 8)] = as_doubles(t);
  }
  return s;
}

reference::Bounded widened(reference::Bounded g) {
  for (size_t i = 0; i < g.value.size(); ++i)
    g.bound[i] += 3 * reference::kUnitRoundoff * (std::fabs(g.value[i]) + g.bound[i]);
  return g;
}

// Step `step` (0-based) took `before` to `after`, with the replicas in `kept` contributing.
void check_step(const State& before, const State& after, int step, const std::vector<int>& kept,
                const std::vector<int64_t>& shares = kShares) {
  CAPTURE(step);
  ht::testing::SyntheticMlpTask task = make_task();
  reference::Batch batch;
  int64_t offset = 0;
  const int64_t global = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  for (size_t r = 0; r < shares.size(); ++r) {
    if (std::find(kept.begin(), kept.end(), static_cast<int>(r)) != kept.end()) {
      const runtime::Batch b = task.train_batch(step * global + offset, shares[r]);
      for (float x : b.inputs.to_vector()) batch.inputs.push_back(x);
      for (int32_t y : b.targets.to_ints()) batch.labels.push_back(y);
      batch.rows += shares[r];
    }
    offset += shares[r];
  }
  std::vector<reference::DenseLayer> layers;
  for (size_t l = 0; l + 1 < kWidths.size(); ++l) {
    const std::string prefix = "blocks." + std::to_string(l) + ".linear.";
    layers.push_back({kWidths[l], kWidths[l + 1], before.params.at(prefix + "weight"), before.params.at(prefix + "bias")});
  }
  const reference::MlpStep g = reference::mlp_step(layers, batch, 0, 8);
  const config::OptimizerConfig opt = train_config().optimizer;
  const reference::AdamWHyper hyper{kLr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step + 1};
  for (size_t l = 0; l < layers.size(); ++l)
    for (const char* kind : {"weight", "bias"}) {
      const std::string name = "blocks." + std::to_string(l) + ".linear." + kind;
      CAPTURE(name);
      const reference::Bounded grad = widened(std::string(kind) == "weight" ? g.weight_grad[l] : g.bias_grad[l]);
      const reference::Worst worst[] = {
          reference::worst_ratio(after.exp_avg.at(name), reference::adamw_exp_avg(before.exp_avg.at(name), grad, opt.beta1)),
          reference::worst_ratio(after.exp_avg_sq.at(name),
                                 reference::adamw_exp_avg_sq(before.exp_avg_sq.at(name), grad, opt.beta2)),
          reference::worst_ratio(after.params.at(name),
                                 reference::adamw_parameters(before.params.at(name), after.exp_avg.at(name),
                                                             after.exp_avg_sq.at(name), hyper))};
      for (const reference::Worst& w : worst) {
        INFO("[", w.index, "] = ", w.got, ", float64 ", w.want, ", bound ", w.bound);
        CHECK(w.ratio <= 1.0);
      }
    }
}

void check_nan_left_out(const plan::Plan& p) {
  comm::Communicator& world = comm::world();
  REQUIRE(world.size() == 4);
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(11);
  runtime::Executor ex(p, model, task, world, train_config(), mpi_test::kLong);
  config::GuardConfig guard;
  guard.quarantine_after = 3;
  guard.quarantine_steps = 2;
  ex.set_guard(guard);
  runtime::FaultInjector faults({runtime::parse_fault("nan:rank=1,at=1,steps=3")}, world.rank());
  ex.inject(&faults);
  // Left out: its NaN in steps 1-3 (0-based 0-2), its quarantine in the next 2; then back.
  const std::vector<std::vector<int>> kept = {{0, 2}, {0, 2}, {0, 2}, {0, 2}, {0, 2}, {0, 1, 2}};
  State before = gather_state(p, ex, model);
  for (int step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    faults.begin_step(step + 1);
    const runtime::StepResult r = ex.step(step * kBatch, kLr, false);
    CHECK(!r.update_skipped);
    if (world.rank() == 0) {  // the stage group's first member reports
      const bool offence = step < 3, quarantined_now = step == 2;
      REQUIRE(r.guard_events.size() == (step == 5 ? 0u : quarantined_now ? 2u : 1u));
      if (step < 5) {
        CHECK(r.guard_events[0].rank == 1);
        CHECK(r.guard_events[0].samples == kShares[1]);
        CHECK(r.guard_events[0].verdict == (offence ? runtime::Verdict::non_finite : runtime::Verdict::quarantined));
      }
      if (quarantined_now) {
        CHECK(r.guard_events[1].verdict == runtime::Verdict::quarantined);
        CHECK(r.guard_events[1].quarantine_steps == 2);
      }
    } else {
      CHECK(r.guard_events.empty());
    }
    // Every rank, from the reduced verdicts alone, holds the same view of the quarantine.
    std::string view;
    for (int k = 0; k < 3; ++k) view += ex.active() && ex.quarantines(k) ? '1' : '0';
    const std::vector<std::string> views = world.allgather(view, mpi_test::kLong, "the quarantine views");
    const std::string expected = step == 2 || step == 3 ? "010" : "000";
    for (int k = 0; k < 3; ++k) CHECK(views[static_cast<size_t>(k)] == expected);
    const std::vector<std::string> checksums =
        world.allgather(ex.parameter_checksum(), mpi_test::kLong, "the replicas' checksums");
    CHECK_NOTHROW(runtime::check_replicas_identical(p, checksums, step + 1));
    State after = gather_state(p, ex, model);
    if (world.rank() == 0) check_step(before, after, step, kept[static_cast<size_t>(step)]);
    before = std::move(after);
  }
}

}  // namespace

TEST_CASE("guard: a NaN on one of 3 uneven replicas is left out, then quarantined, on every rank") {
  check_nan_left_out(three_replicas());
}

// Sharded, the gradients' all-reduce leaves each rank only its parts' sums, so the counts
// go through an all-reduce of their own.
TEST_CASE("guard: the same with the optimizer state sharded unevenly over the replicas") {
  plan::Plan p = three_replicas();
  const double shards[] = {0.5, 0.2, 0.3};
  for (size_t r = 0; r < 3; ++r) p.ranks[r].optimizer_shard = shards[r];
  check_nan_left_out(p);
}

// Finite garbage: once the norm history holds enough steps, a contribution 1000 times its
// usual norm is left out as an outlier, on every rank alike, and the update is the exact
// mean over the others' samples. Shares of at least kMinNormSamples, which the norm check
// needs.
TEST_CASE("guard: a gradient 1000 times its usual norm is left out as an outlier, on every rank") {
  const std::vector<int64_t> shares{20, 16, 24};
  const plan::Plan p = three_replicas(shares);
  comm::Communicator& world = comm::world();
  REQUIRE(world.size() == 4);
  const int64_t global = p.global_batch;
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(11);
  config::TrainConfig t = train_config();
  t.batch_size = global;
  runtime::Executor ex(p, model, task, world, t, mpi_test::kLong);
  config::GuardConfig guard;
  guard.quarantine_after = 10;  // left out, not quarantined, in this test
  ex.set_guard(guard);
  REQUIRE(guard.norm_ratio > 1);
  REQUIRE(runtime::kMinNormHistory <= 6);
  runtime::FaultInjector faults({runtime::parse_fault("scale:rank=1,at=7,factor=1000,steps=2")}, world.rank());
  ex.inject(&faults);
  State before = gather_state(p, ex, model);
  for (int step = 0; step < 9; ++step) {
    CAPTURE(step);
    faults.begin_step(step + 1);
    const runtime::StepResult r = ex.step(step * global, kLr, false);
    const bool garbage = step == 6 || step == 7;
    if (world.rank() == 0) {
      REQUIRE(r.guard_events.size() == (garbage ? 1u : 0u));
      if (garbage) {
        CHECK(r.guard_events[0].rank == 1);
        CHECK(r.guard_events[0].verdict == runtime::Verdict::norm);
        CHECK(r.guard_events[0].samples == shares[1]);
      }
    }
    const std::vector<std::string> checksums =
        world.allgather(ex.parameter_checksum(), mpi_test::kLong, "the replicas' checksums");
    CHECK_NOTHROW(runtime::check_replicas_identical(p, checksums, step + 1));
    State after = gather_state(p, ex, model);
    if (world.rank() == 0) check_step(before, after, step, garbage ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2}, shares);
    before = std::move(after);
  }
}

// A signal's stop travels in the step's guard counts where the reduction spans every
// rank: every rank learns of it in that step, and with which signal, SIGTERM over SIGINT
// where ranks were given both, so that every rank exits with one status (a rank that
// stopped on another's word exited 130 after a SIGTERM elsewhere).
TEST_CASE("guard counts: a stop asked on some ranks reaches every rank in that step, with the stronger signal") {
  comm::Communicator& world = comm::world();
  REQUIRE(world.size() == 4);
  const plan::Plan p = three_replicas({9, 5, 10, 6});
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(11);
  config::TrainConfig t = train_config();
  t.batch_size = p.global_batch;
  runtime::Executor ex(p, model, task, world, t, mpi_test::kLong);
  // Step by step, the signal each rank asks with: none; SIGINT on rank 1 and SIGTERM on
  // rank 2; SIGINT on rank 3 alone; SIGTERM on rank 0 alone.
  const int asked[4][4] = {{0, 0, 0, 0}, {0, SIGINT, SIGTERM, 0}, {0, 0, 0, SIGINT}, {SIGTERM, 0, 0, 0}};
  const int agreed[4] = {0, SIGTERM, SIGINT, SIGTERM};
  int step = 0;
  ex.set_stop_request([&] { return asked[step][world.rank()]; });
  for (; step < 4; ++step) {
    CAPTURE(step);
    const runtime::StepResult r = ex.step(step * p.global_batch, kLr, false);
    CHECK(r.stop_signal == agreed[step]);
  }
}
