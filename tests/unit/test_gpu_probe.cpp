// A GPU rank's probed rates, from the probe file to the planner: the reader's checks of
// the GPU fields (and files without them), the cluster model built from a fixed probe file
// (the GPU's own GEMM rate, bandwidth, free memory and launches; a datasheet for a cuda
// rank whose file has no GPU rates), the catalogue match of runtime GPU names, and the
// block costs and memory a plan gets from them, all against hand-computed figures.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/planner.h"
#include "probe/fingerprint.h"
#include "tests/unit/plan_fixtures.h"
#include "tests/unit/temp_dir.h"

using namespace ht;
using namespace ht::plan;

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// Rank 0: a GPU rank on GPU 1 of host "g" (two GPUs), probed with GPU rates; rank 1: a
// CPU rank on host "c". The figures are round so that every expected value is hand-made.
nlohmann::json probe_file() {
  auto gpu = [](int index, const char* name, double total_gib, double free_gib) {
    return nlohmann::json{{"index", index},
                          {"name", name},
                          {"compute_capability", "9.0"},
                          {"sm_count", 132},
                          {"memory_total_bytes", static_cast<uint64_t>(total_gib * kGiB)},
                          {"memory_free_bytes", static_cast<uint64_t>(free_gib * kGiB)},
                          {"host_to_device_gb_s", 50.0},
                          {"device_to_host_gb_s", 40.0}};
  };
  auto host = [](const char* name, nlohmann::json gpus) {
    return nlohmann::json{{"host", name},
                          {"cpu_model", "Xeon"},
                          {"physical_cores", 16},
                          {"hardware_threads", 32},
                          {"memory_total_bytes", static_cast<uint64_t>(64 * kGiB)},
                          {"memory_available_bytes", static_cast<uint64_t>(60 * kGiB)},
                          {"gpus", gpus}};
  };
  nlohmann::json gpu_rank = {
      {"rank", 0},
      {"local_rank", 0},
      {"host", host("g", {gpu(0, "NVIDIA H100 80GB HBM3", 80, 79), gpu(1, "NVIDIA H200", 140, 100)})},
      {"device",
       {{"kind", "cuda"},
        {"threads", 1},
        {"sgemm_gflops", 50000.0},
        {"sgemm_size", 4096},
        {"memory_bandwidth_gb_s", 4000.0},
        {"gpu_index", 1},
        {"bf16_gemm_gflops", 700000.0},
        {"launch_overhead_s", 4e-6}}},
      {"memory_cap_bytes", 0},
      {"blocks", nlohmann::json::array()},
      {"emulation", nlohmann::json::array()}};
  nlohmann::json cpu_rank = {{"rank", 1},
                             {"local_rank", 0},
                             {"host", host("c", nlohmann::json::array())},
                             {"device",
                              {{"kind", "cpu"},
                               {"threads", 16},
                               {"sgemm_gflops", 1000.0},
                               {"sgemm_size", 1024},
                               {"memory_bandwidth_gb_s", 100.0}}},
                             {"memory_cap_bytes", 0},
                             {"blocks", nlohmann::json::array()},
                             {"emulation", nlohmann::json::array()}};
  return {{"format", probe::kClusterFormat},
          {"world_size", 2},
          {"model", ""},
          {"ranks", {gpu_rank, cpu_rank}},
          {"links", {{"latency_s", {{0, 1e-5}, {1e-5, 0}}}, {"bandwidth_bytes_per_s", {{0, 1e9}, {1e9, 0}}}}}};
}

struct ProbeFile {
  test_fixtures::TempDir dir{"ht-gpu-probe"};
  std::string path = dir / "cluster.json";
  explicit ProbeFile(const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }
};

// The reader's message for `j`, "" when it reads.
std::string read_error(const nlohmann::json& j) {
  ProbeFile f(j);
  try {
    probe::read_cluster(f.path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("gpu probe: the GPU rates round-trip; files without them read as not measured") {
  ProbeFile f(probe_file());
  const probe::ClusterFingerprint c = probe::read_cluster(f.path, 2);
  const probe::DeviceRates& g = c.ranks[0].rates;
  CHECK(c.ranks[0].device == DeviceKind::cuda);
  CHECK(g.gpu_index == 1);
  CHECK(g.bf16_gemm_gflops == doctest::Approx(700000.0));
  CHECK(g.launch_overhead_s == doctest::Approx(4e-6));
  CHECK(c.ranks[1].rates.gpu_index == -1);
  // Written back as read, and CPU ranks written without GPU fields.
  const nlohmann::json again = nlohmann::json::parse(probe::cluster_to_json(c));
  CHECK(again["ranks"][0]["device"]["gpu_index"] == 1);
  CHECK(again["ranks"][0]["device"]["launch_overhead_s"] == doctest::Approx(4e-6));
  CHECK_FALSE(again["ranks"][1]["device"].contains("gpu_index"));

  nlohmann::json old = probe_file();
  for (const char* k : {"gpu_index", "bf16_gemm_gflops", "launch_overhead_s"}) old["ranks"][0]["device"].erase(k);
  ProbeFile o(old);
  const probe::ClusterFingerprint back = probe::read_cluster(o.path, 2);
  CHECK(back.ranks[0].rates.gpu_index == -1);
  CHECK(back.ranks[0].rates.launch_overhead_s == 0);
  CHECK(back.ranks[0].rates.bf16_gemm_gflops == 0);
}

TEST_CASE("gpu probe: malformed GPU rates are refused by path, with what was expected") {
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = probe_file();
    j["ranks"][0]["device"][key] = value;
    return read_error(j);
  };
  CHECK(has(with("gpu_index", 2), "ranks[0].device.gpu_index: 2 is not a GPU of host.gpus; expected 0 to 1"));
  CHECK(has(with("gpu_index", -1), "ranks[0].device.gpu_index"));
  CHECK(has(with("gpu_index", "one"), "ranks[0].device.gpu_index"));
  CHECK(has(with("bf16_gemm_gflops", -5), "ranks[0].device.bf16_gemm_gflops: -5"));
  CHECK(has(with("launch_overhead_s", 0), "ranks[0].device.launch_overhead_s: 0"));
  CHECK(with("bf16_gemm_gflops", 0).empty());  // a GPU below sm_80
  nlohmann::json partial = probe_file();
  partial["ranks"][0]["device"].erase("launch_overhead_s");
  CHECK(has(read_error(partial), "ranks[0].device.launch_overhead_s"));
  nlohmann::json no_gpus = probe_file();
  no_gpus["ranks"][0]["host"]["gpus"] = nlohmann::json::array();
  CHECK(has(read_error(no_gpus), "host.gpus is empty"));
  for (const char* k : {"gpu_index", "bf16_gemm_gflops", "launch_overhead_s"}) no_gpus["ranks"][0]["device"].erase(k);
  CHECK(has(read_error(no_gpus), "ranks[0].device.kind: \"cuda\" but host.gpus is empty"));
  nlohmann::json roomy = probe_file();
  roomy["ranks"][0]["host"]["gpus"][1]["memory_free_bytes"] =
      roomy["ranks"][0]["host"]["gpus"][1]["memory_total_bytes"].get<uint64_t>() + 1;
  CHECK(has(read_error(roomy), "ranks[0].host.gpus[1].memory_free_bytes"));
  CHECK(has(read_error(roomy), "is more than memory_total_bytes"));
  roomy = probe_file();
  roomy["ranks"][0]["host"]["memory_available_bytes"] = roomy["ranks"][0]["host"]["memory_total_bytes"].get<uint64_t>() + 1;
  CHECK(has(read_error(roomy), "ranks[0].host.memory_available_bytes"));
  nlohmann::json on_cpu = probe_file();
  on_cpu["ranks"][1]["device"]["gpu_index"] = 0;
  on_cpu["ranks"][1]["device"]["bf16_gemm_gflops"] = 1;
  on_cpu["ranks"][1]["device"]["launch_overhead_s"] = 1e-6;
  CHECK(has(read_error(on_cpu), "ranks[1].device.kind: \"cpu\" has GPU rates"));
}

TEST_CASE("gpu probe: a GPU rank is planned from its GPU's rates, free memory and launches") {
  ProbeFile f(probe_file());
  const ClusterModel c = load_cluster_model(f.path, "/nonexistent/devices.json", 2);  // no catalogue needed
  REQUIRE(c.ranks.size() == 2);
  const DeviceModel& g = c.ranks[0];
  CHECK(g.kind == DeviceKind::cuda);
  CHECK(g.id == "NVIDIA H200");  // gpu_index 1, not local rank 0's GPU 0
  CHECK(g.measured);
  CHECK(g.flops == doctest::Approx(50000e9));
  CHECK(g.memory_bandwidth == doctest::Approx(4000e9));
  CHECK(g.memory_bytes == doctest::Approx(kUsableMemory * 100 * kGiB));  // free, not the 140 GiB total
  CHECK(g.call_seconds == doctest::Approx(12 * 4e-6));
  const DeviceModel& cpu = c.ranks[1];
  CHECK(cpu.flops == doctest::Approx(1000e9));
  CHECK(cpu.memory_bytes == doctest::Approx(kUsableMemory * 64 * kGiB));
  CHECK(cpu.call_seconds == 0);

  // Block costs: 3 x forward FLOPs / rate per sample; the GPU's fixed part per call is its
  // launches, the CPU's the engine's figure; an optimiser step streams (12 + 2 x 8) bytes
  // per parameter at each rank's bandwidth.
  nn::ModelShape model;
  model.blocks.push_back({"dense", 1000000, 2000000, 4096, 0, 0, 0, {1024}, {1024}, DType::f32});
  const BlockCosts k = block_costs(model, c, config::OptimizerConfig{});
  CHECK(k.seconds_per_sample[0][0] == doctest::Approx(3 * 2e6 / 50000e9));
  CHECK(k.seconds_per_sample[1][0] == doctest::Approx(3 * 2e6 / 1000e9));
  CHECK(k.call_seconds[0][0] == doctest::Approx(48e-6));
  CHECK(k.call_seconds[1][0] == doctest::Approx(kCallSecondsCpu));
  CHECK(k.step_seconds[0][0] == doctest::Approx(1e6 * 28 / 4000e9));
  CHECK(k.step_seconds[1][0] == doctest::Approx(1e6 * 28 / 100e9));
}

TEST_CASE("gpu probe: the memory fit holds a GPU rank to its GPU's free memory") {
  // One GPU rank with 40 MB free and 64 GiB of host memory; two blocks of 16 MB of weight
  // state each (fixtures::costs) and 1 MB of activations per sample.
  nlohmann::json j = probe_file();
  j["world_size"] = 1;
  j["ranks"].erase(1);
  j["ranks"][0]["host"]["gpus"][1]["memory_free_bytes"] = 40000000;
  j["links"] = {{"latency_s", {{0}}}, {"bandwidth_bytes_per_s", {{0}}}};
  ProbeFile f(j);
  const ClusterModel c = load_cluster_model(f.path, "/nonexistent/devices.json", 1);
  CHECK(c.ranks[0].memory_bytes == doctest::Approx(0.98 * 40e6));
  const BlockCosts k = fixtures::costs(c, 2);
  // 32 MB of state + 4 samples x 2 blocks x 1 MB = 40 MB > 39.2 MB: it does not fit at 4.
  Plan p = make_plan(fixtures::input(c, k, 4, "data"));
  CHECK(p.ranks[0].device.memory_bytes == doctest::Approx(0.98 * 40e6));
  for (const RankPlan& r : p.ranks) CHECK(r.memory.total() <= r.device.memory_bytes);
  CHECK(p.ranks[0].micro_batches > 1);  // it fits by smaller micro-batches, as on 39.2 MB
  // 32 MB of state alone fits neither 30 MB nor any split of one rank's batch.
  j["ranks"][0]["host"]["gpus"][1]["memory_free_bytes"] = 30000000;
  ProbeFile small(j);
  const ClusterModel tiny = load_cluster_model(small.path, "/nonexistent/devices.json", 1);
  CHECK_THROWS_AS(make_plan(fixtures::input(tiny, fixtures::costs(tiny, 2), 4, "data")), NoPlanFits);
}

TEST_CASE("gpu probe: a cuda rank from a file without GPU rates is planned from its datasheet") {
  nlohmann::json old = probe_file();
  for (const char* k : {"gpu_index", "bf16_gemm_gflops", "launch_overhead_s"}) old["ranks"][0]["device"].erase(k);
  ProbeFile f(old);
  // Local rank 0 takes the host's GPU 0, the H100 (80 GiB): its catalogue entry h100 at the
  // catalogue's cuda efficiency, not the host's recorded sgemm rate.
  const Catalogue cat = read_catalogue(default_catalogue_path());
  const CatalogueDevice* h100 = match_catalogue(cat, "NVIDIA H100 80GB HBM3", 80 * kGiB);
  REQUIRE(h100 != nullptr);
  const ClusterModel c = load_cluster_model(f.path, default_catalogue_path(), 2);
  CHECK(c.ranks[0].id == "NVIDIA H100 80GB HBM3");
  CHECK_FALSE(c.ranks[0].measured);
  CHECK(c.ranks[0].flops == doctest::Approx(h100->fp32_tflops * 1e12 * h100->efficiency));
  CHECK(c.ranks[0].memory_bandwidth == doctest::Approx(h100->memory_bandwidth_gb_s * 1e9));
  CHECK(c.ranks[0].memory_bytes == doctest::Approx(kUsableMemory * 80 * kGiB));  // total, as before
  CHECK(c.ranks[0].call_seconds == 0);  // the engine's figure for a GPU
  // Without a catalogue the recorded figures stand.
  const ClusterModel bare = cluster_from_probe(probe::read_cluster(f.path));
  CHECK(bare.ranks[0].flops == doctest::Approx(50000e9));
}

TEST_CASE("gpu probe: runtime GPU names match their catalogue entries") {
  const Catalogue cat = read_catalogue(default_catalogue_path());
  auto id = [&](const std::string& name, double gib) {
    const CatalogueDevice* d = match_catalogue(cat, name, gib * kGiB);
    return d ? d->id : std::string("none");
  };
  CHECK(id("NVIDIA A100-SXM4-80GB", 80) == "a100-80g");
  CHECK(id("NVIDIA A100-SXM4-40GB", 40) == "a100-40g");
  CHECK(id("Tesla V100-SXM2-16GB", 16) == "v100-16g");
  CHECK(id("NVIDIA GeForce RTX 3060", 12) == "rtx3060");
  CHECK(id("NVIDIA GeForce RTX 4090", 24) == "rtx4090");
  CHECK(id("NVIDIA H100 80GB HBM3", 80) == "h100");
  CHECK(id("NVIDIA H200", 141) == "h200");
  CHECK(id("Quadro P1000", 4) == "none");
}
