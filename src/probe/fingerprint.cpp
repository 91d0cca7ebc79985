#include "probe/fingerprint.h"

#include <cstdio>
#include <iterator>

#include "config/json_schema.h"

namespace ht::probe {

using namespace config::schema;

namespace {

Json host_json(const HostInfo& h) {
  Json gpus = Json::array();
  for (const GpuInfo& g : h.gpus)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"compute_capability", std::to_string(g.compute_major) + "." +
                                               std::to_string(g.compute_minor)},
                    {"sm_count", g.sm_count},
                    {"memory_total_bytes", g.memory_total},
                    {"memory_free_bytes", g.memory_free},
                    {"host_to_device_gb_s", g.host_to_device_gb_s},
                    {"device_to_host_gb_s", g.device_to_host_gb_s}});
  return {{"host", h.host},
          {"cpu_model", h.cpu_model},
          {"physical_cores", h.physical_cores},
          {"hardware_threads", h.hardware_threads},
          {"memory_total_bytes", h.memory_total},
          {"memory_available_bytes", h.memory_available},
          {"gpus", gpus},
          {"gpu_note", h.gpu_note}};
}

Json rank_json(const RankFingerprint& r) {
  Json blocks = Json::array();
  for (size_t i = 0; i < r.blocks.size(); ++i)
    blocks.push_back({{"index", i},
                      {"kind", r.blocks[i].kind},
                      {"fwd_bwd_s_per_sample", r.blocks[i].fwd_bwd_s_per_sample},
                      {"fwd_bwd_s_per_call", r.blocks[i].fwd_bwd_s_per_call},
                      {"optimizer_step_s", r.blocks[i].optimizer_step_s}});
  Json j = {{"rank", r.rank},
          {"local_rank", r.local_rank},
          {"host", host_json(r.host)},
          {"device", {{"kind", to_string(r.device)},
                      {"threads", r.threads},
                      {"sgemm_gflops", r.rates.sgemm_gflops},
                      {"sgemm_size", r.rates.sgemm_size},
                      {"memory_bandwidth_gb_s", r.rates.memory_bandwidth_gb_s}}},
          {"memory_cap_bytes", r.memory_cap},
          {"blocks", blocks},
          {"emulation", r.emulation}};
  // A GPU rank's own rates; written only where measured, so CPU ranks read as before.
  if (r.rates.gpu_index >= 0) {
    Json& d = j["device"];
    d["gpu_index"] = r.rates.gpu_index;
    d["bf16_gemm_gflops"] = r.rates.bf16_gemm_gflops;
    d["launch_overhead_s"] = r.rates.launch_overhead_s;
  }
  if (r.cpu_quota.fraction > 0)
    j["cpu_quota"] = {{"fraction", r.cpu_quota.fraction}, {"period_s", r.cpu_quota.period_s}};
  if (r.gradient_bandwidth_gb_s > 0) j["gradient_bandwidth_gb_s"] = r.gradient_bandwidth_gb_s;
  return j;
}

double positive(const Json& obj, const std::string& path, const char* key) {
  return read_double(require(obj, path, key, "a positive number"), key_path(path, key), Range::figure_above_0());
}

// A part of a memory (`key`: free or available bytes) that cannot exceed its total.
uint64_t memory_part(const Json& obj, const std::string& path, const char* key, uint64_t total, const char* whose) {
  const std::string at = key_path(path, key);
  const uint64_t bytes = read_uint(require(obj, path, key, "bytes"), at);
  if (bytes > total)
    fail_at(at, std::to_string(bytes) + " is more than memory_total_bytes (" + std::to_string(total) +
                    "); expected at most " + whose + " memory");
  return bytes;
}

// A device's or host's memory: a size of 0 would be planned as a device that holds nothing.
uint64_t memory_size(const Json& obj, const std::string& path) {
  const std::string at = key_path(path, "memory_total_bytes");
  const uint64_t bytes = read_uint(require(obj, path, "memory_total_bytes", "bytes"), at);
  if (bytes == 0) fail_at(at, "0 is not a memory size; expected the bytes of memory, > 0");
  return bytes;
}

RankFingerprint parse_rank(const Json& j, const std::string& path) {
  expect_object(j, path, "an object describing one rank");
  RankFingerprint r;
  r.rank = read_int32(require(j, path, "rank", "the rank number"), key_path(path, "rank"), 0);
  r.local_rank = read_int32(require(j, path, "local_rank", "an integer >= 0"), key_path(path, "local_rank"), 0);
  const std::string hp = key_path(path, "host");
  const Json& h = require(j, path, "host", "an object");
  expect_object(h, hp, "an object describing the host");
  r.host.host = read_string(require(h, hp, "host", "a host name"), key_path(hp, "host"), "a host name");
  r.host.cpu_model = read_string(require(h, hp, "cpu_model", "a string"), key_path(hp, "cpu_model"), "a string");
  r.host.physical_cores =
      read_int32(require(h, hp, "physical_cores", "an integer"), key_path(hp, "physical_cores"), 0);
  r.host.hardware_threads =
      read_int32(require(h, hp, "hardware_threads", "an integer"), key_path(hp, "hardware_threads"), 0);
  r.host.memory_total = memory_size(h, hp);
  r.host.memory_available = memory_part(h, hp, "memory_available_bytes", r.host.memory_total, "the host's");
  const std::string gp = key_path(hp, "gpus");
  const Json& gpus = require(h, hp, "gpus", "an array (empty without GPUs)");
  if (!gpus.is_array()) fail_at(gp, show(gpus) + " is not an array; expected one object per GPU");
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string p = index_path(gp, i);
    expect_object(gpus[i], p, "an object describing one GPU");
    GpuInfo g;
    g.index = read_int32(require(gpus[i], p, "index", "an integer"), key_path(p, "index"), 0);
    g.name = read_string(require(gpus[i], p, "name", "a string"), key_path(p, "name"), "the GPU's name");
    std::string cc = read_string(require(gpus[i], p, "compute_capability", "\"major.minor\""),
                                 key_path(p, "compute_capability"), "\"major.minor\"");
    if (std::sscanf(cc.c_str(), "%d.%d", &g.compute_major, &g.compute_minor) != 2)
      fail_at(key_path(p, "compute_capability"), show(Json(cc)) + " is not a version; expected \"major.minor\"");
    g.sm_count = read_int32(require(gpus[i], p, "sm_count", "an integer"), key_path(p, "sm_count"), 1);
    g.memory_total = memory_size(gpus[i], p);
    g.memory_free = memory_part(gpus[i], p, "memory_free_bytes", g.memory_total, "the GPU's");
    g.host_to_device_gb_s = read_double(require(gpus[i], p, "host_to_device_gb_s", "GB/s"),
                                        key_path(p, "host_to_device_gb_s"), Range::figure_at_least_0());
    g.device_to_host_gb_s = read_double(require(gpus[i], p, "device_to_host_gb_s", "GB/s"),
                                        key_path(p, "device_to_host_gb_s"), Range::figure_at_least_0());
    r.host.gpus.push_back(g);
  }
  auto note = h.find("gpu_note");
  if (note != h.end()) {
    if (!note->is_string()) fail_at(key_path(hp, "gpu_note"), show(*note) + " is not a string; expected a note");
    r.host.gpu_note = note->get<std::string>();
  }
  const std::string dp = key_path(path, "device");
  const Json& d = require(j, path, "device", "an object");
  expect_object(d, dp, "an object describing the device");
  r.device = *parse_device_kind(
      read_enum(require(d, dp, "kind", "cpu or cuda"), key_path(dp, "kind"), device_kind_names()));
  // A GPU rank's model is its GPU's: with none listed it would be planned as the host's CPU.
  if (r.device == DeviceKind::cuda && r.host.gpus.empty())
    fail_at(key_path(dp, "kind"), "\"cuda\" but host.gpus is empty; expected the host to list the rank's GPU");
  r.threads = read_int32(require(d, dp, "threads", "an integer >= 1"), key_path(dp, "threads"), 1);
  r.rates.sgemm_gflops = positive(d, dp, "sgemm_gflops");
  r.rates.sgemm_size = read_int(require(d, dp, "sgemm_size", "an integer"), key_path(dp, "sgemm_size"), 1);
  r.rates.memory_bandwidth_gb_s = positive(d, dp, "memory_bandwidth_gb_s");
  // The GPU rates: all three or none (files from before them, and CPU ranks, have none).
  const bool has_gpu_rates = d.contains("gpu_index") || d.contains("bf16_gemm_gflops") || d.contains("launch_overhead_s");
  if (has_gpu_rates) {
    const std::string ip = key_path(dp, "gpu_index");
    if (r.device != DeviceKind::cuda)
      fail_at(key_path(dp, "kind"), show(d["kind"]) + " has GPU rates (gpu_index, bf16_gemm_gflops, "
              "launch_overhead_s); expected them only with kind \"cuda\"");
    const auto gpus_seen = static_cast<int64_t>(r.host.gpus.size());
    const Json& index = require(d, dp, "gpu_index", "the index of the rank's GPU in host.gpus");
    if (gpus_seen == 0) fail_at(ip, show(index) + " names a GPU but host.gpus is empty; expected a GPU the host lists");
    const int64_t gpu = read_int(index, ip, 0);
    if (gpu >= gpus_seen)
      fail_at(ip, std::to_string(gpu) + " is not a GPU of host.gpus; expected 0 to " + std::to_string(gpus_seen - 1));
    r.rates.gpu_index = static_cast<int>(gpu);
    r.rates.bf16_gemm_gflops = read_double(require(d, dp, "bf16_gemm_gflops", "GFLOP/s (0 below sm_80)"),
                                           key_path(dp, "bf16_gemm_gflops"), Range::figure_at_least_0());
    r.rates.launch_overhead_s = positive(d, dp, "launch_overhead_s");
  }
  r.memory_cap = read_uint(require(j, path, "memory_cap_bytes", "bytes (0 = none)"), key_path(path, "memory_cap_bytes"));
  const std::string bp = key_path(path, "blocks");
  const Json& blocks = require(j, path, "blocks", "an array");
  if (!blocks.is_array()) fail_at(bp, show(blocks) + " is not an array; expected an array of blocks");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string p = index_path(bp, i);
    expect_object(blocks[i], p, "an object with kind and fwd_bwd_s_per_sample");
    // The times are taken in array order: an index the writer put elsewhere says the file
    // was edited out of order (files from before the index have none).
    if (auto index = blocks[i].find("index"); index != blocks[i].end())
      if (read_int(*index, key_path(p, "index"), 0) != static_cast<int64_t>(i))
        fail_at(key_path(p, "index"), show(*index) + " is not this entry's place; expected " + std::to_string(i) +
                                          " (the blocks in model order)");
    BlockTiming t{read_string(require(blocks[i], p, "kind", "a string"), key_path(p, "kind"), "a block kind"),
                  positive(blocks[i], p, "fwd_bwd_s_per_sample")};
    if (auto call = blocks[i].find("fwd_bwd_s_per_call"); call != blocks[i].end())
      t.fwd_bwd_s_per_call = read_double(*call, key_path(p, "fwd_bwd_s_per_call"), Range::figure_at_least_0());
    if (auto step = blocks[i].find("optimizer_step_s"); step != blocks[i].end())
      t.optimizer_step_s = read_double(*step, key_path(p, "optimizer_step_s"), Range::figure_at_least_0());
    r.blocks.push_back(t);
  }
  auto em = j.find("emulation");
  if (em != j.end()) r.emulation = read_string_array(*em, key_path(path, "emulation"), "notes");
  if (auto q = j.find("cpu_quota"); q != j.end()) {
    const std::string qp = key_path(path, "cpu_quota");
    expect_object(*q, qp, "an object with fraction and period_s");
    r.cpu_quota.fraction = positive(*q, qp, "fraction");
    r.cpu_quota.period_s = positive(*q, qp, "period_s");
  }
  // Optional: files from before it, and ranks probed without a model, have none.
  if (j.contains("gradient_bandwidth_gb_s")) {
    if (r.blocks.empty())
      fail_at(key_path(path, "gradient_bandwidth_gb_s"),
              show(j["gradient_bandwidth_gb_s"]) + " is given for a rank with no block profile; expected it only "
              "beside the blocks of the model it was measured for (a probe that profiled a model)");
    r.gradient_bandwidth_gb_s = positive(j, path, "gradient_bandwidth_gb_s");
  }
  return r;
}

std::vector<std::vector<double>> parse_matrix(const Json& j, const std::string& path, size_t n,
                                              bool positive_off_diagonal) {
  if (!j.is_array() || j.size() != n)
    fail_at(path, show(j) + " is not a " + std::to_string(n) + " x " + std::to_string(n) +
                      " matrix; expected one row per rank");
  std::vector<std::vector<double>> m(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string rp = index_path(path, i);
    if (!j[i].is_array() || j[i].size() != n)
      fail_at(rp, show(j[i]) + " is not a row of " + std::to_string(n) + " numbers; expected one entry per rank");
    for (size_t k = 0; k < n; ++k) {
      Range r = positive_off_diagonal && i != k ? Range::figure_above_0() : Range::figure_at_least_0();
      m[i].push_back(read_double(j[i][k], index_path(rp, k), r));
    }
  }
  return m;
}

}  // namespace

std::string rank_to_json(const RankFingerprint& r) { return rank_json(r).dump(); }

RankFingerprint rank_from_json(const std::string& text) {
  return parse_rank(parse_document(text, "rank fingerprint"), "rank");
}

std::string cluster_to_json(const ClusterFingerprint& c) {
  Json ranks = Json::array();
  for (const RankFingerprint& r : c.ranks) ranks.push_back(rank_json(r));
  Json j = {{"format", kClusterFormat},
            {"world_size", c.ranks.size()},
            {"model", c.model},
            {"model_signature", c.model_signature},
            {"ranks", ranks},
            {"links", {{"emulated", c.links_emulated},
                       {"latency_s", c.links.latency_s},
                       {"bandwidth_bytes_per_s", c.links.bandwidth_bytes_per_s}}}};
  return j.dump(2);
}

namespace {

ClusterFingerprint parse_cluster(const Json& j, const std::string& path,
                                 std::optional<int> expected_world_size) {
  expect_object(j, "(top level)", "a cluster file (an object with format, world_size, ranks and links)");
  std::string format = read_string(require(j, "", "format", kClusterFormat), "format", kClusterFormat);
  if (format != kClusterFormat)
    fail_at("format", show(j["format"]) + " is not a known cluster format; expected \"" +
                          std::string(kClusterFormat) + "\"");
  auto n = static_cast<size_t>(read_int(require(j, "", "world_size", "an integer >= 1"), "world_size", 1));
  if (expected_world_size && static_cast<int>(n) != *expected_world_size)
    fail_at("world_size", std::to_string(n) + " ranks in " + path + " but this job has " +
                              std::to_string(*expected_world_size) +
                              "; expected a cluster file probed with the same world size");
  ClusterFingerprint c;
  auto model = j.find("model");
  if (model != j.end()) {
    if (!model->is_string()) fail_at("model", show(*model) + " is not a string; expected the profiled config's path or \"\"");
    c.model = model->get<std::string>();
  }
  if (auto sig = j.find("model_signature"); sig != j.end()) {  // files from before it have none
    if (!sig->is_string()) fail_at("model_signature", show(*sig) + " is not a string; expected the probe's word for the model");
    c.model_signature = sig->get<std::string>();
    // The probe writes a CRC-32 in hex (model_signature), or "" where it profiled no
    // model; anything else matches no model.
    if (!c.model_signature.empty() && (c.model_signature.size() != 8 ||
                                       c.model_signature.find_first_not_of("0123456789abcdef") != std::string::npos))
      fail_at("model_signature", show(*sig) + " is not eight lowercase hex digits; expected the signature the probe "
                                              "wrote (its model's blocks' shapes), or \"\"");
  }
  const Json& ranks = require(j, "", "ranks", "an array of ranks");
  if (!ranks.is_array() || ranks.size() != n)
    fail_at("ranks", "has " + std::to_string(ranks.is_array() ? ranks.size() : 0) +
                         " entries; expected world_size = " + std::to_string(n));
  std::map<std::pair<std::string, int>, size_t> local_ranks;  // (host, local rank) -> rank
  std::optional<size_t> profiled;  // the first rank with a block profile
  for (size_t i = 0; i < n; ++i) {
    c.ranks.push_back(parse_rank(ranks[i], index_path("ranks", i)));
    // Every profile is of the one model: one rank's blocks apart from the others' is an
    // edited file, which the planner had taken for another model (and dropped every
    // rank's profile, saying only that the signature differed).
    if (const std::vector<BlockTiming>& b = c.ranks.back().blocks; !b.empty()) {
      if (!profiled) profiled = i;
      const std::vector<BlockTiming>& first = c.ranks[*profiled].blocks;
      const std::string bp = key_path(index_path("ranks", i), "blocks");
      if (b.size() != first.size())
        fail_at(bp, "has " + std::to_string(b.size()) + " blocks where rank " + std::to_string(*profiled) + " has " +
                        std::to_string(first.size()) + "; expected every rank's profile of the one model");
      for (size_t k = 0; k < b.size(); ++k)
        if (b[k].kind != first[k].kind)
          fail_at(key_path(index_path(bp, k), "kind"), show(ranks[i]["blocks"][k]["kind"]) + " where rank " +
                                                           std::to_string(*profiled) + "'s block " + std::to_string(k) +
                                                           " is \"" + first[k].kind +
                                                           "\"; expected every rank's profile of the one model");
    }
    if (c.ranks.back().rank != static_cast<int>(i))
      fail_at(key_path(index_path("ranks", i), "rank"),
              std::to_string(c.ranks.back().rank) + " is out of order; expected " + std::to_string(i));
    // A host's ranks share its memory and devices by local rank: two with one would be
    // given the same GPU and each half the memory of a host with one rank fewer.
    const auto [at, fresh] = local_ranks.try_emplace({c.ranks.back().host.host, c.ranks.back().local_rank}, i);
    if (!fresh)
      fail_at(key_path(index_path("ranks", i), "local_rank"),
              std::to_string(c.ranks.back().local_rank) + " is also rank " + std::to_string(at->second) +
                  "'s on host \"" + c.ranks.back().host.host + "\"; expected each rank of a host its own local rank");
  }
  const Json& links = require(j, "", "links", "an object with latency_s and bandwidth_bytes_per_s");
  expect_object(links, "links", "an object with latency_s and bandwidth_bytes_per_s");
  auto em = links.find("emulated");
  if (em != links.end()) c.links_emulated = read_bool(*em, "links.emulated");
  c.links.latency_s = parse_matrix(require(links, "links", "latency_s", "a matrix"), "links.latency_s", n, true);
  c.links.bandwidth_bytes_per_s = parse_matrix(require(links, "links", "bandwidth_bytes_per_s", "a matrix"),
                                               "links.bandwidth_bytes_per_s", n, true);
  return c;
}

}  // namespace

ClusterFingerprint read_cluster(const std::string& path, std::optional<int> expected_world_size) {
  const std::string text = config::schema::read_document_file(path, "a cluster file (a probe's fingerprint)");
  const Json j = parse_document(text, path);  // names the file itself
  try {
    return parse_cluster(j, path, expected_world_size);
  } catch (const config::ConfigError& e) {
    throw config::ConfigError(path + ": " + e.what());
  }
}

}  // namespace ht::probe
