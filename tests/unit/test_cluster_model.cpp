// The planner's cluster model: the shipped datasheet catalogue, synthetic specs and
// their error messages, a large cluster, and a probe fingerprint.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "config/config.h"
#include "plan/cluster_model.h"
#include "tests/unit/source_root.h"

using namespace ht;
using namespace ht::plan;
namespace fs = std::filesystem;

namespace {

using ht::test_fixtures::source_root;

std::string catalogue() { return (source_root() / "configs" / "devices.json").string(); }

// The ConfigError message of `fn`, or "" when it does not throw one.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string synth_error(const std::string& spec) {
  return error_of([&] { cluster_from_synth(spec, catalogue()); });
}

fs::path temp_file(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("ht_cluster_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("cluster: the shipped catalogue loads with positive figures") {
  Catalogue cat = read_catalogue(catalogue());
  CHECK(cat.devices.size() >= 15);
  for (const auto& d : cat.devices) {
    CAPTURE(d.id);
    CHECK(!d.name.empty());
    CHECK(d.fp32_tflops > 0);
    CHECK(d.tf32_tflops >= 0);
    CHECK(d.bf16_tflops >= 0);
    CHECK(d.memory_gb > 0);
    CHECK(d.memory_bandwidth_gb_s > 0);
    CHECK(d.host_link_gb_s > 0);
    CHECK(d.efficiency > 0);
    CHECK(d.efficiency <= 1);
    CHECK(!d.source.empty());  // every shipped entry names where its figures come from
  }
  for (const char* id : {"rtx2080ti", "rtx3060", "rtx3090", "rtx4070", "rtx4090", "v100-16g", "v100-32g",
                         "a100-40g", "a100-80g", "h100", "h200", "cpu-8c", "cpu-16c", "cpu-32c", "cpu-64c"}) {
    CAPTURE(id);
    CHECK(std::count_if(cat.devices.begin(), cat.devices.end(), [&](const auto& d) { return d.id == id; }) == 1);
  }
  CHECK(cat.links.size() == 6);
}

TEST_CASE("cluster: synth spec gives ranks in order with one link class") {
  ClusterModel c = cluster_from_synth("synth:2xrtx3060,1xa100-40g,3xcpu-16c@ethernet-10g", catalogue());
  REQUIRE(c.ranks.size() == 6);
  CHECK(c.source == "synth:2xrtx3060,1xa100-40g,3xcpu-16c@ethernet-10g");
  const char* want[] = {"rtx3060", "rtx3060", "a100-40g", "cpu-16c", "cpu-16c", "cpu-16c"};
  for (size_t i = 0; i < 6; ++i) CHECK(c.ranks[i].id == want[i]);
  CHECK(c.ranks[0].kind == DeviceKind::cuda);
  CHECK(c.ranks[3].kind == DeviceKind::cpu);
  CHECK(!c.ranks[0].measured);
  CHECK(c.ranks[0].flops == doctest::Approx(12.74e12 * 0.45));
  CHECK(c.ranks[2].memory_bytes == doctest::Approx(40.0 * (1 << 30) * kUsableMemory));  // as a probed card
  CHECK(c.ranks[2].memory_bandwidth == doctest::Approx(1555e9));
  CHECK(c.block_seconds.empty());
  for (size_t i = 0; i < 6; ++i)
    for (size_t j = 0; j < 6; ++j) {
      CHECK(c.links.latency(i, j) == doctest::Approx(i == j ? 0 : 50e-6));
      CHECK(c.links.bandwidth(i, j) == doctest::Approx(i == j ? 0 : 1.2e9));
    }
  // No @: every pair is pcie.
  ClusterModel d = cluster_from_synth("synth:1xrtx4090,1xh100", catalogue());
  CHECK(d.links.latency(0, 1) == doctest::Approx(5e-6));
  CHECK(d.links.bandwidth(1, 0) == doctest::Approx(25e9));
  // load_cluster_model dispatches on the prefix and checks the world size.
  CHECK(load_cluster_model("synth:4xcpu-8c", catalogue(), 4).ranks.size() == 4);
  CHECK(error_of([] { load_cluster_model("synth:4xcpu-8c", catalogue(), 3); }).find("has 4 ranks but this job has 3") !=
        std::string::npos);
}

TEST_CASE("cluster: bad synth specs name the token and the choices") {
  struct Case {
    const char* spec;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {"synth:", {"lists no devices", "expected synth:COUNTxDEVICE"}},
      {"synth:@pcie", {"lists no devices"}},
      {"synth:0xrtx3060", {"\"0xrtx3060\"", "has count 0", "[1, 4096]"}},
      {"synth:xrtx3060", {"\"xrtx3060\"", "has no count"}},
      {"synth:8rtx3060", {"\"8rtx3060\"", "no 'x' after the count"}},
      {"synth:8x", {"\"8x\"", "names no device"}},
      {"synth:2xrtx3060,,1xh100", {"\"\"", "has no count"}},
      {"synth:99999999999999999999xh100", {"has count 99999999999999999999"}},
      {"synth:4000xh100,4000xh200", {"\"4000xh200\"", "8000 ranks"}},
      {"synth:8xrtx3070", {"\"8xrtx3070\"", "unknown device \"rtx3070\"", "did you mean", "known devices: rtx2080ti,", "cpu-64c"}},
      {"synth:8xrtx3060@infiniband", {"\"@infiniband\"", "unknown link class", "known link classes: nvlink, pcie, ib-200g"}},
      {"synth:8xrtx3060@", {"\"@\"", "unknown link class"}},
      {"rtx3060", {"does not start with \"synth:\""}},
  };
  for (const Case& c : cases) {
    const std::string spec = c.spec;
    CAPTURE(spec);
    const std::string msg = synth_error(c.spec);
    CAPTURE(msg);
    REQUIRE(!msg.empty());
    for (const auto& p : c.parts) CHECK(msg.find(p) != std::string::npos);
  }
}

TEST_CASE("cluster: an unknown device suggests its family, then what contains it, then close spellings") {
  auto hint_of = [](const std::string& spec) {
    const std::string msg = synth_error(spec);
    const size_t at = msg.find("(did you mean ");
    return at == std::string::npos ? std::string() : msg.substr(at, msg.find(')', at) + 1 - at);
  };
  // A prefix: both V100s, not h100 (one edit from "v100").
  CHECK(hint_of("synth:1xv100") == "(did you mean \"v100-16g\" or \"v100-32g\"?)");
  CHECK(hint_of("synth:2xA100") == "(did you mean \"a100-40g\" or \"a100-80g\"?)");
  CHECK(hint_of("synth:1x3090") == "(did you mean \"rtx3090\"?)");  // contained in the id
  CHECK(hint_of("synth:1xrtx3070") == "(did you mean \"rtx3060\", \"rtx3090\" or \"rtx4070\"?)");
  CHECK(hint_of("synth:2xRTX3060") == "(did you mean \"rtx3060\"?)");  // another case first (it said rtx3090)
  CHECK(hint_of("synth:1xquantum") == "");  // nothing close: only the list of known devices
  CHECK(synth_error("synth:1xquantum").find("known devices: rtx2080ti,") != std::string::npos);
}

TEST_CASE("cluster: a missing or malformed catalogue is named with its JSON path") {
  std::string msg = error_of([] { cluster_from_synth("synth:1xh100", "/nonexistent/devices.json"); });
  CHECK(msg.find("/nonexistent/devices.json: no such file") != std::string::npos);

  const std::string head = R"({"format": "hetrain-devices/1", "efficiency": {"cuda": 0.45, "cpu": 0.6},
    "link_classes": {"pcie": {"latency_us": 5, "bandwidth_gb_s": 25}}, "devices": [)";
  const std::string ok_dev = R"({"id": "g", "name": "G", "kind": "cuda", "fp32_tflops": 1, "tf32_tflops": 0,
    "bf16_tflops": 0, "memory_gb": 8, "memory_bandwidth_gb_s": 100, "host_link": {"kind": "pcie", "gb_s": 16}})";
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  std::string neg = ok_dev;
  neg.replace(neg.find("\"fp32_tflops\": 1"), 16, "\"fp32_tflops\": -1");
  std::string bad_source = ok_dev;
  bad_source.replace(bad_source.find("\"host_link\""), 0, "\"source\": 5, ");
  std::string huge = ok_dev;  // past it the planner's sums leave a double's range
  huge.replace(huge.find("\"memory_gb\": 8"), 14, "\"memory_gb\": 1e308");
  std::string typo = ok_dev;
  typo.replace(typo.find("\"memory_gb\""), 11, "\"memory_gib\"");
  std::string comma = ok_dev;  // no synth: spec could name it
  comma.replace(comma.find("\"id\": \"g\""), 9, "\"id\": \"g,h\"");
  const Case cases[] = {
      {head + ok_dev + "]}", {}},
      {head + neg + "]}", {"devices[0].fp32_tflops", "-1 is out of range", "[1e-15, 1e+15]"}},
      {head + huge + "]}", {"devices[0].memory_gb", "1e+308 is out of range", "[1e-15, 1e+15]"}},
      {head + typo + "]}", {"devices[0].memory_gib", "did you mean 'memory_gb'"}},
      {head + comma + "]}", {"devices[0].id", "which a synth: spec cannot name"}},
      {head + bad_source + "]}", {"devices[0].source", "where the figures come from"}},
      {head + ok_dev + "," + ok_dev + "]}", {"devices[1].id", "repeats devices[0]"}},
      {head + "]}", {"devices", "non-empty array"}},
      {R"({"format": "hetrain-devices/1", "devices": []})", {"efficiency: missing"}},
      {"{\"format\": ", {"malformed.json"}},
  };
  for (const Case& c : cases) {
    const fs::path p = temp_file("malformed.json", c.text);
    msg = error_of([&] { cluster_from_synth("synth:1xg", p.string()); });
    fs::remove(p);
    CAPTURE(c.text);
    CAPTURE(msg);
    if (c.parts.empty()) CHECK(msg.empty());
    for (const auto& part : c.parts) {
      CHECK(msg.find(part) != std::string::npos);
      CHECK(msg.find(p.string()) != std::string::npos);  // the file is always named
    }
  }
  // A catalogue without the default link class: a spec naming no @LINK is told which it
  // took (it was told '"@pcie" is an unknown link class', which it never typed).
  std::string no_pcie = head + ok_dev + "]}";
  no_pcie.replace(no_pcie.find("\"pcie\": {"), 9, "\"eth\": {");
  no_pcie.replace(no_pcie.find("\"kind\": \"pcie\""), 14, "\"kind\": \"eth\"");
  const fs::path p = temp_file("no-pcie.json", no_pcie);
  msg = error_of([&] { cluster_from_synth("synth:1xg", p.string()); });
  fs::remove(p);
  CAPTURE(msg);
  CHECK(msg.find("\"(no @LINK)\" takes the link class \"pcie\"") != std::string::npos);
  CHECK(msg.find("expected @LINK naming one of: eth") != std::string::npos);
}

TEST_CASE("cluster: a 1,024-rank synthetic cluster keeps the spec's order") {
  const std::string spec = "synth:256xrtx3060,128xrtx4090,64xa100-40g,64xa100-80g,256xcpu-16c,256xv100-32g";
  ClusterModel c = cluster_from_synth(spec, catalogue());
  REQUIRE(c.ranks.size() == 1024);
  CHECK(c.ranks[0].id == "rtx3060");
  CHECK(c.ranks[255].id == "rtx3060");
  CHECK(c.ranks[256].id == "rtx4090");
  CHECK(c.ranks[1023].id == "v100-32g");
  REQUIRE(c.links.size() == 1024);
  CHECK(c.links.latency(0, 1023) == c.links.latency(1023, 0));
}

TEST_CASE("cluster: from a probe fingerprint") {
  probe::ClusterFingerprint fp;
  const uint64_t gib = 1ull << 30;
  probe::RankFingerprint r0, r1, r2;
  r0.rank = 0, r0.local_rank = 1, r0.device = DeviceKind::cuda;
  r0.host.host = "a", r0.host.cpu_model = "Xeon", r0.host.memory_total = 64 * gib;
  r0.host.gpus = {{0, "RTX 3060", 8, 6, 28, 12 * gib, 11 * gib, 20, 20},
                  {1, "RTX 4090", 8, 9, 128, 24 * gib, 23 * gib, 20, 20}};
  r0.rates = {20000, 4096, 900};
  r1 = r0, r1.rank = 1, r1.local_rank = 0, r1.device = DeviceKind::cpu, r1.rates = {500, 1024, 40};
  r2 = r1, r2.rank = 2, r2.host.host = "b", r2.memory_cap = 2 * gib;
  r0.blocks = {{"dense", 1e-4}, {"head", 2e-4}};
  r1.blocks = {{"dense", 3e-3}, {"head", 4e-3}};
  r2.blocks = {{"dense", 3e-3}, {"head", 4e-3}};
  fp.ranks = {r0, r1, r2};
  fp.links.latency_s = {{0, 1e-6, 5e-5}, {1e-6, 0, 5e-5}, {5e-5, 5e-5, 0}};
  fp.links.bandwidth_bytes_per_s = {{0, 1e10, 1e9}, {1e10, 0, 1e9}, {1e9, 1e9, 0}};

  ClusterModel c = cluster_from_probe(fp);
  REQUIRE(c.ranks.size() == 3);
  CHECK(c.ranks[0].id == "RTX 4090");  // local rank 1 -> the host's second GPU
  CHECK(c.ranks[0].name == "RTX 4090 on a");
  CHECK(c.ranks[0].memory_bytes == doctest::Approx(kUsableMemory * 24.0 * gib));
  CHECK(c.ranks[0].flops == doctest::Approx(20000e9));
  CHECK(c.ranks[0].memory_bandwidth == doctest::Approx(900e9));
  CHECK(c.ranks[0].measured);
  CHECK(c.ranks[1].id == "Xeon");
  CHECK(c.ranks[1].kind == DeviceKind::cpu);
  // Host a's 64 GiB is shared by its two ranks; rank 2's engine cap wins.
  CHECK(c.ranks[1].memory_bytes == doctest::Approx(kUsableMemory * 32.0 * gib));
  CHECK(c.ranks[2].memory_bytes == doctest::Approx(kUsableMemory * 2.0 * gib));
  // Every rank keeps the model's other blocks in its host's memory, shared by that host's
  // ranks: the host's name and whole memory; a CPU rank without a cap computes in it.
  CHECK(c.ranks[0].host == "a");
  CHECK(c.ranks[2].host == "b");
  for (const DeviceModel& d : c.ranks) CHECK(d.host_memory_bytes == doctest::Approx(kUsableMemory * 64.0 * gib));
  CHECK(!c.ranks[0].device_in_host);  // a GPU
  CHECK(c.ranks[1].device_in_host);
  CHECK(!c.ranks[2].device_in_host);  // its cap stands for a device of its own
  CHECK(c.links.latency(0, 2) == doctest::Approx(5e-5));
  CHECK(c.links.bandwidth(1, 0) == doctest::Approx(1e10));
  REQUIRE(c.block_seconds.size() == 3);
  CHECK(c.block_seconds[0] == std::vector<double>{1e-4, 2e-4});
  CHECK(c.block_seconds[2][1] == doctest::Approx(4e-3));
}

TEST_CASE("links by site: one site for a uniform cluster; setting a pair gives its two ranks sites of their own") {
  Links l = Links::uniform(5, 1e-5, 1e9);
  CHECK(l.size() == 5);
  CHECK(l.site_count() == 1);
  for (size_t i = 0; i < 5; ++i)
    for (size_t j = 0; j < 5; ++j) CHECK(l.latency(i, j) == (i == j ? 0 : 1e-5));
  l.set_latency(1, 3, 2e-3);  // one way
  CHECK(l.site_count() == 3);
  for (size_t i = 0; i < 5; ++i)
    for (size_t j = 0; j < 5; ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(l.latency(i, j) == (i == j ? 0 : i == 1 && j == 3 ? 2e-3 : 1e-5));
      CHECK(l.bandwidth(i, j) == (i == j ? 0 : 1e9));
    }
  // 1 and 3 differ from the others (and 1 -> 3 is one way): no two ranks compare alike;
  // 0, 2 and 4 alone are one tier.
  CHECK(l.tiers({0, 1, 2, 3, 4}).empty());
  CHECK(l.tiers({0, 2, 4}) == std::vector<int>{0, 0, 0});
  l.set_latency(3, 1, 2e-3);
  CHECK(l.tiers({0, 1, 2, 3, 4}) == std::vector<int>{0, 1, 0, 1, 0});
  // The links of some ranks, renumbered in their order; a joined rank linked to all.
  const Links sub = l.of({3, 0, 1});
  CHECK(sub.size() == 3);
  CHECK(sub.latency(0, 2) == 2e-3);
  CHECK(sub.latency(1, 2) == 1e-5);
  CHECK(sub.site_count() == 3);
  l.add_rank(5e-2, 1e6);
  CHECK(l.size() == 6);
  CHECK(l.latency(5, 0) == 5e-2);
  CHECK(l.bandwidth(2, 5) == 1e6);
  CHECK(l.latency(5, 5) == 0);
  CHECK(l.latency(1, 3) == 2e-3);
}

TEST_CASE("links by site: tables that do not cover the sites named are refused by name") {
  const auto message = [](const std::function<void()>& f) {  // the ht::Error's message, or ""
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(message([] { Links::by_site({0, 2}, {{0, 1}, {1, 0}}, {{0, 1}, {1, 0}}); }) ==
        "link tables: rank 1 is on site 2; expected a site below 2");
  CHECK(message([] { Links::from_matrices({{0, 1}, {1, 0}}, {{0, 1}}); }) ==
        "link tables: latency of 2 rows, bandwidth of 1; expected one row per site in each");
  CHECK(message([] { Links::uniform(2, 1, 1).set_latency(1, 1, 0); }) ==
        "links: latency from rank 1 to rank 1 of 2; expected two different ranks of the cluster");
}

TEST_CASE("cluster: a host's CPU ranks share its cores where they ask for more than it has") {
  probe::RankFingerprint cpu;
  cpu.device = DeviceKind::cpu;
  cpu.host.host = "a", cpu.host.cpu_model = "EPYC", cpu.host.memory_total = 1ull << 34, cpu.host.physical_cores = 2;
  cpu.rates = {50, 1024, 10};
  auto job = [&](const std::vector<double>& quotas, const std::vector<int>& threads) {
    probe::ClusterFingerprint fp;
    for (size_t i = 0; i < threads.size(); ++i) {
      probe::RankFingerprint r = cpu;
      r.rank = r.local_rank = static_cast<int>(i);
      r.threads = threads[i];
      r.cpu_quota.fraction = quotas.empty() ? 0 : quotas[i];
      r.cpu_quota.period_s = quotas.empty() ? 0 : 0.01;
      fp.ranks.push_back(r);
    }
    const auto n = threads.size();
    fp.links.latency_s.assign(n, std::vector<double>(n, 1e-6));
    fp.links.bandwidth_bytes_per_s.assign(n, std::vector<double>(n, 1e10));
    for (size_t i = 0; i < n; ++i) fp.links.latency_s[i][i] = fp.links.bandwidth_bytes_per_s[i][i] = 0;
    std::vector<bool> shared;
    for (const DeviceModel& d : cluster_from_probe(fp).ranks) shared.push_back(d.cores_shared);
    return shared;
  };
  CHECK(job({}, {1, 1}) == std::vector<bool>{false, false});            // one core each
  CHECK(job({}, {1, 1, 1}) == std::vector<bool>{true, true, true});      // three on two cores
  CHECK(job({}, {2, 1}) == std::vector<bool>{true, true});               // three threads on two
  CHECK(job({0.8, 0.4, 0.2, 0.2}, {1, 1, 1, 1}) == std::vector<bool>(4, false));  // 1.6 of 2 cores
  CHECK(job({0.8, 0.8, 0.2, 0.2}, {1, 1, 1, 1}) == std::vector<bool>(4, false));  // exactly 2
  CHECK(job({0.8, 0.8, 0.4, 0.2}, {1, 1, 1, 1}) == std::vector<bool>(4, true));   // 2.2
  cpu.host.physical_cores = 0;  // not known: nothing is assumed
  CHECK(job({}, {1, 1, 1}) == std::vector<bool>{false, false, false});
  // Ranks of another host and GPU ranks do not count against this host's cores.
  probe::ClusterFingerprint fp;
  for (int i = 0; i < 4; ++i) {
    probe::RankFingerprint r = cpu;
    r.host.physical_cores = 2;
    r.rank = i;
    if (i == 2) r.host.host = "b";
    if (i == 3) r.device = DeviceKind::cuda;
    fp.ranks.push_back(r);
  }
  fp.links.latency_s.assign(4, std::vector<double>(4, 1e-6));
  fp.links.bandwidth_bytes_per_s.assign(4, std::vector<double>(4, 1e10));
  for (size_t i = 0; i < 4; ++i) fp.links.latency_s[i][i] = fp.links.bandwidth_bytes_per_s[i][i] = 0;
  for (const DeviceModel& d : cluster_from_probe(fp).ranks) CHECK_FALSE(d.cores_shared);
}
