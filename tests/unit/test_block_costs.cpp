// The planner's cost model: FLOPs / rate seconds, measured profiles preferred, weight
// state per optimiser and the samples a memory holds, all checked against hand counts
// for the default MLP (784-512-512-10, 669,706 parameters); and the same costs from a
// model described from its config (runtime::describe_model) as from the built model.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"

#include <string>

#include "config/config.h"
#include "core/error.h"
#include "models/models.h"
#include "plan/block_costs.h"
#include "runtime/task.h"

using namespace ht;
using namespace ht::plan;

namespace {

// Two ranks, 1e11 and 5e10 FLOP/s, built by hand (no catalogue).
ClusterModel two_ranks() {
  ClusterModel c;
  DeviceModel fast, slow;
  fast.id = "fast";
  fast.flops = 1e11;
  fast.memory_bytes = 1e9;
  slow.id = "slow";
  slow.flops = 5e10;
  slow.memory_bytes = 1e9;
  c.ranks = {fast, slow};
  c.links = plan::Links::uniform(2, 1e-5, 1e9);
  c.source = "hand-built";
  return c;
}

config::OptimizerConfig adamw() { return {}; }
config::OptimizerConfig sgd(float momentum) {
  config::OptimizerConfig o;
  o.type = "sgd";
  o.momentum = momentum;
  return o;
}

// Hand counts for build_mlp({}, 1): DenseBlock 784->512 ReLU, 512->512 ReLU, 512->10.
// FLOPs: 2*in*out + out (bias) + out (ReLU).
constexpr double kFlops[3] = {2.0 * 784 * 512 + 512 + 512, 2.0 * 512 * 512 + 512 + 512,
                              2.0 * 512 * 10 + 10};  // 803,840; 525,312; 10,250
constexpr double kTotalFlops = 1'339'402;
// Activations: the matmul input plus the ReLU output, 4 bytes each.
constexpr double kAct[3] = {(784 + 512) * 4.0, (512 + 512) * 4.0, 512 * 4.0};
constexpr double kParams = 669'706;  // 401,920 + 262,656 + 5,130

}  // namespace

TEST_CASE("block costs: seconds follow 3 x FLOPs / rate, 2:1 between the ranks") {
  const auto model = models::build_mlp({}, 1);
  const auto c = block_costs(model, two_ranks(), adamw());
  REQUIRE(c.seconds_per_sample.size() == 2);
  REQUIRE(c.seconds_per_sample[0].size() == 3);
  CHECK(kFlops[0] + kFlops[1] + kFlops[2] == kTotalFlops);
  for (int b = 0; b < 3; ++b) {
    CHECK(c.seconds_per_sample[0][b] == doctest::Approx(3 * kFlops[b] / 1e11).epsilon(1e-12));
    CHECK(c.seconds_per_sample[1][b] == doctest::Approx(3 * kFlops[b] / 5e10).epsilon(1e-12));
    CHECK(c.seconds_per_sample[1][b] / c.seconds_per_sample[0][b] == doctest::Approx(2.0));
    CHECK(c.activation_bytes[b] == kAct[b]);
  }
  CHECK(c.source[0] == "FLOPs / rate");
  CHECK(c.source[1] == "FLOPs / rate");
}

TEST_CASE("block costs: replica speeds are 1 / total seconds, 2:1") {
  const auto model = models::build_mlp({}, 1);
  const auto c = block_costs(model, two_ranks(), adamw());
  const double fast = replica_samples_per_s(c, 0), slow = replica_samples_per_s(c, 1);
  CHECK(fast == doctest::Approx(1e11 / (3 * kTotalFlops)).epsilon(1e-12));  // ~24,886.6
  CHECK(slow == doctest::Approx(5e10 / (3 * kTotalFlops)).epsilon(1e-12));
  CHECK(fast / slow == doctest::Approx(2.0));
  CHECK(error_of([&] { replica_samples_per_s(c, 2); }).find("rank 2") != std::string::npos);
}

TEST_CASE("block costs: a measured profile is preferred when present") {
  const auto model = models::build_mlp({}, 1);
  auto cluster = two_ranks();
  cluster.block_seconds = {{1e-4, 2e-4, 3e-4}, {}};  // rank 1 unprofiled: modelled
  const auto c = block_costs(model, cluster, adamw());
  CHECK(c.seconds_per_sample[0] == std::vector<double>{1e-4, 2e-4, 3e-4});
  CHECK(c.source[0] == "measured profile");
  CHECK(c.source[1] == "FLOPs / rate");
  CHECK(c.seconds_per_sample[1][0] == doctest::Approx(3 * kFlops[0] / 5e10));
  CHECK(replica_samples_per_s(c, 0) == doctest::Approx(1 / 6e-4));
}

TEST_CASE("block costs: optimiser steps measured where timed, else bytes / bandwidth") {
  const auto model = models::build_mlp({}, 1);
  auto cluster = two_ranks();
  cluster.ranks[0].memory_bandwidth = cluster.ranks[1].memory_bandwidth = 1e10;
  cluster.block_seconds = {{1e-4, 2e-4, 3e-4}, {}};
  cluster.block_step_seconds = {{5e-5, 0, 7e-5}, {}};  // block 1 untimed
  const auto c = block_costs(model, cluster, adamw());
  CHECK(c.step_seconds[0][0] == 5e-5);
  CHECK(c.step_seconds[0][2] == 7e-5);
  // AdamW: 12 bytes of weight and gradient traffic + 2 x 8 of state per parameter.
  CHECK(c.step_seconds[0][1] == doctest::Approx(c.params[1] * 28 / 1e10));
  for (size_t b = 0; b < 3; ++b) CHECK(c.step_seconds[1][b] == doctest::Approx(c.params[b] * 28 / 1e10));
  CHECK(c.params == std::vector<double>{784 * 512 + 512, 512 * 512 + 512, 512 * 10 + 10});
}

TEST_CASE("block costs: a profile of the wrong length is an error naming both counts") {
  const auto model = models::build_mlp({}, 1);
  auto cluster = two_ranks();
  cluster.block_seconds = {{1e-4, 2e-4}, {1e-4, 2e-4}};
  const std::string e = error_of([&] { block_costs(model, cluster, adamw()); });
  CHECK(e.find("has 2 blocks") != std::string::npos);
  CHECK(e.find("model has 3 blocks") != std::string::npos);
}

TEST_CASE("block costs: state bytes per optimiser from the parameter count") {
  const auto model = models::build_mlp({}, 1);
  CHECK(model.param_count() == 669'706);
  auto total = [](const BlockCosts& c) {
    double s = 0;
    for (double x : c.state_bytes) s += x;
    return s;
  };
  const auto a = block_costs(model, two_ranks(), adamw());
  CHECK(a.state_bytes[0] == 401'920.0 * 16);
  CHECK(total(a) == kParams * 16);  // 10,715,296: weights 4 + grads 4 + two moments 8
  CHECK(total(block_costs(model, two_ranks(), sgd(0.9f))) == kParams * 12);  // 8,036,472
  CHECK(total(block_costs(model, two_ranks(), sgd(0.f))) == kParams * 8);    // 5,357,648
  CHECK(error_of([&] {
          config::OptimizerConfig o;
          o.type = "lion";
          block_costs(model, two_ranks(), o);
        }).find("'lion'") != std::string::npos);
}

TEST_CASE("block costs: a model described from its config costs what the built model does") {
  config::Config cfg;
  cfg.model.type = "gpt";
  cfg.model.context = 6;
  cfg.model.layers = 3;
  cfg.model.heads = 2;
  cfg.model.d_model = 10;
  cfg.model.dropout = 0.2f;
  auto cluster = two_ranks();
  cluster.ranks[0].memory_bandwidth = 5e10;  // rank 1 without one: no modelled step
  cluster.block_seconds = {{}, {1e-4, 2e-4, 3e-4, 4e-4, 5e-4}};
  const BlockCosts a = block_costs(runtime::describe_model(cfg), cluster, cfg.train.optimizer);
  const BlockCosts b = block_costs(runtime::build_model(cfg, 3), cluster, cfg.train.optimizer);
  CHECK(a.seconds_per_sample == b.seconds_per_sample);
  CHECK(a.call_seconds == b.call_seconds);
  CHECK(a.step_seconds == b.step_seconds);
  CHECK(a.flops == b.flops);
  CHECK(a.params == b.params);
  CHECK(a.optimizer_bytes_per_param == b.optimizer_bytes_per_param);
  CHECK(a.state_bytes == b.state_bytes);
  CHECK(a.activation_bytes == b.activation_bytes);
  CHECK(a.input_bytes == b.input_bytes);
  CHECK(a.output_bytes == b.output_bytes);
  CHECK(a.source == b.source);
  CHECK(a.source[1] == "measured profile");
}
