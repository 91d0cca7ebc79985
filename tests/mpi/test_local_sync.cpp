// parallel.sync local's outer step (runtime/local_sync.h) on 4 ranks in 3 groups: the
// outer weights are the sample-weighted mean of the groups' deltas followed by the
// Nesterov step, taken D job steps into the next round (D = H: at its end, or inside
// it, where each group's progress so far moves onto the new outer weights), against a
// plain reference in double; every rank holds bit-identical outer weights after every
// outer step; flush leaves the outer weights.
// The exchange runs through shared memory (the 4 ranks share a host) and over messages,
// and the two give the same outer weights bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "comm/communicator.h"
#include "mpi_util.h"
#include "plan/local_plan.h"
#include "runtime/local_sync.h"

using namespace ht;
using namespace mpi_test;

namespace {

constexpr int kRanks = 4;
constexpr int kH = 4;
constexpr int kRounds = 6;
// Each group's inner step takes the whole batch of 128, split within a group.
const std::vector<int64_t> kShares{128, 128, 64, 64};
const std::vector<std::vector<int>> kGroups{{0}, {1}, {2, 3}};
const std::vector<int64_t> kSizes{1000, 7};

// A one-stage local plan over kRanks world ranks: replica_of[r] is rank r's replica
// (-1: idle), each replica one rank; shares[r] its samples of an inner step.
plan::Plan one_stage_plan(const std::vector<int>& replica_of, const std::vector<int64_t>& shares,
                          plan::LocalSync local) {
  plan::Plan p;
  p.world_size = kRanks;
  p.blocks = 1;
  p.global_batch = 128;
  p.stage_ranges = {{0, 1}};
  p.sync_policy = plan::SyncPolicy::local;
  int replicas = 0;
  for (int r : replica_of) replicas = std::max(replicas, r + 1);
  p.layout.replicas.resize(static_cast<size_t>(replicas));
  p.layout.samples.resize(static_cast<size_t>(replicas));
  p.layout.micro_batches.assign(static_cast<size_t>(replicas), 1);
  for (int r = 0; r < kRanks; ++r) {
    plan::RankPlan rp;
    rp.rank = r;
    rp.replica = replica_of[static_cast<size_t>(r)];
    rp.stage = rp.replica >= 0 ? 0 : -1;
    rp.block_end = 1;
    rp.samples = rp.replica >= 0 ? shares[static_cast<size_t>(r)] : 0;
    p.ranks.push_back(rp);
    if (rp.replica < 0) continue;
    p.layout.replicas[static_cast<size_t>(rp.replica)] = {r};
    p.layout.samples[static_cast<size_t>(rp.replica)] = rp.samples;
  }
  p.local = std::move(local);
  return p;
}

plan::Plan local_plan(int delay) {
  plan::Plan p = one_stage_plan({0, 1, 2, 3}, kShares,
                                plan::LocalSync{kGroups, kH, {2, 1, 1}, {2 * 128, 128, 128}});  // whole global batches
  p.local->outer_delay = delay;
  return p;
}

int group_of(int rank) { return rank < 2 ? rank : 2; }

// What group g's inner step k adds to element i of tensor t: the groups move apart
// (signs and sizes differ), so a wrong weighting shows at 1e-3.
double increment(int g, int k, size_t t, int64_t i) {
  return 1e-3 * static_cast<double>(((i * 7 + static_cast<int64_t>(t) * 3 + k * 5) % 11) - 5) * (g == 1 ? -2 : g + 1);
}

double initial(size_t t, int64_t i) { return 0.5 + 1e-3 * static_cast<double>((i + static_cast<int64_t>(t)) % 13); }

// The rounds below against the reference, the exchange through shared memory or over
// messages, with outer momentum `mu` (0: plain averaging, whose pass leaves m alone) and
// the outer step `delay` job steps into the next round; the outer checksums after every
// round and after the flush.
std::vector<std::string> run_rounds(bool shared_memory, double mu = 0.9, int delay = kH) {
  comm::Communicator& world = comm::world();
  std::vector<std::string> trail;
  const plan::Plan plan = local_plan(delay);
  plan::check_local_plan(plan);
  config::ParallelConfig cfg;
  cfg.outer_lr = 0.7;
  cfg.outer_momentum = mu;
  cfg.peer_timeout_s = 30;
  std::vector<nn::NamedTensor> params;
  for (size_t t = 0; t < kSizes.size(); ++t) {
    std::vector<float> v(static_cast<size_t>(kSizes[t]));
    for (int64_t i = 0; i < kSizes[t]; ++i) v[static_cast<size_t>(i)] = static_cast<float>(initial(t, i));
    std::string name = "w";  // appended, not "w" + to_string: GCC 12 warns falsely (-Wrestrict) on that form
    name += std::to_string(t);
    params.emplace_back(name, Tensor::from_vector(v, {kSizes[t]}, cpu_backend()));
  }
  const size_t live = cpu_backend().allocator().live_bytes(), staged = cpu_backend().allocator().staged_bytes();
  runtime::LocalSync sync(plan, params, world, cfg, shared_memory);
  // The outer state is host staging, outside an emulated cap, where the plan counts it
  // (host memory): on a capped CPU rank it was charged to the cap.
  CHECK(cpu_backend().allocator().live_bytes() == live);
  CHECK(cpu_backend().allocator().staged_bytes() > staged);
  CHECK(sync.inner_steps() == kH);
  CHECK(sync.shared_exchange() == shared_memory);

  // The reference: every group's weights, the round's start, theta and m, in double.
  const int me = group_of(world.rank());
  const size_t groups = kGroups.size();
  std::vector<double> w(groups, 0), partial(groups, 0);
  // Each rank weighs its delta by its part of the round's samples: its share of its
  // group's batch x H_g / H, so a group's weight is H_g / H (2/4, 1/4, 1/4). In the
  // partial round of one job step below every group took one batch (front-loaded): 1/3.
  for (int r = 0; r < kRanks; ++r) {
    const auto g = static_cast<size_t>(group_of(r));
    w[g] += static_cast<double>(kShares[static_cast<size_t>(r)]) / 128 * plan.local->group_steps[g] / kH;
    partial[g] += static_cast<double>(kShares[static_cast<size_t>(r)]) / 128 / 3;
    CHECK(plan::round_weight(plan, r) == doctest::Approx(kShares[static_cast<size_t>(r)] / 128.0 * plan.local->group_steps[g] / kH));
    CHECK(plan::partial_round_weight(plan, r, 1) == doctest::Approx(kShares[static_cast<size_t>(r)] / 128.0 / 3));
  }
  struct Ref {
    std::vector<std::vector<double>> y, a;  // [group][flat element]
    std::vector<double> theta, m, pending;  // pending: the weighted delta in flight
    bool in_flight = false;
  } ref;
  std::vector<double> init;
  for (size_t t = 0; t < kSizes.size(); ++t)
    for (int64_t i = 0; i < kSizes[t]; ++i) init.push_back(initial(t, i));
  const size_t n = init.size();
  ref.y.assign(groups, init);
  ref.a.assign(groups, init);
  ref.theta = init;
  ref.m.assign(n, 0);
  auto outer_step = [&](const std::vector<double>& d) {
    for (size_t i = 0; i < n; ++i) {
      ref.m[i] = cfg.outer_momentum * ref.m[i] + d[i];
      ref.theta[i] -= cfg.outer_lr * (d[i] + cfg.outer_momentum * ref.m[i]);
    }
  };
  // Float32 rounding: each outer step's few operations on values near 1 err by a few
  // units of 2^-24 each; momentum carries an error forward with weight up to
  // 1 / (1 - mu); the flush adds two steps. 16 ulps of the largest weight per step.
  const double ulp = std::ldexp(1.0, -24);
  double largest = 0;
  auto tolerance = [&](int steps) { return 16 * ulp * largest * steps / (1 - cfg.outer_momentum); };
  auto check_params = [&](const std::vector<double>& expected, int steps, const char* when) {
    double worst = 0;
    size_t k = 0;
    for (size_t t = 0; t < kSizes.size(); ++t)
      for (int64_t i = 0; i < kSizes[t]; ++i, ++k) {
        worst = std::max(worst, std::fabs(static_cast<double>(params[t].second.data()[i]) - expected[k]));
        largest = std::max(largest, std::fabs(expected[k]));
      }
    CAPTURE(when);
    CHECK(worst <= tolerance(steps));
  };
  auto checksums_agree = [&] {
    const std::vector<std::string> all = world.allgather(sync.outer_checksum(), kLong, "the test's checksums");
    for (const std::string& c : all) CHECK(c == all[0]);
    trail.push_back(all[0]);
  };

  // Each group's weights onto the outer ones plus its progress since its anchor.
  auto rebase = [&] {
    for (size_t g = 0; g < groups; ++g)
      for (size_t i = 0; i < n; ++i) {
        const double own = ref.y[g][i] - ref.a[g][i];
        ref.a[g][i] = ref.theta[i];
        ref.y[g][i] = ref.theta[i] + own;
      }
  };
  int outer = 0;
  for (int k = 0; k < kH * kRounds; ++k) {
    for (size_t g = 0; g < groups; ++g) {
      size_t e = 0;
      for (size_t t = 0; t < kSizes.size(); ++t)
        for (int64_t i = 0; i < kSizes[t]; ++i, ++e) ref.y[g][e] += increment(static_cast<int>(g), k, t, i);
    }
    for (size_t t = 0; t < kSizes.size(); ++t)
      for (int64_t i = 0; i < kSizes[t]; ++i)
        params[t].second.data()[i] += static_cast<float>(increment(me, k, t, i));
    sync.after_step(k + 1);
    if ((k + 1) % kH == delay && ref.in_flight) {  // inside the round (delay < kH)
      outer_step(ref.pending);
      ++outer;
      ref.in_flight = false;
      rebase();
      CHECK(sync.outer_steps() == outer);
      check_params(ref.y[static_cast<size_t>(me)], outer + 1, "after the outer step inside a round");
    }
    if ((k + 1) % kH != 0) continue;
    std::vector<std::vector<double>> delta(groups, std::vector<double>(n));
    for (size_t g = 0; g < groups; ++g)
      for (size_t i = 0; i < n; ++i) delta[g][i] = ref.a[g][i] - ref.y[g][i];
    if (ref.in_flight) {
      outer_step(ref.pending);
      ++outer;
    }
    ref.pending.assign(n, 0);
    for (size_t g = 0; g < groups; ++g)
      for (size_t i = 0; i < n; ++i) {
        ref.a[g][i] = ref.y[g][i] = ref.theta[i] - delta[g][i];
        ref.pending[i] += w[g] * delta[g][i];
      }
    ref.in_flight = true;
    CHECK(sync.outer_steps() == outer);
    check_params(ref.y[static_cast<size_t>(me)], outer + 1, "after a round");
    checksums_agree();
  }
  // One partial round, then flush: the exchange in flight, then the partial round's.
  for (size_t g = 0; g < groups; ++g) {
    size_t e = 0;
    for (size_t t = 0; t < kSizes.size(); ++t)
      for (int64_t i = 0; i < kSizes[t]; ++i, ++e) ref.y[g][e] += increment(static_cast<int>(g), 99, t, i);
  }
  for (size_t t = 0; t < kSizes.size(); ++t)
    for (int64_t i = 0; i < kSizes[t]; ++i) params[t].second.data()[i] += static_cast<float>(increment(me, 99, t, i));
  sync.after_step(kH * kRounds + 1);
  if (delay == 1) {
    outer_step(ref.pending);
    rebase();
  }
  sync.flush();
  if (delay != 1) outer_step(ref.pending);
  std::vector<double> d(n, 0);
  for (size_t g = 0; g < groups; ++g)
    for (size_t i = 0; i < n; ++i) {
      // After the first step each group stood at theta + (own progress since its round began).
      d[i] += partial[g] * (ref.a[g][i] - ref.y[g][i]);
    }
  outer_step(d);
  CHECK(sync.outer_steps() == kRounds + 1);
  check_params(ref.theta, kRounds + 2, "after flush");
  checksums_agree();
  return trail;
}

}  // namespace

TEST_CASE("local sync: the outer step takes the sample-weighted mean of the groups' deltas, then Nesterov, one round late") {
  if (comm::world().size() != kRanks) return;
  const std::vector<std::string> shared = run_rounds(true);
  const std::vector<std::string> messages = run_rounds(false);
  REQUIRE(shared.size() == kRounds + 1);
  // Each part summed by its owner in the same order both ways: the same bits.
  CHECK(shared == messages);
  // Without momentum the pass takes its own loop (local_sync.cpp's round_pass).
  CHECK(run_rounds(true, 0.0) == run_rounds(false, 0.0));
}

TEST_CASE("local sync: an outer step that lands inside the next round moves each group's progress onto it") {
  if (comm::world().size() != kRanks) return;
  for (const int delay : {1, 2}) {
    CAPTURE(delay);
    const std::vector<std::string> shared = run_rounds(true, 0.9, delay);
    REQUIRE(shared.size() == kRounds + 1);
    CHECK(shared == run_rounds(false, 0.9, delay));
  }
  CHECK(run_rounds(true, 0.0, 1) == run_rounds(false, 0.0, 1));
}

TEST_CASE("local sync: one group's delta is taken as it is, whatever outer_lr and outer_momentum say") {
  // Every rank in one synchronous group: local then trains as sync does, so each rank's
  // weights after every round and the flush are its own run of steps.
  comm::Communicator& world = comm::world();
  if (world.size() != kRanks) return;
  plan::Plan plan = local_plan(kH);
  for (int r = 0; r < kRanks; ++r) {
    plan.layout.samples[static_cast<size_t>(r)] = 32;
    plan.ranks[static_cast<size_t>(r)].samples = 32;
  }
  plan.local = plan::LocalSync{{{0, 1, 2, 3}}, kH, {kH}, {kH * 128}};
  plan.local->outer_delay = kH;
  plan::check_local_plan(plan);
  config::ParallelConfig cfg;
  cfg.outer_lr = 0.7;
  cfg.outer_momentum = 0.9;
  cfg.peer_timeout_s = 30;
  std::vector<float> v(static_cast<size_t>(kSizes[0]));
  for (int64_t i = 0; i < kSizes[0]; ++i) v[static_cast<size_t>(i)] = static_cast<float>(initial(0, i));
  std::vector<nn::NamedTensor> params{{"w", Tensor::from_vector(v, {kSizes[0]}, cpu_backend())}};
  runtime::LocalSync sync(plan, params, world, cfg, true);
  std::vector<double> own(v.begin(), v.end());
  // The outer step adds the four ranks' quarter-weighted deltas of values near 0.5:
  // a few roundings of 2^-25 each per round, against momentum's or a 0.7 step's 1e-3.
  const double tolerance = 8 * std::ldexp(1.0, -24) * (kRounds + 1);
  for (int k = 0; k < kH * kRounds; ++k) {
    for (int64_t i = 0; i < kSizes[0]; ++i) {
      const double d = increment(0, k, 0, i);
      own[static_cast<size_t>(i)] += d;
      params[0].second.data()[i] += static_cast<float>(d);
    }
    sync.after_step(k + 1);
  }
  sync.flush();
  CHECK(sync.outer_steps() == kRounds);
  double worst = 0;
  for (int64_t i = 0; i < kSizes[0]; ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(params[0].second.data()[i]) - own[static_cast<size_t>(i)]));
  CHECK(worst <= tolerance);
}

namespace {

// The weighting cases' plans: every replica's inner step of 128 samples, the outer step
// at the round's end.
plan::Plan weighting_plan(const std::vector<int>& replica_of, std::vector<std::vector<int>> groups, int h,
                          std::vector<int> steps, std::vector<int64_t> samples) {
  plan::Plan p = one_stage_plan(replica_of, std::vector<int64_t>(kRanks, 128),
                                plan::LocalSync{std::move(groups), h, std::move(steps), std::move(samples)});
  p.local->outer_delay = h;
  plan::check_local_plan(p);
  return p;
}

config::ParallelConfig averaging() {  // outer_lr 1, no momentum: the outer weights are the weighted mean
  config::ParallelConfig c;
  c.outer_lr = 1.0;
  c.outer_momentum = 0.0;
  c.peer_timeout_s = 30;
  c.rebalance_every = 0;
  return c;
}

std::vector<nn::NamedTensor> zeros_param() { return {{"w", Tensor::zeros({8}, cpu_backend())}}; }
void move_by(std::vector<nn::NamedTensor>& p, float c) {
  for (int64_t i = 0; i < 8; ++i) p[0].second.data()[i] += c;
}

}  // namespace

TEST_CASE("local sync: a delta is weighed by its own rank's samples where an idle rank sits between members") {
  // Rank 1 idle; groups {rank 0}, {rank 2}, {rank 3} taking 64, 128 and 320 of a round's
  // 512 samples; each moves by 1, 2 and 4 in the round. The outer weights are the mean by
  // samples, 0.125 + 0.5 + 2.5 (a member's weight once came from another member's slot,
  // and the last member's from past the list: 1.375).
  comm::Communicator& world = comm::world();
  if (world.size() != kRanks) return;
  const plan::Plan p = weighting_plan({0, -1, 1, 2}, {{0}, {1}, {2}}, 4, {1, 1, 2}, {64, 128, 320});
  for (const bool shared : {true, false}) {
    CAPTURE(shared);
    auto params = zeros_param();
    runtime::LocalSync sync(p, params, world, averaging(), shared);
    const float moved[] = {1, 0, 2, 4};
    move_by(params, moved[world.rank()]);
    for (int k = 1; k <= 4; ++k) sync.after_step(k);
    sync.flush();
    if (world.rank() != 1) CHECK(params[0].second.data()[0] == doctest::Approx(3.125));
  }
}

TEST_CASE("local sync: the rest of a round after a flush or a resume is weighed by the samples taken in it") {
  // Groups {rank 0} and {rank 1} (ranks 2, 3 idle), H 4: group 0 takes its one step in job
  // step 1, group 1 its three in job steps 1-3. Each step moves a group's weights by 1.
  // Job step 1, then a flush: the mean by samples, 1. Job steps 2 and 3 are group 1's
  // alone, so whatever exchanges them (the round's end, a second flush inside the round)
  // takes group 1's progress as it is: 3. A run resumed after job step 1 does the same
  // from 0: 2. (Weighed as a whole round's, or as the round's first job steps', they
  // gave 2.5, 2.33 and 1.5.)
  comm::Communicator& world = comm::world();
  if (world.size() != kRanks) return;
  const plan::Plan p = weighting_plan({0, 1, -1, -1}, {{0}, {1}}, 4, {1, 3}, {128, 384});
  const int me = world.rank();
  for (const int variant : {0, 1, 2}) {  // 0: the round's end; 1: a second flush at job step 3; 2: resumed
    CAPTURE(variant);
    auto params = zeros_param();
    runtime::LocalSync sync(p, params, world, averaging(), true);
    if (variant == 2) {
      sync.begin_at(1);
    } else {
      sync.begin_at(0);
      if (me < 2) move_by(params, 1);
      sync.after_step(1);
      sync.flush();
      if (me < 2) CHECK(params[0].second.data()[0] == doctest::Approx(1.0));
    }
    for (int k = 2; k <= 3; ++k) {
      if (me == 1) move_by(params, 1);
      sync.after_step(k);
    }
    if (variant != 1) sync.after_step(4);
    sync.flush();
    if (me < 2) CHECK(params[0].second.data()[0] == doctest::Approx(variant == 2 ? 2.0 : 3.0));
  }
}
