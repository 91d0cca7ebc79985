// Exactness of the executor: training split over ranks (uneven data-parallel shares, 2
// and 3 pipeline stages, a 2 x 2 hybrid, recomputation, shares changed between steps,
// optimiser-state sharding) gives the parameters and optimiser state of one process
// training the same global batches.
//
// Tolerance. Every layout computes the same per-sample terms; what differs is the order
// of float32 sums (over micro-batches, over replicas in the all-reduce, of the squared
// norm for clipping) and the size of the matrix products, so gradients differ by a few
// float32 roundings (relative ~1e-7 per addition, the batch is 20 samples). AdamW
// normalises each update to about lr, so after a few steps parameters differ by much
// less than lr x 1e-4 = 1e-6. Observed: at most 7e-7 (the hybrid, rank 0); 2e-6 leaves
// room for that while a wrong share, a lost micro-batch or a missing reduction moves
// parameters by ~lr = 1e-2.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/models.h"
#include "mpi_util.h"
#include "plan/plan.h"
#include "optim/make_optimizer.h"
#include "runtime/executor.h"
#include "runtime/stage_gather.h"
#include "runtime/task.h"

using namespace ht;

namespace {

constexpr int64_t kBatch = 20;
constexpr int kSteps = 3;
constexpr float kTolerance = 2e-6f;

// A 4-block MLP on synthetic data that is a pure function of the stream position.
class SyntheticTask : public runtime::Task {
 public:
  nn::Sequential build_model(uint64_t seed) const override {
    return models::build_mlp({12, {16, 16, 16}, 5}, seed);
  }
  int64_t train_size() const override { return 1 << 20; }
  int64_t predictions_per_sample() const override { return 1; }
  runtime::Batch train_batch(int64_t first, int64_t count) override {
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int64_t i = first; i < first + count; ++i) {
      for (int j = 0; j < 12; ++j) x.push_back(std::sin(0.37f * static_cast<float>(i) + 1.3f * j));
      y.push_back(static_cast<int32_t>((i * 7) % 5));
    }
    return {Tensor::from_vector(x, {count, 12}), Tensor::from_ints(y, {count})};
  }
  runtime::EvalResult evaluate(const nn::Sequential&) const override { return {}; }
};

config::TrainConfig train_config() {
  config::TrainConfig t;
  t.batch_size = kBatch;
  t.optimizer.lr = 1e-2f;
  t.grad_clip = 0.5f;  // small enough to clip: the norm is summed across stages
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

struct Reference {
  std::map<std::string, std::vector<float>> params;
  std::vector<nn::NamedTensor> optimizer_state;
  double loss = 0;
};

// Parameters and optimiser state after kSteps of one process on the whole batch.
Reference reference(comm::Communicator& self) {
  SyntheticTask task;
  nn::Sequential model = task.build_model(7);
  const plan::Plan p = runtime::single_process_plan(4, kBatch, 1);
  runtime::Executor ex(p, model, task, self, train_config());
  Reference out;
  for (int step = 0; step < kSteps; ++step) out.loss += ex.step(step * kBatch, 1e-2f, false).loss_sum;
  for (const auto& [name, t] : model.named_parameters()) out.params[name] = t.to_vector();
  out.optimizer_state = ex.optimizer()->state();
  return out;
}

// The largest difference between two optimiser states of the same names and shapes.
float state_difference(const std::vector<nn::NamedTensor>& got, const std::vector<nn::NamedTensor>& want) {
  REQUIRE(got.size() == want.size());
  std::map<std::string, Tensor> by_name(want.begin(), want.end());
  float worst = 0;
  for (const auto& [name, t] : got) {
    CAPTURE(name);
    REQUIRE(by_name.count(name) == 1);
    const Tensor& w = by_name.at(name);
    REQUIRE(t.shape() == w.shape());
    if (t.dtype() == DType::i32) {
      CHECK(t.to_ints() == w.to_ints());
      continue;
    }
    const std::vector<float> a = t.to_vector(), b = w.to_vector();
    for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::fabs(a[k] - b[k]));
  }
  return worst;
}

// Rank 0 gathers the optimiser state (from every part when sharded): it must be the one
// process's. Then every rank loads its part of the one process's state and rank 0
// gathers again: a round trip, so exactly the same.
void check_optimizer_state(const plan::Plan& p, const runtime::Executor& ex, nn::Sequential& model,
                           const Reference& want) {
  comm::Communicator& world = comm::world();
  const config::OptimizerConfig opt = train_config().optimizer;
  std::vector<nn::NamedTensor> got = runtime::gather_to_root(p, ex, model, world, opt, true);
  if (world.rank() == 0) CHECK(state_difference(got, want.optimizer_state) <= kTolerance);
  if (ex.active()) {
    std::vector<nn::NamedTensor> mine;
    for (const auto& [name, t] : want.optimizer_state) {
      bool ours = name == "step";
      for (const auto& [param, v] : ex.parameters()) ours = ours || name.rfind(param + ".", 0) == 0;
      if (ours) mine.emplace_back(name, t);
    }
    ex.load_optimizer_state(mine);
  }
  got = runtime::gather_to_root(p, ex, model, world, opt, true);
  if (world.rank() == 0) CHECK(state_difference(got, want.optimizer_state) == 0);
}

// The loss over all last stages and this rank's parameters against the one process's;
// then the optimiser state (check_optimizer_state).
void compare(const plan::Plan& p, const runtime::Executor& ex, nn::Sequential& model, double loss,
             const Reference& ref) {
  comm::Communicator& world = comm::world();
  std::vector<Tensor> total{Tensor::from_vector({static_cast<float>(loss)}, {1})};
  REQUIRE(world.allreduce_sum(total, mpi_test::kLong) == comm::WaitStatus::done);
  CHECK(total[0].item() == doctest::Approx(ref.loss).epsilon(1e-5));

  float worst = 0, moved = 0;
  for (const auto& [name, t] : ex.parameters()) {
    const std::vector<float> got = t.to_vector();
    const std::vector<float>& want = ref.params.at(name);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  // Training moved the parameters, so agreeing means something.
  SyntheticTask fresh;
  const nn::Sequential init = fresh.build_model(7);
  for (const auto& [name, t] : init.named_parameters()) {
    const std::vector<float> a = t.to_vector();
    const std::vector<float>& b = ref.params.at(name);
    for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::fabs(a[i] - b[i]));
  }
  CAPTURE(world.rank());
  CHECK(moved > 1e-2f);
  CHECK(worst <= kTolerance);
  MESSAGE("rank ", world.rank(), ": largest parameter difference ", worst);
  check_optimizer_state(p, ex, model, ref);
}

// With `then`, the shares (and micro-batch counts) change to its after the first step,
// as rebalancing does between steps.
void check_exact(const plan::Plan& p, const std::optional<plan::Plan>& then = std::nullopt) {
  comm::Communicator& world = comm::world();
  REQUIRE(world.size() == 4);
  auto self = world.split(world.rank(), 0);
  const Reference ref = reference(*self);

  SyntheticTask task;
  nn::Sequential model = task.build_model(7);
  plan::Plan current = p;
  runtime::Executor ex(current, model, task, world, train_config());
  // A hub stepping the optimiser shares its weights with its stage's replicas, all on
  // this host, unless the links are emulated.
  const bool emulated = std::any_of(world.link_emulation().begin(), world.link_emulation().end(),
                                    [](const comm::LinkEmulation& l) { return l.active(); });
  if (ex.active())
    CHECK(ex.shares_weights() == (plan::hub_steps_optimizer(p) && p.layout.replicas.size() > 1 && !emulated));
  double loss = 0;
  bool alternate_next = false;  // a micro-batch trial's count in every other step
  for (int step = 0; step < kSteps; ++step) {
    if (step == 1 && then) {
      current = *then;
      ex.reshare();
      alternate_next = false;
    }
    const runtime::StepResult r = ex.step(step * kBatch, 1e-2f, step == 0);
    loss += r.loss_sum;
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
  }
  compare(current, ex, model, loss, ref);
}

}  // namespace

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
  SyntheticTask task;
  nn::Sequential model = task.build_model(7);
  const plan::Plan p = sharded(layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {5, 5, 5, 5}, {1, 1, 1, 1}), 0, {0.4, 0.3, 0.2, 0.1});
  runtime::Executor ex(p, model, task, world, train_config());
  std::vector<nn::NamedTensor> whole = optim::make_optimizer(train_config().optimizer, ex.parameters())->state();
  const std::string name = whole[0].first;
  whole[0].second = Tensor::zeros({3});
  try {
    ex.load_optimizer_state(whole);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("optimizer state '" + name + "' has shape [3]") != std::string::npos);
  }
}

TEST_CASE("executor: training moved to other ranks between steps (relayout) matches one process") {
  comm::Communicator& world = comm::world();
  auto self = world.split(world.rank(), 0);
  const Reference ref = reference(*self);
  // Ranks 0 and 1; then all four (2 and 3 join, taking rank 0's state); then ranks 2 and
  // 0, rank 2 first (1 and 3 leave).
  const std::vector<plan::Plan> plans{layout({{0}, {1}}, {{0, 4}}, {12, 8}, {1, 2}),
                                      layout({{0}, {1}, {2}, {3}}, {{0, 4}}, {7, 5, 4, 4}, {1, 1, 2, 1}),
                                      layout({{2}, {0}}, {{0, 4}}, {10, 10}, {1, 1})};
  SyntheticTask task;
  nn::Sequential model = task.build_model(7);
  plan::Plan current = plans[0];
  auto ex = std::make_unique<runtime::Executor>(current, model, task, world, train_config());
  double loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) {
      const plan::Plan before = current;
      current = plans[static_cast<size_t>(step)];
      ex = runtime::relayout(std::move(ex), before, current, model, task, world, train_config());
    }
    loss += ex->step(step * kBatch, 1e-2f, false).loss_sum;
  }
  std::vector<std::string> checksums = world.allgather(ex->parameter_checksum());
  CHECK_NOTHROW(runtime::check_replicas_identical(current, checksums, kSteps));
  compare(current, *ex, model, loss, ref);

  plan::Plan pipeline = layout({{0, 1}}, {{0, 2}, {2, 4}}, {20}, {2});
  CHECK_THROWS_WITH_AS(runtime::relayout(std::move(ex), current, pipeline, model, task, world, train_config()),
                       doctest::Contains("relayout: only between data-parallel plans"), Error);
}
