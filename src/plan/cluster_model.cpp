#include "plan/cluster_model.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <utility>

#include "config/json_schema.h"
#include "config/spec_fields.h"
#include "core/error.h"
#include "core/stats.h"

namespace ht::plan {

using namespace config::schema;

namespace {

// Memory capacities are sold in GiB while the datasheet says "GB".
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// A typo like 80000xrtx3060 would plan for minutes; 4,096 ranks is beyond any cluster
// we plan.
constexpr int64_t kMaxSynthRanks = 4096;
constexpr const char* kDefaultLink = "pcie";

CatalogueDevice parse_device(const Json& d, const std::string& p) {
  expect_object(d, p, "a device object");
  CatalogueDevice c;
  auto num = [](double& out, Range r) {
    return [&out, r](const Json& v, const std::string& at) { out = read_double(v, at, r); };
  };
  walk(d, p,
       {{"id", {}, [&](const Json& v, const std::string& at) {
          c.id = read_string(v, at, "a device id");
          // synth: specs name devices between ',', 'x' counts and '@' links.
          if (c.id.find_first_of(",@ ") != std::string::npos)
            fail_at(at, show(v) + " holds a ',', '@' or space, which a synth: spec cannot name; expected an id "
                               "such as \"rtx3060\"");
        }},
        {"name", {}, [&](const Json& v, const std::string& at) { c.name = read_string(v, at, "a name"); }},
        {"kind", {}, [&](const Json& v, const std::string& at) { c.kind = *parse_device_kind(read_enum(v, at, device_kind_names())); }},
        {"fp32_tflops", {}, num(c.fp32_tflops, Range::figure_above_0())},
        {"tf32_tflops", {}, num(c.tf32_tflops, Range::figure_at_least_0())},
        {"bf16_tflops", {}, num(c.bf16_tflops, Range::figure_at_least_0())},
        {"memory_gb", {}, num(c.memory_gb, Range::figure_above_0())},
        {"memory_bandwidth_gb_s", {}, num(c.memory_bandwidth_gb_s, Range::figure_above_0())},
        {"source", {}, [&](const Json& v, const std::string& at) { c.source = read_string(v, at, "where the figures come from"); }},
        {"host_link", {}, [&](const Json& v, const std::string& at) {
           expect_object(v, at, "an object with kind and gb_s");
           walk(v, at,
                {{"kind", {}, [&](const Json& x, const std::string& a) { c.host_link_kind = read_string(x, a, "a link name"); }},
                 {"gb_s", {}, num(c.host_link_gb_s, Range::figure_above_0())}});
           require(v, at, "kind", "a link name");
           require(v, at, "gb_s", "a number > 0");
         }}});
  // After the walk, so a misspelt key is reported as such (with a suggestion) first.
  for (const char* k : {"id", "name", "kind", "fp32_tflops", "tf32_tflops", "bf16_tflops",
                        "memory_gb", "memory_bandwidth_gb_s", "host_link"})
    require(d, p, k, "a value");
  return c;
}

Catalogue parse_catalogue(const Json& j) {
  expect_object(j, "", "a device catalogue (format, devices, efficiency, link_classes)");
  for (const char* k : {"format", "efficiency", "devices", "link_classes"}) require(j, "", k, "a value");
  Catalogue cat;
  std::map<DeviceKind, double> eff;
  walk(j, "",
       {{"format", {}, [](const Json& v, const std::string& at) {
           read_enum(v, at, {"hetrain-devices/1"});
         }},
        {"note", {}, [](const Json& v, const std::string& at) { read_string(v, at, "a note"); }},
        {"efficiency", {}, [&](const Json& v, const std::string& at) {
           expect_object(v, at, "an object of factors per device kind");
           auto factor = [&](DeviceKind kind) {
             return [&eff, kind](const Json& x, const std::string& a) {
               eff[kind] = read_double(x, a, Range{0, 1, true, false});
             };
           };
           walk(v, at,
                {{"note", {}, [](const Json& x, const std::string& a) { read_string(x, a, "a note"); }},
                 {"cuda", {}, factor(DeviceKind::cuda)},
                 {"cpu", {}, factor(DeviceKind::cpu)}});
         }},
        {"devices", {}, [&](const Json& v, const std::string& at) {
           if (!v.is_array() || v.empty()) fail_at(at, show(v) + " is not a non-empty array; expected device objects");
           for (size_t i = 0; i < v.size(); ++i) {
             cat.devices.push_back(parse_device(v[i], index_path(at, i)));
             for (size_t k = 0; k + 1 < cat.devices.size(); ++k)
               if (cat.devices[k].id == cat.devices.back().id)
                 fail_at(key_path(index_path(at, i), "id"), show(Json(cat.devices[k].id)) +
                             " repeats devices[" + std::to_string(k) + "]; expected unique ids");
           }
         }},
        {"link_classes", {}, [&](const Json& v, const std::string& at) {
           expect_object(v, at, "an object of link classes");
           for (const auto& [key, lc] : v.items()) {
             const std::string p = key_path(at, key);
             if (key == "note") { read_string(lc, p, "a note"); continue; }
             expect_object(lc, p, "an object with latency_us and bandwidth_gb_s");
             LinkClass l{key, 0, 0};
             walk(lc, p,
                  {{"latency_us", {},
                    [&](const Json& x, const std::string& a) {
                      l.latency_s = read_double(x, a, Range::figure_above_0()) * 1e-6;
                    }},
                   {"bandwidth_gb_s", {},
                    [&](const Json& x, const std::string& a) {
                      l.bandwidth_bytes_per_s = read_double(x, a, Range::figure_above_0()) * 1e9;
                    }}});
             if (l.latency_s == 0) fail_missing(key_path(p, "latency_us"), "a number > 0");
             if (l.bandwidth_bytes_per_s == 0) fail_missing(key_path(p, "bandwidth_gb_s"), "a number > 0");
             cat.links.push_back(l);
           }
           if (cat.links.empty()) fail_at(at, "has no link classes; expected at least one");
         }}});
  for (CatalogueDevice& d : cat.devices) {
    const std::string kind = to_string(d.kind);
    if (!eff.count(d.kind)) fail_missing("efficiency." + kind, "a factor in (0, 1] for " + kind + " devices");
    d.efficiency = eff[d.kind];
  }
  return cat;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

[[noreturn]] void spec_error(const std::string& spec, const std::string& token, const std::string& problem) {
  throw config::ConfigError("cluster spec \"" + config::spec_text(spec, 80) + "\": \"" + config::spec_text(token) +
                            "\" " + problem);
}

}  // namespace

Catalogue read_catalogue(const std::string& path) {
  // A path that came from the environment says so: nothing on the command line named it.
  const char* env = std::getenv("HETRAIN_DEVICES");
  const bool from_env = env && *env && path == env;
  try {
    const std::string text = config::schema::read_document_file(path, "the device catalogue (configs/devices.json)");
    Json j = parse_document(text, path);  // names the file itself
    // The schema helpers name the JSON path only; a catalogue error must also say which file.
    try {
      return parse_catalogue(j);
    } catch (const config::ConfigError& e) {
      throw config::ConfigError(path + ": " + e.what());
    }
  } catch (const config::ConfigError& e) {
    if (!from_env) throw;
    throw config::ConfigError(std::string(e.what()) + " (the catalogue $HETRAIN_DEVICES names)");
  }
}

std::string default_catalogue_path() {
  if (const char* env = std::getenv("HETRAIN_DEVICES"); env && *env) return env;
  const std::string source = std::string(HETRAIN_SOURCE_DIR) + "/configs/devices.json";
  if (std::filesystem::exists(source)) return source;
  return std::string(HETRAIN_DATA_DIR) + "/devices.json";
}

namespace {

// A pair measured far slower than both of its ranks' typical links was caught by the
// scheduler (a throttled or oversubscribed rank descheduled mid-ping), not limited by a
// wire: bound it by the slower rank's typical (median) link. A rank that is slow on
// every link (an emulated or really remote one) keeps its figures, since its own median
// is slow too.
void bound_link_outliers(std::vector<std::vector<double>>& m, bool higher_is_worse) {
  const size_t n = m.size();
  if (n < 3) return;  // no majority to compare a pair against
  std::vector<double> typical(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> row;
    for (size_t j = 0; j < n; ++j)
      if (j != i) row.push_back(m[i][j]);
    typical[i] = median(row);
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      if (higher_is_worse) m[i][j] = std::min(m[i][j], std::max(typical[i], typical[j]));
      else m[i][j] = std::max(m[i][j], std::min(typical[i], typical[j]));
    }
}

}  // namespace

namespace {

std::string letters_and_digits(const std::string& s) {
  std::string out;
  for (char ch : s)
    if (std::isalnum(static_cast<unsigned char>(ch))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

const CatalogueDevice* match_catalogue(const Catalogue& catalogue, const std::string& gpu_name,
                                       double memory_bytes) {
  const std::string name = letters_and_digits(gpu_name);
  const CatalogueDevice* best = nullptr;
  for (const CatalogueDevice& d : catalogue.devices) {
    if (d.kind != DeviceKind::cuda) continue;
    const std::string family = letters_and_digits(d.id.substr(0, d.id.find('-')));
    if (family.empty() || name.find(family) == std::string::npos) continue;
    if (!best || std::abs(d.memory_gb * kGiB - memory_bytes) < std::abs(best->memory_gb * kGiB - memory_bytes))
      best = &d;
  }
  return best;
}

double bf16_gemm_flops(double probed_gflops, const CatalogueDevice* sheet) {
  if (probed_gflops > 0) return probed_gflops * 1e9;
  if (sheet && sheet->kind == DeviceKind::cuda) return sheet->bf16_tflops * 1e12 * sheet->efficiency;
  return 0;
}

ClusterModel cluster_from_probe(const probe::ClusterFingerprint& fp, const Catalogue* catalogue) {
  ClusterModel c;
  c.source = "probe";
  c.model_signature = fp.model_signature;
  // Ranks on one host share its RAM; giving each the whole host would over-commit it.
  std::map<std::string, int> ranks_on_host;
  for (const auto& r : fp.ranks) ++ranks_on_host[r.host.host];
  // The cores the CPU ranks of each host ask for, against the cores it has (0: unknown).
  std::map<std::string, double> cpu_demand;
  std::map<std::string, int> cores;
  for (const auto& r : fp.ranks) {
    if (r.device != DeviceKind::cpu) continue;
    const double q = r.cpu_quota.fraction;
    cpu_demand[r.host.host] += q > 0 && q < r.threads ? q : std::max(r.threads, 1);
    cores[r.host.host] = r.host.physical_cores;
  }
  bool any_blocks = false;
  for (const auto& r : fp.ranks) {
    DeviceModel d;
    d.kind = r.device;
    d.measured = true;
    d.flops = r.rates.sgemm_gflops * 1e9;
    d.memory_bandwidth = r.rates.memory_bandwidth_gb_s * 1e9;
    d.gradient_bandwidth = r.gradient_bandwidth_gb_s * 1e9;
    d.cpu_quota = r.cpu_quota.fraction;
    d.cpu_quota_period_s = r.cpu_quota.period_s;
    const auto& gpus = r.host.gpus;
    const bool gpu_rates = r.rates.gpu_index >= 0 && static_cast<size_t>(r.rates.gpu_index) < gpus.size();
    if (r.device == DeviceKind::cuda && !gpus.empty()) {
      // Files from before GPU rates name no GPU: one GPU per local rank, as "cuda" picks.
      const auto& g = gpus[gpu_rates ? static_cast<size_t>(r.rates.gpu_index)
                                     : static_cast<size_t>(r.local_rank) % gpus.size()];
      d.id = g.name;
      d.memory_bytes = static_cast<double>(g.memory_total);
      if (gpu_rates) {
        if (g.memory_free > 0) d.memory_bytes = static_cast<double>(g.memory_free);
        d.call_seconds = kLaunchesPerBlockCall * r.rates.launch_overhead_s;
      } else if (const CatalogueDevice* sheet = catalogue ? match_catalogue(*catalogue, g.name, d.memory_bytes) : nullptr) {
        d.flops = sheet->fp32_tflops * 1e12 * sheet->efficiency;
        d.memory_bandwidth = sheet->memory_bandwidth_gb_s * 1e9;
        d.measured = false;
      }
      d.bf16_flops = bf16_gemm_flops(gpu_rates ? r.rates.bf16_gemm_gflops : 0,
                                     catalogue ? match_catalogue(*catalogue, g.name, static_cast<double>(g.memory_total)) : nullptr);
    } else {
      d.id = r.host.cpu_model.empty() ? to_string(r.device) : r.host.cpu_model;
      d.memory_bytes = static_cast<double>(r.host.memory_total) / ranks_on_host[r.host.host];
    }
    d.host = r.host.host;
    d.host_memory_bytes = kUsableMemory * static_cast<double>(r.host.memory_total);
    d.device_in_host = r.device == DeviceKind::cpu && r.memory_cap == 0;
    if (r.device == DeviceKind::cpu) {
      const int n = cores[r.host.host];
      // A hundredth over: quotas summing to the cores exactly, as printed and read back.
      d.cores_shared = n > 0 && cpu_demand[r.host.host] > n + 0.01;
    }
    // The allocator cap is what the engine enforces (and how a small device is emulated).
    if (r.memory_cap > 0) d.memory_bytes = static_cast<double>(r.memory_cap);
    d.memory_bytes *= kUsableMemory;
    d.name = d.id + " on " + (r.host.host.empty() ? "?" : r.host.host);
    c.ranks.push_back(d);
    any_blocks = any_blocks || !r.blocks.empty();
  }
  std::vector<std::vector<double>> latency = fp.links.latency_s, bandwidth = fp.links.bandwidth_bytes_per_s;
  bound_link_outliers(latency, true);
  bound_link_outliers(bandwidth, false);
  c.links = Links::from_matrices(std::move(latency), std::move(bandwidth));
  if (any_blocks)
    for (const auto& r : fp.ranks) {
      std::vector<double> row, step, call;
      for (const auto& b : r.blocks) {
        row.push_back(b.fwd_bwd_s_per_sample);
        step.push_back(b.optimizer_step_s);
        call.push_back(b.fwd_bwd_s_per_call);
      }
      c.block_seconds.push_back(std::move(row));
      c.block_step_seconds.push_back(std::move(step));
      c.block_call_seconds.push_back(std::move(call));
    }
  return c;
}

ClusterModel cluster_from_synth(const std::string& spec, const std::string& catalogue_path) {
  const std::string prefix = "synth:";
  const std::string grammar = "expected synth:COUNTxDEVICE[,COUNTxDEVICE...][@LINKCLASS], e.g. synth:8xrtx3060,2xa100-40g@ethernet-10g";
  if (spec.rfind(prefix, 0) != 0) spec_error(spec, spec, "does not start with \"synth:\"; " + grammar);
  const std::string body = spec.substr(prefix.size());
  const size_t at = body.find('@');
  const std::string list = body.substr(0, at);
  const std::string link = at == std::string::npos ? kDefaultLink : body.substr(at + 1);
  if (list.empty()) spec_error(spec, list, "lists no devices; " + grammar);

  // Syntax first, so a malformed spec is reported without needing the catalogue.
  std::vector<std::pair<int64_t, std::string>> items;
  int64_t total = 0;
  for (size_t pos = 0;;) {
    const size_t comma = list.find(',', pos);
    const std::string tok = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const char* b = tok.data();
    const char* e = b + tok.size();
    int64_t count = 0;
    auto [ptr, ec] = std::from_chars(b, e, count);
    if (ptr == b) spec_error(spec, tok, "has no count; expected COUNTxDEVICE, e.g. 8xrtx3060");
    if (ec != std::errc() || count < 1 || count > kMaxSynthRanks)
      spec_error(spec, tok, "has count " + config::spec_text(std::string(b, ptr)) + "; expected a count in [1, " +
                                std::to_string(kMaxSynthRanks) + "]");
    if (ptr == e || *ptr != 'x') spec_error(spec, tok, "has no 'x' after the count; expected COUNTxDEVICE, e.g. 8xrtx3060");
    std::string id(ptr + 1, e);
    if (id.empty()) spec_error(spec, tok, "names no device; expected COUNTxDEVICE, e.g. 8xrtx3060");
    total += count;
    if (total > kMaxSynthRanks)
      spec_error(spec, tok, "brings the cluster to " + std::to_string(total) + " ranks; expected at most " +
                                std::to_string(kMaxSynthRanks));
    items.emplace_back(count, id);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }

  const Catalogue cat = read_catalogue(catalogue_path);
  std::vector<std::string> link_ids, device_ids;
  for (const auto& l : cat.links) link_ids.push_back(l.id);
  for (const auto& d : cat.devices) device_ids.push_back(d.id);
  auto hint = [](const std::string& word, const std::vector<std::string>& known) {
    // The same letters in another case first: edit distance ranks "RTX3060" nearer
    // "rtx3090" (one digit) than "rtx3060" (three letters).
    const auto lower = [](std::string t) {
      for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return t;
    };
    std::vector<std::string> close;
    for (const std::string& k : known)
      if (lower(k) == lower(word)) close.push_back(k);
    if (close.empty()) close = suggest_all(word, known);
    std::string s;
    for (size_t i = 0; i < close.size(); ++i)
      s += (i == 0 ? "" : i + 1 == close.size() ? " or " : ", ") + ("\"" + close[i] + "\"");
    return s.empty() ? s : " (did you mean " + s + "?)";
  };
  auto lc = std::find_if(cat.links.begin(), cat.links.end(), [&](const LinkClass& l) { return l.id == link; });
  if (lc == cat.links.end()) {
    if (at == std::string::npos)  // the user named none: say which one was assumed
      spec_error(spec, "(no @LINK)", std::string("takes the link class \"") + kDefaultLink + "\", which " + catalogue_path +
                                         " does not list; expected @LINK naming one of: " + join(link_ids));
    spec_error(spec, "@" + link, "is an unknown link class" + hint(link, link_ids) + "; known link classes: " + join(link_ids));
  }

  ClusterModel c;
  c.source = spec;
  for (const auto& [count, id] : items) {
    auto dev = std::find_if(cat.devices.begin(), cat.devices.end(), [&](const CatalogueDevice& d) { return d.id == id; });
    if (dev == cat.devices.end())
      spec_error(spec, std::to_string(count) + "x" + id,
                 "names an unknown device \"" + config::spec_text(id) + "\"" + hint(id, device_ids) +
                     "; known devices: " + join(device_ids));
    // kUsableMemory of the datasheet's memory, as of a probed device's: the same hardware
    // plans alike as a synth: spec and as a cluster file (a card at 100% of its nominal
    // memory was planned full, which its CUDA context alone rules out).
    DeviceModel m;
    m.id = dev->id;
    m.name = dev->name;
    m.kind = dev->kind;
    m.flops = dev->fp32_tflops * 1e12 * dev->efficiency;
    m.memory_bytes = dev->memory_gb * kGiB * kUsableMemory;
    m.memory_bandwidth = dev->memory_bandwidth_gb_s * 1e9;
    m.bf16_flops = bf16_gemm_flops(0, &*dev);
    c.ranks.insert(c.ranks.end(), static_cast<size_t>(count), m);
  }
  const size_t n = c.ranks.size();
  c.links = Links::uniform(n, lc->latency_s, lc->bandwidth_bytes_per_s);
  return c;
}

namespace {

bool same_device(const DeviceModel& a, const DeviceModel& b) {
  return a.id == b.id && a.name == b.name && a.kind == b.kind && a.flops == b.flops &&
         a.memory_bytes == b.memory_bytes && a.memory_bandwidth == b.memory_bandwidth &&
         a.gradient_bandwidth == b.gradient_bandwidth && a.cores_shared == b.cores_shared &&
         a.measured == b.measured && a.cpu_quota == b.cpu_quota && a.cpu_quota_period_s == b.cpu_quota_period_s &&
         a.call_seconds == b.call_seconds && a.bf16_flops == b.bf16_flops &&
         a.host == b.host && a.host_memory_bytes == b.host_memory_bytes && a.device_in_host == b.device_in_host;
}

// Row `a` and row `b` of a per-rank table agree (both absent counts as agreeing).
bool same_row(const std::vector<std::vector<double>>& t, size_t a, size_t b) {
  const bool ha = a < t.size(), hb = b < t.size();
  if (!ha || !hb) return ha == hb || (ha ? t[a].empty() : t[b].empty());
  return t[a] == t[b];
}

// Pairwise, for links that are not symmetric (where link tiers compare no two ranks).
bool same_links(const Links& l, size_t a, size_t b) {
  if (l.latency(a, b) != l.latency(b, a) || l.bandwidth(a, b) != l.bandwidth(b, a)) return false;
  for (size_t x = 0; x < l.size(); ++x)
    if (x != a && x != b &&
        (l.latency(a, x) != l.latency(b, x) || l.latency(x, a) != l.latency(x, b) ||
         l.bandwidth(a, x) != l.bandwidth(b, x) || l.bandwidth(x, a) != l.bandwidth(x, b)))
      return false;
  return true;
}

// `tier`: Links::tiers of every rank (empty: compared pairwise).
bool interchangeable(const ClusterModel& c, const std::vector<int>& tier, size_t a, size_t b) {
  return same_device(c.ranks[a], c.ranks[b]) && same_row(c.block_seconds, a, b) &&
         same_row(c.block_step_seconds, a, b) && same_row(c.block_call_seconds, a, b) &&
         (tier.empty() ? same_links(c.links, a, b) : tier[a] == tier[b]);
}

}  // namespace

Links Links::uniform(size_t ranks, double latency_s, double bandwidth_bytes_per_s) {
  Links l;
  l.site_.assign(ranks, 0);
  l.lat_ = {{latency_s}};
  l.bw_ = {{bandwidth_bytes_per_s}};
  return l;
}

Links Links::from_matrices(std::vector<std::vector<double>> latency_s,
                           std::vector<std::vector<double>> bandwidth_bytes_per_s) {
  const size_t n = latency_s.size();
  std::vector<size_t> site(n);
  for (size_t i = 0; i < n; ++i) site[i] = i;
  return by_site(std::move(site), std::move(latency_s), std::move(bandwidth_bytes_per_s));
}

Links Links::by_site(std::vector<size_t> site, std::vector<std::vector<double>> latency_s,
                     std::vector<std::vector<double>> bandwidth_bytes_per_s) {
  const size_t n = latency_s.size();
  HT_CHECK(bandwidth_bytes_per_s.size() == n, "link tables: latency of ", n, " rows, bandwidth of ",
           bandwidth_bytes_per_s.size(), "; expected one row per site in each");
  for (size_t i = 0; i < n; ++i)
    HT_CHECK(latency_s[i].size() == n && bandwidth_bytes_per_s[i].size() == n, "link tables: row ", i, " has ",
             latency_s[i].size(), " latencies and ", bandwidth_bytes_per_s[i].size(), " bandwidths; expected ", n,
             " of each (square tables)");
  for (size_t r = 0; r < site.size(); ++r)
    HT_CHECK(site[r] < n, "link tables: rank ", r, " is on site ", site[r], "; expected a site below ", n);
  Links l;
  l.site_ = std::move(site);
  l.lat_ = std::move(latency_s);
  l.bw_ = std::move(bandwidth_bytes_per_s);
  return l;
}

size_t Links::own_site(size_t rank) {
  const size_t s = site_[rank];
  if (std::count(site_.begin(), site_.end(), s) == 1) return s;
  const size_t t = lat_.size();
  for (auto* table : {&lat_, &bw_}) {
    for (auto& row : *table) row.push_back(row[s]);  // [u][t] = [u][s]; [s][t] = [s][s]
    table->push_back((*table)[s]);                   // [t][u] = [s][u]; [t][s] = [s][s]
  }
  site_[rank] = t;
  return t;
}

void Links::set_latency(size_t i, size_t j, double latency_s) {
  HT_CHECK(i != j && i < size() && j < size(), "links: latency from rank ", i, " to rank ", j, " of ", size(),
           "; expected two different ranks of the cluster");
  const size_t a = own_site(i), b = own_site(j);
  lat_[a][b] = latency_s;
}

void Links::set_bandwidth(size_t i, size_t j, double bandwidth_bytes_per_s) {
  HT_CHECK(i != j && i < size() && j < size(), "links: bandwidth from rank ", i, " to rank ", j, " of ", size(),
           "; expected two different ranks of the cluster");
  const size_t a = own_site(i), b = own_site(j);
  bw_[a][b] = bandwidth_bytes_per_s;
}

void Links::add_rank(double latency_s, double bandwidth_bytes_per_s) {
  const size_t t = lat_.size();
  for (auto [table, v] : {std::pair{&lat_, latency_s}, std::pair{&bw_, bandwidth_bytes_per_s}}) {
    for (auto& row : *table) row.push_back(v);
    table->emplace_back(t + 1, v);
  }
  site_.push_back(t);
}

Links Links::of(const std::vector<int>& ranks) const {
  Links l;
  std::vector<size_t> local(lat_.size(), SIZE_MAX), used;  // [site] its new number; [new] the site
  for (int r : ranks) {
    size_t& u = local[site_.at(static_cast<size_t>(r))];
    if (u == SIZE_MAX) {
      u = used.size();
      used.push_back(site_[static_cast<size_t>(r)]);
    }
    l.site_.push_back(u);
  }
  for (auto [to, from] : {std::pair{&l.lat_, &lat_}, std::pair{&l.bw_, &bw_}}) {
    to->assign(used.size(), std::vector<double>(used.size()));
    for (size_t a = 0; a < used.size(); ++a)
      for (size_t b = 0; b < used.size(); ++b) (*to)[a][b] = (*from)[used[a]][used[b]];
  }
  return l;
}

std::vector<int> Links::tiers(const std::vector<int>& ranks) const {
  const size_t m = ranks.size();
  std::vector<size_t> local(lat_.size(), SIZE_MAX), used;  // [site] its number among ranks'; [number] the site
  std::vector<std::vector<size_t>> reps;                   // [number] its first three positions
  std::vector<size_t> number_of(m);                        // [position] its site's number
  for (size_t p = 0; p < m; ++p) {
    const size_t s = site_.at(static_cast<size_t>(ranks[p]));
    if (local[s] == SIZE_MAX) {
      local[s] = used.size();
      used.push_back(s);
      reps.emplace_back();
    }
    number_of[p] = local[s];
    if (reps[local[s]].size() < 3) reps[local[s]].push_back(p);
  }
  for (size_t a = 0; a < used.size(); ++a)
    for (size_t b = a + 1; b < used.size(); ++b)
      if (lat_[used[a]][used[b]] != lat_[used[b]][used[a]] || bw_[used[a]][used[b]] != bw_[used[b]][used[a]]) return {};
  // The representatives' tiers, rank by rank as over every pair: a position joins the
  // tier of the first earlier one whose links to every other representative are its own.
  std::vector<size_t> rep;
  for (const auto& r : reps) rep.insert(rep.end(), r.begin(), r.end());
  std::sort(rep.begin(), rep.end());
  const auto site_at = [&](size_t p) { return used[number_of[p]]; };
  const auto same_row = [&](size_t p, size_t f) {
    const size_t sp = site_at(p), sf = site_at(f);
    for (size_t q : rep) {
      if (q == p || q == f) continue;
      const size_t sq = site_at(q);
      if (lat_[sp][sq] != lat_[sf][sq] || bw_[sp][sq] != bw_[sf][sq]) return false;
    }
    return true;
  };
  std::vector<size_t> firsts;                               // [representative tier] its first position
  std::vector<int> tier_of_number(used.size(), -1);         // [number] its representatives' tier
  for (size_t p : rep) {
    int& t = tier_of_number[number_of[p]];
    if (t >= 0) continue;  // a site's ranks are alike: its first representative decided
    for (size_t k = 0; k < firsts.size() && t < 0; ++k)
      if (same_row(p, firsts[k])) t = static_cast<int>(k);
    if (t < 0) {
      t = static_cast<int>(firsts.size());
      firsts.push_back(p);
    }
  }
  // Numbered in the order of their first position.
  std::vector<int> renumber(firsts.size(), -1), out(m);
  int next = 0;
  for (size_t p = 0; p < m; ++p) {
    int& r = renumber[static_cast<size_t>(tier_of_number[number_of[p]])];
    if (r < 0) r = next++;
    out[p] = r;
  }
  return out;
}

std::vector<std::vector<int>> device_classes(const ClusterModel& cluster) {
  const size_t n = cluster.ranks.size();
  HT_CHECK(cluster.links.size() == n, "device_classes: ", n, " ranks but links of ", cluster.links.size(),
           "; expected the links of every rank");
  std::vector<int> all(n);
  for (size_t r = 0; r < n; ++r) all[r] = static_cast<int>(r);
  const std::vector<int> tier = cluster.links.tiers(all);
  std::vector<std::vector<int>> classes;
  for (size_t r = 0; r < n; ++r) {
    auto it = std::find_if(classes.begin(), classes.end(), [&](const std::vector<int>& k) {
      return interchangeable(cluster, tier, static_cast<size_t>(k.front()), r);
    });
    if (it == classes.end()) classes.push_back({static_cast<int>(r)});
    else it->push_back(static_cast<int>(r));
  }
  return classes;
}

ClusterModel load_cluster_model(const std::string& arg, const std::string& catalogue_path,
                                std::optional<int> world_size) {
  if (arg.rfind("synth:", 0) == 0) {
    ClusterModel c = cluster_from_synth(arg, catalogue_path);
    if (world_size && static_cast<int>(c.ranks.size()) != *world_size)
      throw config::ConfigError("cluster spec \"" + arg + "\": has " + std::to_string(c.ranks.size()) +
                                " ranks but this job has " + std::to_string(*world_size) +
                                "; expected a spec with the job's world size");
    return c;
  }
  const probe::ClusterFingerprint fp = probe::read_cluster(arg, world_size);
  // The catalogue only for cuda ranks without GPU rates, so that a probe file plans where
  // no catalogue is installed.
  std::optional<Catalogue> catalogue;
  for (const auto& r : fp.ranks)
    if (r.device == DeviceKind::cuda && r.rates.gpu_index < 0 && !catalogue) catalogue = read_catalogue(catalogue_path);
  ClusterModel c = cluster_from_probe(fp, catalogue ? &*catalogue : nullptr);
  c.source = "probe " + arg;
  return c;
}

}  // namespace ht::plan
