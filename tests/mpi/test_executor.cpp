// Exactness of the executor: training split over ranks (uneven data-parallel shares, 2
// and 3 pipeline stages, a 2 x 2 hybrid, recomputation, shares changed between steps,
// optimiser-state sharding, a hub, relayouts) computes the steps of one process training
// the same global batches.
//
// How close is close enough, derived rather than read off one machine. Every layout
// evaluates the same formulas; what differs is the order of float32 sums (over
// micro-batches, replicas, the parts of a sharded all-reduce, the stages' norms for
// clipping) and the sizes of the matrix products. Comparing parameters after several
// AdamW steps cannot be bounded usefully: AdamW divides by sqrt(v), so a gradient within
// rounding of 0 may move its parameter by up to lr either way. So every step is checked
// on its own, from the state the distributed run reached before it, against a float64
// reference that carries a rounding-error bound for each value
// (tests/harness/mlp_step_reference.h, no hetrain code): after step t, rank 0 gathers the
// whole model's parameters and AdamW state and requires
//   - the moments m and v, which are linear in the step's clipped gradient (sums over the
//     global batch of per-sample terms), within the bound of a float32 evaluation in any
//     summation order;
//   - the parameters within the fused update's own rounding of AdamW applied to those
//     moments (so sqrt(v) magnifies nothing);
//   - the summed loss within its bound, and the update counters exact.
// The bounds are of order 1e-7 relative to the magnitudes summed; a per-rank mean in place
// of the sample-weighted sum, or a micro-batch lost, moves the moments by a sizeable part
// of the gradient: 50 to a million times their bounds (measured). The plain one-process
// loop (model, loss, backward, clip, AdamW; no Executor) meets the same bounds in its own
// test case, which shows they hold for the library's float32 arithmetic outside the code
// under test.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <csignal>

#include "comm/communicator.h"
#include "models/models.h"
#include "mpi_util.h"
#include "ops/ops.h"
#include "optim/grad_clip.h"
#include "optim/make_optimizer.h"
#include "plan/plan.h"
#include "runtime/executor.h"
#include "runtime/stage_gather.h"
#include "runtime/task.h"
#include "tests/harness/mlp_step_reference.h"
#include "tests/harness/synthetic_task.h"

using namespace ht;

namespace {

constexpr int64_t kBatch = 20;
constexpr int kSteps = 3;
constexpr float kLr = 1e-2f;
constexpr float kClip = 0.5f;
const std::vector<int64_t> kWidths{12, 16, 16, 16, 5};  // the MLP's layer widths
// Float32 additions of partial losses beyond a micro-batch's own sum: its cast for the
// all-reduce and the all-reduce's adds over 4 ranks (the per-rank sums are in double).
constexpr int kLossAdds = 8;

// A 4-block MLP on synthetic data that is a pure function of the stream position.
ht::testing::SyntheticMlpTask make_task() { return {kWidths, {0.37f, 1.3f, false, 7}}; }

config::TrainConfig train_config() {
  config::TrainConfig t;
  t.batch_size = kBatch;
  t.optimizer.lr = kLr;
  t.grad_clip = kClip;  // small enough to clip: the norm is summed across stages
  return t;
}

// A hand-made plan: replicas[r][s] = rank, ranges per stage, samples and M per replica;
// ranks in no replica stay idle.
plan::Plan layout(std::vector<std::vector<int>> replicas, std::vector<std::pair<int, int>> ranges,
                  std::vector<int64_t> samples, std::vector<int> micro_batches,
                  std::vector<int> recompute_ranks = {}) {
  plan::Plan p;
  p.world_size = 4;
  p.blocks = 4;
  p.global_batch = kBatch;
  p.stage_ranges = ranges;
  p.layout.replicas = replicas;
  p.layout.samples = samples;
  p.layout.micro_batches = micro_batches;
  p.layout.activation_bytes.assign(ranges.size() - 1, 16 * 4);
  p.layout.recompute.assign(replicas.size(), std::vector<bool>(ranges.size(), false));
  p.ranks.resize(4);
  for (int k = 0; k < 4; ++k) p.ranks[static_cast<size_t>(k)].rank = k;
  for (size_t r = 0; r < replicas.size(); ++r)
    for (size_t s = 0; s < ranges.size(); ++s) {
      plan::RankPlan& rp = p.ranks[static_cast<size_t>(replicas[r][s])];
      rp.replica = static_cast<int>(r);
      rp.stage = static_cast<int>(s);
      std::tie(rp.block_begin, rp.block_end) = ranges[s];
      rp.samples = samples[r];
      rp.micro_batches = micro_batches[r];
      for (int k : recompute_ranks)
        if (k == rp.rank) rp.recompute = p.layout.recompute[r][s] = true;
    }
  return p;
}

// Sets the optimiser shards of stage s's ranks, in replica order.
plan::Plan sharded(plan::Plan p, size_t stage, const std::vector<double>& shards) {
  for (size_t r = 0; r < shards.size(); ++r)
    p.ranks[static_cast<size_t>(p.layout.replicas[r][stage])].optimizer_shard = shards[r];
  return p;
}

// Rank 0's view of a run after some step: the whole model's parameters and AdamW state.
struct Snapshot {
  std::map<std::string, std::vector<double>> params, exp_avg, exp_avg_sq;
  std::map<std::string, int32_t> counters;  // "<param>.step" and "step"
};

std::vector<double> as_doubles(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return {f.begin(), f.end()};
}

Snapshot snapshot(const std::vector<nn::NamedTensor>& params, const std::vector<nn::NamedTensor>& state) {
  Snapshot s;
  for (const auto& [name, t] : params) s.params[name] = as_doubles(t);
  auto ends_with = [](const std::string& a, const std::string& b) {
    return a.size() > b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
  };
  for (const auto& [name, t] : state) {
    if (t.dtype() == DType::i32) s.counters[name] = t.to_ints().at(0);
    else if (ends_with(name, ".exp_avg_sq")) s.exp_avg_sq[name.substr(0, name.size() - 11)] = as_doubles(t);
    else if (ends_with(name, ".exp_avg")) s.exp_avg[name.substr(0, name.size() - 8)] = as_doubles(t);
  }
  return s;
}

// Before the first step: the seed's parameters, zero moments.
Snapshot initial_snapshot() {
  ht::testing::SyntheticMlpTask task = make_task();
  const nn::Sequential model = task.build_model(7);
  Snapshot s = snapshot(model.named_parameters(), {});
  for (const auto& [name, p] : s.params) {
    s.exp_avg[name] = s.exp_avg_sq[name] = std::vector<double>(p.size(), 0.0);
    s.counters[name + ".step"] = 0;
  }
  s.counters["step"] = 0;
  return s;
}

// The largest error / bound ratios seen, for the report.
struct Ratios {
  double moments = 0, params = 0, loss = 0;
};

// Checks step `step` (0-based), which took `before` to `after` with summed loss
// `loss_sum`, against the float64 reference from `before`'s state (see the top).
void check_step(const Snapshot& before, const Snapshot& after, double loss_sum, int step, Ratios& ratios) {
  CAPTURE(step);
  ht::testing::SyntheticMlpTask task = make_task();
  const runtime::Batch b = task.train_batch(step * kBatch, kBatch);
  reference::Batch batch;
  batch.rows = kBatch;
  for (float x : b.inputs.to_vector()) batch.inputs.push_back(x);
  batch.labels = b.targets.to_ints();
  std::vector<reference::DenseLayer> layers;
  for (size_t l = 0; l + 1 < kWidths.size(); ++l) {
    const std::string prefix = "blocks." + std::to_string(l) + ".linear.";
    REQUIRE(before.params.count(prefix + "weight") == 1);
    layers.push_back({kWidths[l], kWidths[l + 1], before.params.at(prefix + "weight"), before.params.at(prefix + "bias")});
  }
  const reference::MlpStep g = reference::mlp_step(layers, batch, kClip, kLossAdds);
  const config::OptimizerConfig opt = train_config().optimizer;
  const reference::AdamWHyper hyper{kLr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step + 1};

  const double loss_error = std::fabs(loss_sum - g.loss_sum);
  INFO("summed loss ", loss_sum, ", float64 ", g.loss_sum, ", bound ", g.loss_bound);
  CHECK(loss_error <= g.loss_bound);
  ratios.loss = std::max(ratios.loss, loss_error / g.loss_bound);
  CHECK(after.counters.at("step") == step + 1);
  REQUIRE(after.params.size() == before.params.size());
  for (size_t l = 0; l < layers.size(); ++l)
    for (const char* kind : {"weight", "bias"}) {
      const std::string name = "blocks." + std::to_string(l) + ".linear." + kind;
      CAPTURE(name);
      REQUIRE(after.exp_avg.count(name) == 1);
      REQUIRE(after.exp_avg_sq.count(name) == 1);
      REQUIRE(after.params.count(name) == 1);
      CHECK(after.counters.at(name + ".step") == step + 1);
      const reference::Bounded& grad = std::string(kind) == "weight" ? g.weight_grad[l] : g.bias_grad[l];
      const std::pair<std::string, reference::Worst> worst[] = {
          {"exp_avg", reference::worst_ratio(after.exp_avg.at(name),
                                             reference::adamw_exp_avg(before.exp_avg.at(name), grad, opt.beta1))},
          {"exp_avg_sq", reference::worst_ratio(after.exp_avg_sq.at(name),
                                                reference::adamw_exp_avg_sq(before.exp_avg_sq.at(name), grad, opt.beta2))},
          {"parameter", reference::worst_ratio(after.params.at(name),
                                               reference::adamw_parameters(before.params.at(name), after.exp_avg.at(name),
                                                                           after.exp_avg_sq.at(name), hyper))}};
      for (const auto& [what, w] : worst) {
        INFO(what, "[", w.index, "] = ", w.got, ", float64 ", w.want, ", bound ", w.bound);
        CHECK(w.ratio <= 1.0);
        double& r = what == "parameter" ? ratios.params : ratios.moments;
        r = std::max(r, w.ratio);
      }
    }
}

// The plain loop of one process on the whole global batch, not through the Executor:
// forward, summed loss / batch, backward, clip, AdamW. Every step meets the bounds (its
// own test case); its final state is what the distributed runs load back (round trip).
struct PlainRun {
  std::vector<Snapshot> after;  // after each step
  std::vector<double> loss;     // each step's summed loss
  std::vector<nn::NamedTensor> state;
};

PlainRun plain_one_process() {
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(7);
  const std::vector<nn::NamedTensor> params = model.named_parameters();
  const config::TrainConfig train = train_config();
  std::unique_ptr<optim::Optimizer> opt = optim::make_optimizer(train.optimizer, params);
  PlainRun run;
  for (int step = 0; step < kSteps; ++step) {
    const runtime::Batch b = task.train_batch(step * kBatch, kBatch);
    const Tensor loss = cross_entropy(model.forward(b.inputs), b.targets, Reduction::sum);
    run.loss.push_back(loss.item());
    mul(loss, 1.f / static_cast<float>(kBatch)).backward();
    optim::clip_grad_norm(params, train.grad_clip);
    opt->set_lr(kLr);
    opt->step();
    opt->zero_grad();
    run.after.push_back(snapshot(params, opt->state()));
  }
  for (const auto& [name, t] : opt->state()) run.state.emplace_back(name, clone(t));
  return run;
}

// Two optimiser states of the same names and shapes are the same, bit for bit.
void check_same_state(const std::vector<nn::NamedTensor>& got, const std::vector<nn::NamedTensor>& want) {
  REQUIRE(got.size() == want.size());
  std::map<std::string, Tensor> by_name(want.begin(), want.end());
  for (const auto& [name, t] : got) {
    CAPTURE(name);
    REQUIRE(by_name.count(name) == 1);
    const Tensor& w = by_name.at(name);
    REQUIRE(t.shape() == w.shape());
    if (t.dtype() == DType::i32) CHECK(t.to_ints() == w.to_ints());
    else CHECK(t.to_vector() == w.to_vector());
  }
}

// Follows a distributed run: after each step every replica of a stage holds the same
// bits, and rank 0 gathers the whole model and checks the step (check_step).
class StepChecker {
 public:
  StepChecker() : before_(initial_snapshot()) {}

  // Collective over the world.
  void after_step(const plan::Plan& p, const runtime::Executor& ex, nn::Sequential& model, double loss_sum) {
    comm::Communicator& world = comm::world();
    std::vector<Tensor> total{Tensor::from_vector({static_cast<float>(loss_sum)}, {1}, cpu_backend())};
    REQUIRE(world.allreduce_sum(total, mpi_test::kLong) == comm::WaitStatus::done);
    const std::vector<std::string> checksums = world.allgather(ex.parameter_checksum(), mpi_test::kLong, "the replicas' checksums");
    CHECK_NOTHROW(runtime::check_replicas_identical(p, checksums, step_ + 1));
    const std::vector<nn::NamedTensor> state =
        runtime::gather_to_root(p, ex, model, world, train_config().optimizer, true, mpi_test::kLong, "the test gather");
    if (world.rank() == 0) {
      Snapshot after = snapshot(model.named_parameters(), state);
      check_step(before_, after, total[0].item(), step_, ratios_);
      before_ = std::move(after);
    }
    ++step_;
  }

  // Collective: after the last step. Training moved the parameters (so agreeing means
  // something); rank 0 reports the largest ratios and the difference to the plain loop.
  // Then every rank loads its part of the plain loop's optimiser state and rank 0 gathers
  // it again: a round trip, so exactly the same.
  void finish(const plan::Plan& p, const runtime::Executor& ex, nn::Sequential& model) {
    comm::Communicator& world = comm::world();
    REQUIRE(step_ == kSteps);
    const PlainRun plain = plain_one_process();
    if (world.rank() == 0) {
      const Snapshot init = initial_snapshot();
      double moved = 0, apart = 0;
      for (const auto& [name, v] : before_.params)
        for (size_t i = 0; i < v.size(); ++i) {
          moved = std::max(moved, std::fabs(v[i] - init.params.at(name)[i]));
          apart = std::max(apart, std::fabs(v[i] - plain.after.back().params.at(name)[i]));
        }
      CHECK(moved > 1e-2);
      MESSAGE("largest error / bound: moments ", ratios_.moments, ", parameters ", ratios_.params, ", loss ",
              ratios_.loss, "; parameters differ from the plain one-process loop's by up to ", apart);
    }
    const config::OptimizerConfig opt = train_config().optimizer;
    if (ex.active()) {
      std::vector<nn::NamedTensor> mine;
      for (const auto& [name, t] : plain.state) {
        bool ours = name == "step";
        for (const auto& [param, v] : ex.parameters()) ours = ours || name.rfind(param + ".", 0) == 0;
        if (ours) mine.emplace_back(name, t);
      }
      ex.load_optimizer_state(mine);
    }
    const std::vector<nn::NamedTensor> got = runtime::gather_to_root(p, ex, model, world, opt, true, mpi_test::kLong, "the test gather");
    if (world.rank() == 0) check_same_state(got, plain.state);
  }

 private:
  Snapshot before_;
  int step_ = 0;
  Ratios ratios_;
};

// With `then`, the shares (and micro-batch counts) change to its after the first step,
// as rebalancing does between steps.
void check_exact(const plan::Plan& p, const std::optional<plan::Plan>& then = std::nullopt) {
  comm::Communicator& world = comm::world();
  REQUIRE(world.size() == 4);
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(7);
  plan::Plan current = p;
  runtime::Executor ex(current, model, task, world, train_config(), mpi_test::kLong);
  // A hub stepping the optimiser shares its weights with its stage's replicas, all on
  // this host, unless the links are emulated.
  const bool emulated = std::any_of(world.link_emulation().begin(), world.link_emulation().end(),
                                    [](const comm::LinkEmulation& l) { return l.active(); });
  if (ex.active())
    CHECK(ex.shares_weights() == (plan::hub_steps_optimizer(p) && p.layout.replicas.size() > 1 && !emulated));
  StepChecker checker;
  bool alternate_next = false;  // a micro-batch trial's count in every other step
  for (int step = 0; step < kSteps; ++step) {
    if (step == 1 && then) {
      current = *then;
      ex.reshare();
      alternate_next = false;
    }
    const runtime::StepResult r = ex.step(step * kBatch, kLr, step == 0);
    if (ex.active()) {
      const auto k = static_cast<size_t>(ex.replica());
      const std::vector<int>& alternate = current.layout.alternate_micro_batches;
      const bool alternating = !alternate.empty() && alternate[k] > 0;
      CHECK(r.micro_batches == (alternating && alternate_next ? alternate[k] : current.layout.micro_batches[k]));
      alternate_next = alternating && !alternate_next;
    }
    if (step == 0 && ex.active()) {  // one span per instruction, and one for gathering sharded weights
      const size_t gathers = plan::optimizer_shards(p, static_cast<size_t>(ex.rank_plan().stage)).empty() ? 0 : 1;
      CHECK(r.spans.size() == plan::build_1f1b(p.layout, 4)[static_cast<size_t>(world.rank())].size() + gathers);
    }
    // A replicated stage's gradients all join the all-reduce during Backward.
    if (ex.active()) CHECK(r.grads_overlapped == (p.layout.replicas.size() > 1 ? ex.parameters().size() : 0));
    checker.after_step(current, ex, model, r.loss_sum);
  }
  checker.finish(current, ex, model);
}

}  // namespace

TEST_CASE("executor: the plain one-process loop (no executor) is within the float64 reference's bounds") {
  const PlainRun plain = plain_one_process();
  Snapshot before = initial_snapshot();
  Ratios ratios;
  for (int step = 0; step < kSteps; ++step) {
    check_step(before, plain.after[static_cast<size_t>(step)], plain.loss[static_cast<size_t>(step)], step, ratios);
    before = plain.after[static_cast<size_t>(step)];
  }
  if (comm::world().rank() == 0)
    MESSAGE("largest error / bound: moments ", ratios.moments, ", parameters ", ratios.params, ", loss ", ratios.loss);
}

TEST_CASE("executor: 4 ranks with uneven data-parallel shares match one process") {
  check_exact(layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1}));
}

TEST_CASE("executor: 2 pipeline stages match one process (stage 0 recomputes)") {
  check_exact(layout({{0, 1}}, {{0, 2}, {2, 4}}, {20}, {3}, {0}));
}

TEST_CASE("executor: 3 pipeline stages match one process") {
  check_exact(layout({{2, 0, 1}}, {{0, 1}, {1, 3}, {3, 4}}, {20}, {4}));
}

TEST_CASE("executor: 2 pipelines x 2 stages match one process") {
  check_exact(layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {13, 7}, {4, 2}, {3}));
}

TEST_CASE("executor: one replica owning every part of the reduction (a hub) matches one process") {
  plan::Plan data = layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1});
  data.layout.reduce_owner = 1;  // not rank 0, and not the largest share
  check_exact(data);
  plan::Plan hybrid = layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {13, 7}, {4, 2}, {3});
  hybrid.layout.reduce_owner = 0;
  plan::Plan moved = layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {6, 14}, {4, 2}, {3});
  moved.layout.reduce_owner = 0;
  check_exact(hybrid, moved);
}

TEST_CASE("executor: shares that change between steps (rebalancing) still match one process") {
  check_exact(layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1}),
              layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {4, 9, 2, 5}, {2, 1, 2, 1}));
  check_exact(layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {13, 7}, {4, 2}, {3}),
              layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {6, 14}, {4, 2}, {3}));
}

TEST_CASE("executor: replicas alternating micro-batch counts step by step (a trial) match one process") {
  plan::Plan trial = layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1});
  trial.layout.alternate_micro_batches = {4, 0, 1, 0};
  check_exact(trial);
  plan::Plan later = trial;
  later.layout.alternate_micro_batches = {0, 5, 0, 0};
  check_exact(layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1}), later);
}

TEST_CASE("executor: optimizer state sharded unevenly over the replicas matches one process") {
  // Data parallel with one rank keeping no state; shares that change between steps.
  const plan::Plan data = layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1});
  check_exact(sharded(data, 0, {0.5, 0.3, 0.2, 0}),
              sharded(layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {4, 9, 2, 5}, {2, 1, 2, 1}), 0, {0.5, 0.3, 0.2, 0}));
  // The hybrid with stage 0 sharded and stage 1 reduced by a hub (the norm for clipping
  // sums parts within stage 0, then both stages).
  plan::Plan hybrid = sharded(layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {13, 7}, {4, 2}, {3}), 0, {0.25, 0.75});
  hybrid.layout.reduce_owner = 1;
  check_exact(hybrid);
  // The hub steps the optimizer for all (the planner's choice under CPU quotas): in every
  // stage the hub's rank keeps the whole state, the others none.
  plan::Plan hub = data;
  hub.layout.reduce_owner = 0;
  plan::set_hub_steps_optimizer(hub, true);
  REQUIRE(plan::hub_steps_optimizer(hub));
  check_exact(hub);
  plan::Plan hub_hybrid = layout({{0, 1}, {3, 2}}, {{0, 3}, {3, 4}}, {13, 7}, {4, 2}, {3});
  hub_hybrid.layout.reduce_owner = 1;
  plan::set_hub_steps_optimizer(hub_hybrid, true);
  check_exact(hub_hybrid);
}

TEST_CASE("executor: a hub's weights sent to its replicas as messages (links emulated) match one process") {
  comm::Communicator& world = comm::world();
  plan::Plan hub = layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {11, 5, 3, 1}, {2, 1, 3, 1});
  hub.layout.reduce_owner = 2;
  plan::set_hub_steps_optimizer(hub, true);
  std::vector<comm::LinkEmulation> links(4);
  links[1].latency_s = 1e-6;
  world.set_link_emulation(links);
  REQUIRE(world.barrier(mpi_test::kLong) == comm::WaitStatus::done);
  check_exact(hub);
  world.set_link_emulation({});
  REQUIRE(world.barrier(mpi_test::kLong) == comm::WaitStatus::done);
}

TEST_CASE("executor: a sharded stage's whole optimizer state of the wrong shape is refused by name") {
  comm::Communicator& world = comm::world();
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(7);
  const plan::Plan p = sharded(layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {5, 5, 5, 5}, {1, 1, 1, 1}), 0, {0.4, 0.3, 0.2, 0.1});
  runtime::Executor ex(p, model, task, world, train_config(), mpi_test::kLong);
  std::vector<nn::NamedTensor> whole = optim::make_optimizer(train_config().optimizer, ex.parameters())->state();
  const std::string name = whole[0].first;
  whole[0].second = Tensor::zeros({3}, cpu_backend());
  try {
    ex.load_optimizer_state(whole);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("optimizer state '" + name + "' has shape [3]") != std::string::npos);
  }
}

TEST_CASE("executor: training moved to other ranks between steps (relayout) matches one process") {
  comm::Communicator& world = comm::world();
  // Ranks 0 and 1; then all four (2 and 3 join, taking rank 0's state); then ranks 2 and
  // 0, rank 2 first (1 and 3 leave).
  const std::vector<plan::Plan> plans{layout({{0}, {1}}, {{0, 4}}, {12, 8}, {1, 2}),
                                      layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {7, 5, 4, 4}, {1, 1, 2, 1}),
                                      layout({{2}, {0}}, {{0, 4}}, {10, 10}, {1, 1})};
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(7);
  plan::Plan current = plans[0];
  auto ex = std::make_unique<runtime::Executor>(current, model, task, world, train_config(), mpi_test::kLong);
  StepChecker checker;
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) {
      const plan::Plan before = current;
      current = plans[static_cast<size_t>(step)];
      ex = runtime::relayout(std::move(ex), before, current, model, task, world, train_config(), mpi_test::kLong);
    }
    checker.after_step(current, *ex, model, ex->step(step * kBatch, kLr, false).loss_sum);
  }
  checker.finish(current, *ex, model);

  plan::Plan pipeline = layout({{0, 1}}, {{0, 2}, {2, 4}}, {20}, {2});
  CHECK_THROWS_WITH_AS(runtime::relayout(std::move(ex), current, pipeline, model, task, world, train_config(), mpi_test::kLong),
                       doctest::Contains("relayout: only between data-parallel plans"), Error);
}

TEST_CASE("executor: the evaluation gather from a stopped stage raises PeerTimeout naming its rank") {
  // Stage 1 on rank 1 stops itself instead of sending its parameters; rank 0's gather
  // waits 0.3 s, names rank 1 and the gather, and then continues it (see test_waits.cpp).
  comm::Communicator& world = comm::world();
  const std::vector<pid_t>& pids = mpi_test::world_pids();
  ht::testing::SyntheticMlpTask task = make_task();
  nn::Sequential model = task.build_model(7);
  const plan::Plan p = layout({{0, 1}}, {{0, 2}, {2, 4}}, {20}, {2});
  {
    runtime::Executor ex(p, model, task, world, train_config(), mpi_test::kLong);
    if (world.rank() == 1) {
      std::raise(SIGSTOP);
    } else if (world.rank() == 0) {
      const auto t0 = comm::Clock::now();
      try {
        (void)runtime::gather_to_root(p, ex, model, world, train_config().optimizer, false, comm::Timeout(0.3),
                                      "the evaluation gather");
        FAIL("expected a PeerTimeout");
      } catch (const comm::PeerTimeout& e) {
        CHECK(mpi_test::seconds_since(t0) >= 0.3);
        CHECK(std::string(e.what()).find("rank 0: no word from rank 1 after 0.3 s waiting for the evaluation gather ('") !=
              std::string::npos);
      }
      mpi_test::continue_once_stopped(pids[1]);
    }
    REQUIRE(world.barrier(mpi_test::kLong) == comm::WaitStatus::done);
  }
}
