// Probe pieces that need no MPI: the pairing schedule, the device benchmarks, and the
// cluster file reader's checks.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>

#include "config/config.h"
#include "core/error.h"
#include "models/models.h"
#include "plan/cluster_model.h"
#include "nn/dense_block.h"
#include "probe/fingerprint.h"
#include "probe/link_matrix.h"
#include "probe/microbench.h"
#include "probe/probe.h"
#include "tests/unit/probe_fixtures.h"

using namespace ht;
using namespace ht::probe;

TEST_CASE("probe: pairing rounds cover every pair once, disjoint within a round") {
  for (int n = 1; n <= 9; ++n) {
    CAPTURE(n);
    auto rounds = pairing_rounds(n);
    std::set<std::pair<int, int>> seen;
    for (const auto& round : rounds) {
      std::set<int> busy;
      for (auto [a, b] : round) {
        CHECK(a < b);
        CHECK(busy.insert(a).second);
        CHECK(busy.insert(b).second);
        CHECK(seen.insert({a, b}).second);
      }
    }
    CHECK(seen.size() == static_cast<size_t>(n * (n - 1) / 2));
    // O(n) rounds, not n^2 / 2 sequential tests.
    CHECK(rounds.size() <= static_cast<size_t>(n % 2 ? n : std::max(n - 1, 0)));
  }
}

TEST_CASE("probe: device benchmarks report positive, plausible rates") {
  DeviceRates r = measure_device(0.2);
  CHECK(r.sgemm_size == 1024);
  CHECK(r.sgemm_gflops > 1.0);
  CHECK(r.sgemm_gflops < 1e5);
  CHECK(r.memory_bandwidth_gb_s > 0.1);
}

TEST_CASE("probe: block profiles split each call into a fixed part and a part per sample") {
  const nn::Sequential model = models::build_mlp({64, {256}, 10}, 3);
  const std::vector<BlockTiming> t = profile_blocks(model, 8, 128, 0.1, config::OptimizerConfig{});
  REQUIRE(t.size() == model.size());
  for (const BlockTiming& b : t) {
    CAPTURE(b.kind);
    CHECK(b.fwd_bwd_s_per_sample > 0);
    CHECK(b.fwd_bwd_s_per_call >= 0);
  }
  CHECK_THROWS_WITH_AS(profile_blocks(model, 64, 8, 0.1, config::OptimizerConfig{}),
                       "profile_blocks: batches 64 and 8; expected 1 <= small <= large", Error);
}

namespace {

// A dense 4 -> 4 block that spins for `cost(batch)` seconds in each forward and records
// the batches it ran and whether its input asked for a gradient.
class TimedBlock : public nn::Block {
 public:
  TimedBlock(std::function<double(int64_t)> cost, Rng& rng)
      : cost_(std::move(cost)), dense_({4}, 4, false, false, rng) {}
  Tensor forward(const Tensor& x) override {
    batches.push_back(x.shape()[0]);
    input_grads.push_back(x.requires_grad());
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(cost_(x.shape()[0]));
    while (std::chrono::steady_clock::now() < until) {
    }
    return dense_.forward(x);
  }
  std::string kind() const override { return "timed"; }
  int64_t flops_per_sample() const override { return dense_.flops_per_sample(); }
  int64_t activation_bytes_per_sample() const override { return dense_.activation_bytes_per_sample(); }
  int64_t workspace_bytes_per_sample() const override { return dense_.workspace_bytes_per_sample(); }
  int64_t eval_bytes_per_sample() const override { return dense_.eval_bytes_per_sample(); }
  Shape sample_input_shape() const override { return {4}; }
  Shape sample_output_shape() const override { return {4}; }
  std::vector<nn::NamedTensor> named_parameters() const override { return dense_.named_parameters(); }

  std::vector<int64_t> batches;
  std::vector<bool> input_grads;

 private:
  std::function<double(int64_t)> cost_;
  nn::DenseBlock dense_;
};

}  // namespace

TEST_CASE("probe: block profiles run both batches in turn, pass gradients back past the first block, and fit "
          "a fixed part only where one is seen") {
  Rng rng(5);
  nn::Sequential model;
  // 2 ms a call plus 40 us a sample; then 4 us x batch^2, dearer per sample at the larger batch.
  model.add(std::make_unique<TimedBlock>([](int64_t n) { return 2e-3 + 40e-6 * static_cast<double>(n); }, rng));
  model.add(std::make_unique<TimedBlock>([](int64_t n) { return 4e-6 * static_cast<double>(n * n); }, rng));
  const std::vector<BlockTiming> t = profile_blocks(model, 8, 32, 0.2, config::OptimizerConfig{});
  REQUIRE(t.size() == 2);
  CHECK(t[0].fwd_bwd_s_per_call == doctest::Approx(2e-3).epsilon(0.15));
  CHECK(t[0].fwd_bwd_s_per_sample == doctest::Approx(40e-6).epsilon(0.15));
  // The line through (8, 0.256 ms) and (32, 4.1 ms) crosses zero at 6 samples: no fixed
  // part, and the mean of 32 and 128 us a sample.
  CHECK(t[1].fwd_bwd_s_per_call == 0);
  CHECK(t[1].fwd_bwd_s_per_sample == doctest::Approx(80e-6).epsilon(0.15));
  for (size_t b = 0; b < 2; ++b) {
    const auto& block = dynamic_cast<const TimedBlock&>(model.block(b));
    CAPTURE(b);
    REQUIRE(block.batches.size() >= 6);
    for (size_t k = 0; k < block.batches.size(); ++k) CHECK(block.batches[k] == (k % 2 ? 32 : 8));
    // The model's input is data; every later block's input gets a gradient in training.
    for (bool grad : block.input_grads) CHECK(grad == (b > 0));
  }
}

namespace {

std::string write_temp(const std::string& text) {
  std::string path = std::filesystem::temp_directory_path() /
                     ("hetrain-cluster-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << text;
  return path;
}

std::string error_for(const std::string& text, std::optional<int> world = std::nullopt) {
  std::string path = write_temp(text);
  try {
    read_cluster(path, world);
  } catch (const config::ConfigError& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  return "";
}

}  // namespace

TEST_CASE("probe: a cluster file round-trips and malformed ones are refused by name") {
  ClusterFingerprint probed = test_fixtures::two_rank_probe();
  probed.model_signature = "8b09e915";
  probed.ranks[0].gradient_bandwidth_gb_s = 64.5;
  std::string good = cluster_to_json(probed);
  std::string path = write_temp(good);
  ClusterFingerprint back = read_cluster(path, 2);
  std::filesystem::remove(path);
  REQUIRE(back.ranks.size() == 2);
  CHECK(back.model_signature == "8b09e915");
  CHECK(back.ranks[1].rates.sgemm_gflops == doctest::Approx(50.0));
  CHECK(back.ranks[0].blocks[0].kind == "dense_relu");
  CHECK(back.ranks[0].blocks[0].optimizer_step_s == doctest::Approx(2e-4));
  CHECK(back.ranks[0].blocks[0].fwd_bwd_s_per_call == doctest::Approx(3e-6));
  CHECK(back.ranks[0].cpu_quota.fraction == doctest::Approx(0.25));
  CHECK(back.ranks[0].cpu_quota.period_s == doctest::Approx(0.01));
  CHECK(back.ranks[1].cpu_quota.fraction == 0);  // written only where there is a quota
  CHECK(back.ranks[0].gradient_bandwidth_gb_s == doctest::Approx(64.5));
  CHECK(back.ranks[1].gradient_bandwidth_gb_s == 0);  // written only where measured
  CHECK(ht::plan::cluster_from_probe(back).ranks[0].gradient_bandwidth == doctest::Approx(64.5e9));
  CHECK(ht::plan::cluster_from_probe(back).ranks[0].copy_bandwidth() == doctest::Approx(64.5e9));
  CHECK(ht::plan::cluster_from_probe(back).ranks[1].copy_bandwidth() == doctest::Approx(back.ranks[1].rates.memory_bandwidth_gb_s * 1e9));
  CHECK(back.links.bandwidth_bytes_per_s[0][1] == doctest::Approx(5e9));
  REQUIRE(back.ranks[1].host.gpus.size() == 1);
  CHECK(back.ranks[1].host.gpus[0].name == "NVIDIA H200");
  CHECK(back.ranks[1].host.gpus[0].compute_major == 9);
  CHECK(back.ranks[1].host.gpus[0].memory_total == (141ull << 30));
  CHECK(back.ranks[1].host.gpus[0].host_to_device_gb_s == doctest::Approx(50.5));

  CHECK(error_for(good, 4).find("world_size: 2 ranks") != std::string::npos);
  CHECK(error_for(good, 4).find("this job has 4") != std::string::npos);
  CHECK(error_for("{").find("invalid JSON") != std::string::npos);
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  CHECK(error_for(replaced("\"hetrain-cluster/1\"", "\"other/9\"")).find("format") != std::string::npos);
  CHECK(error_for(replaced("\"world_size\": 2", "\"world_size\": 3")).find("ranks: has 2 entries") !=
        std::string::npos);
  CHECK(error_for(replaced("\"sgemm_gflops\": 100.0", "\"sgemm_gflops\": -1")).find(
            "ranks[0].device.sgemm_gflops: -1") != std::string::npos);
  CHECK(error_for(replaced("\"kind\": \"cpu\"", "\"kind\": \"tpu\"")).find("ranks[0].device.kind") !=
        std::string::npos);
  CHECK(error_for(replaced("\"rank\": 1", "\"rank\": 0")).find("out of order") != std::string::npos);
  CHECK(error_for(replaced("\"8b09e915\"", "\"zzzz\"")).find(
            "model_signature: \"zzzz\" is not eight lowercase hex digits") != std::string::npos);
  // Files from before optimiser steps were timed still load, as "not measured".
  nlohmann::json old = nlohmann::json::parse(good);
  old["ranks"][0]["blocks"][0].erase("optimizer_step_s");
  old["ranks"][0]["blocks"][0].erase("fwd_bwd_s_per_call");
  std::string old_path = write_temp(old.dump());
  CHECK(read_cluster(old_path).ranks[0].blocks[0].optimizer_step_s == 0);
  CHECK(read_cluster(old_path).ranks[0].blocks[0].fwd_bwd_s_per_call == 0);
  std::filesystem::remove(old_path);
  CHECK(error_for(replaced("\"period_s\": 0.01", "\"period_s\": 0")).find(
            "ranks[0].cpu_quota.period_s: 0") != std::string::npos);
  old["ranks"][0]["blocks"][0]["optimizer_step_s"] = -1;
  CHECK(error_for(old.dump()).find("ranks[0].blocks[0].optimizer_step_s: -1") != std::string::npos);
  nlohmann::json no_memory = nlohmann::json::parse(good);
  no_memory["ranks"][0]["host"]["memory_total_bytes"] = 0;
  CHECK(error_for(no_memory.dump()).find("ranks[0].host.memory_total_bytes: 0 is not a memory size") !=
        std::string::npos);
  no_memory = nlohmann::json::parse(good);
  no_memory["ranks"][1]["host"]["gpus"][0]["memory_total_bytes"] = 0;
  CHECK(error_for(no_memory.dump()).find("ranks[1].host.gpus[0].memory_total_bytes: 0 is not a memory size") !=
        std::string::npos);
  nlohmann::json twin = nlohmann::json::parse(good);
  twin["ranks"][1]["local_rank"] = 0;  // two ranks of host "h" as one
  CHECK(error_for(twin.dump()).find("ranks[1].local_rank: 0 is also rank 0's on host \"h\"") != std::string::npos);
  twin = nlohmann::json::parse(good);
  twin["ranks"][0]["blocks"][0]["index"] = 3;
  CHECK(error_for(twin.dump()).find("ranks[0].blocks[0].index: 3 is not this entry's place; expected 0") !=
        std::string::npos);
  nlohmann::json gradient = nlohmann::json::parse(good);
  gradient["ranks"][0]["gradient_bandwidth_gb_s"] = -2;
  CHECK(error_for(gradient.dump()).find("ranks[0].gradient_bandwidth_gb_s: -2") != std::string::npos);
  gradient = nlohmann::json::parse(good);
  gradient["ranks"][0]["blocks"] = nlohmann::json::array();  // a rate at a model's size, but no model
  CHECK(error_for(gradient.dump()).find("ranks[0].gradient_bandwidth_gb_s: 64.5 is given for a rank with no block "
                                        "profile") != std::string::npos);
  std::string no_file = error_for("{}");
  CHECK(no_file.find("format") != std::string::npos);
  CHECK(error_for("[1, 2]").find("(top level): [1,2] is an array; expected a cluster file") != std::string::npos);
  // Every rank's profile is of the one model: a block more, or another kind, is refused.
  nlohmann::json blocks = nlohmann::json::parse(good);
  REQUIRE(blocks["ranks"][1]["blocks"].size() == blocks["ranks"][0]["blocks"].size());
  REQUIRE(!blocks["ranks"][1]["blocks"].empty());
  blocks["ranks"][1]["blocks"].push_back(blocks["ranks"][1]["blocks"][0]);
  blocks["ranks"][1]["blocks"].back().erase("index");
  const size_t b0 = blocks["ranks"][0]["blocks"].size();
  CHECK(error_for(blocks.dump()).find("ranks[1].blocks: has " + std::to_string(b0 + 1) + " blocks where rank 0 has " +
                                      std::to_string(b0) + "; expected every rank's profile of the one model") !=
        std::string::npos);
  blocks = nlohmann::json::parse(good);
  blocks["ranks"][1]["blocks"][0]["kind"] = "conv_relu";
  CHECK(error_for(blocks.dump()).find("ranks[1].blocks[0].kind: \"conv_relu\" where rank 0's block 0 is") !=
        std::string::npos);
  blocks = nlohmann::json::parse(good);
  blocks["ranks"][0]["blocks"] = nlohmann::json::array();  // a rank without a profile: the others' stand
  blocks["ranks"][0].erase("gradient_bandwidth_gb_s");
  const std::string unprofiled = write_temp(blocks.dump());
  CHECK(read_cluster(unprofiled).ranks[1].blocks.size() == b0);
  std::filesystem::remove(unprofiled);
}

TEST_CASE("probe: the cgroup CPU quota reads as none or a positive fraction and period") {
  const CpuQuota q = cgroup_cpu_quota();
  CHECK(q.fraction >= 0.0);
  CHECK((q.fraction == 0.0) == (q.period_s == 0.0));
}
