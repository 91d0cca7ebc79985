#include "probe/probe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "comm/emulation.h"
#include "core/error.h"
#include "core/threads.h"
#include "core/units.h"
#include "probe/gpu_rates.h"

namespace ht::probe {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string fmt(const char* f, double v) { return number(f, v); }

}  // namespace

CpuQuota cgroup_cpu_quota() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    // v1: "4:cpu,cpuacct:/path"; v2: "0::/path"
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::stringstream list(controllers);
    std::string c;
    bool cpu = false;
    while (std::getline(list, c, ',')) cpu = cpu || c == "cpu";
    if (cpu) {
      for (const char* root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
        std::string q = read_line(std::string(root) + path + "/cpu.cfs_quota_us");
        std::string p = read_line(std::string(root) + path + "/cpu.cfs_period_us");
        if (!q.empty() && !p.empty() && std::stol(q) > 0 && std::stol(p) > 0)
          return {static_cast<double>(std::stol(q)) / static_cast<double>(std::stol(p)),
                  static_cast<double>(std::stol(p)) * 1e-6};
      }
    } else if (controllers.empty()) {
      std::stringstream max(read_line("/sys/fs/cgroup" + path + "/cpu.max"));
      std::string quota, period;
      if (max >> quota >> period && quota != "max")
        return {std::stod(quota) / std::stod(period), std::stod(period) * 1e-6};
    }
  }
  return {};
}

ClusterFingerprint run_probe(comm::Communicator& comm, const ProbeOptions& opts) {
  RankFingerprint me;
  me.rank = comm.rank();
  me.local_rank = comm.local_rank();
  me.emulation = comm::apply_emulation(opts.model ? opts.model->emulate : config::EmulateConfig{}, comm);
  me.cpu_quota = cgroup_cpu_quota();
  if (me.cpu_quota.fraction > 0)
    me.emulation.insert(me.emulation.begin(), "CPU quota " + fmt("%.2f", me.cpu_quota.fraction) +
                                                  " of a core per " + fmt("%g", me.cpu_quota.period_s * 1e3) +
                                                  " ms (cgroup)");
  me.threads = resolve_thread_count(0, comm.local_size());
  set_thread_count(me.threads);
  me.host = read_host_info();
  Backend& be = opts.backend ? *opts.backend : cpu_backend();
  me.device = be.kind();
  me.memory_cap = be.allocator().cap();
  const bool gpu = me.device == DeviceKind::cuda;
  HT_CHECK(!gpu || opts.gpu_index >= 0, "probe: a CUDA backend (", be.name(), ") without its GPU's index");
  // An emulated memory cap stands for what training may hold. The benchmarks' tensors
  // (matrices of 1024^2, the whole model with one block's gradients and optimiser state
  // at up to 512 samples) are freed before training starts, so they sit outside it: under
  // a 22 MiB cap, a 2.9M-parameter MLP that a two-stage pipeline fits failed its probe.
  // A GPU's benchmark buffers are its own (gpu_rates.cpp); its profile's tensors must be in
  // device memory to time the device, so they count.
  std::optional<Allocator::HostStaging> outside_the_cap;
  if (!gpu) outside_the_cap.emplace();
  GpuInfo* own = nullptr;
  for (GpuInfo& g : me.host.gpus)
    if (gpu && g.index == opts.gpu_index) own = &g;
  me.rates = gpu ? measure_gpu(be, opts.gpu_index, opts.quick ? 0.6 : 2.0, own) : measure_device(opts.quick ? 0.6 : 2.0);
  if (opts.model) {
    HT_CHECK(opts.build_model, "probe: a model to profile was given without a way to build it");
    nn::Sequential model = opts.build_model(*opts.model);
    // Built in host memory, as training builds it; a GPU rank times its blocks where it
    // will train them.
    if (gpu)
      for (const auto& [name, p] : model.named_parameters()) p.rehome(be, false);
    // Per-sample cost depends on the batch (fixed costs per call, caches): time blocks
    // from half to twice the share of the global batch that the ranks' sgemm rates
    // would give this one. Timed over an equal share to all of the batch, a 0.2-quota
    // rank whose share is 15 of 128 spent its budget on two calls of 128 samples (220
    // ms each), and the line through that and 32 samples put 3-10 ms of noise into its
    // fixed part: the CNN's plan predicted its step 12-29% long.
    const auto batch = static_cast<double>(opts.model->train.batch_size);
    double total = 0;
    for (const std::string& rate : comm.allgather(fmt("%.17g", me.rates.sgemm_gflops), comm::Timeout(opts.peer_timeout_s),
                                                         "the probe's sgemm rates")) total += std::stod(rate);
    const double share = batch * me.rates.sgemm_gflops / total;
    const int64_t small = std::clamp<int64_t>(std::llround(share / 2), 1, 256);
    me.blocks = profile_blocks(model, small,
                               std::clamp<int64_t>(std::llround(std::min(2 * share, batch)), small, 512),
                               opts.quick ? 0.2 : 1.0, opts.model->train.optimizer, be);
    // A deadline reduction's copies of the gradient pass over buffers of the model's size,
    // which a cache may hold: the streaming triad charged the MLP's 2.7 MB at a seventh of
    // the speed it ran at (microbench.h). A GPU rank's copies cross to the host, at a
    // bandwidth this does not measure.
    if (!gpu) {
      size_t params = 0;
      for (const auto& [name, p] : model.named_parameters()) params += static_cast<size_t>(p.numel());
      if (params > 0)
        me.gradient_bandwidth_gb_s = params >= kStreamFloats ? me.rates.memory_bandwidth_gb_s
                                                             : triad_gb_s(params, opts.quick ? 0.1 : 0.5);
    }
  }

  ClusterFingerprint c;
  if (opts.model) c.model = opts.model->source_path;
  for (const std::string& text : comm.allgather(rank_to_json(me), comm::Timeout(opts.peer_timeout_s), "the probe's fingerprints"))
    c.ranks.push_back(rank_from_json(text));
  LinkProbeOptions lo;
  lo.round_timeout_s = opts.peer_timeout_s;
  if (opts.quick) {
    lo.pings = 8;
    lo.bulk_bytes = 4 << 20;
  }
  c.links = measure_links(comm, lo);
  for (const comm::LinkEmulation& l : comm.link_emulation()) c.links_emulated = c.links_emulated || l.active();
  return c;
}

std::string format_cluster(const ClusterFingerprint& c) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "%-4s %-12s %-5s %-9s %-9s %-6s %-8s %-10s %-9s %s\n", "rank",
                "host", "local", "cores/thr", "mem GiB", "device", "threads", "sgemm GF/s",
                "mem GB/s", "memory cap / emulation");
  out << line;
  double base = c.ranks.empty() ? 1 : c.ranks[0].rates.sgemm_gflops;
  for (const RankFingerprint& r : c.ranks) {
    std::string notes = r.memory_cap ? fmt("cap %.0f MiB", static_cast<double>(r.memory_cap) / (1 << 20)) : "";
    for (const std::string& n : r.emulation) notes += (notes.empty() ? "" : "; ") + n;
    std::snprintf(line, sizeof line, "%-4d %-12.12s %-5d %-9s %-9.1f %-6s %-8d %-10.1f %-9.1f %s\n", r.rank,
                  r.host.host.c_str(), r.local_rank,
                  (std::to_string(r.host.physical_cores) + "/" + std::to_string(r.host.hardware_threads)).c_str(),
                  static_cast<double>(r.host.memory_total) / (1 << 30), to_string(r.device), r.threads,
                  r.rates.sgemm_gflops, r.rates.memory_bandwidth_gb_s, notes.c_str());
    out << line;
  }
  if (!c.ranks.empty()) {
    out << "\ncpu: " << c.ranks[0].host.cpu_model << "\n";
    for (const RankFingerprint& r : c.ranks) {
      if (r.host.gpus.empty()) {
        if (r.rank == 0) out << "gpus: " << r.host.gpu_note << "\n";
        continue;
      }
      if (r.rates.gpu_index >= 0)
        out << "rank " << r.rank << " trains on gpu " << r.rates.gpu_index << ": fp32 GEMM "
            << fmt("%.1f", r.rates.sgemm_gflops / 1e3) << " TFLOP/s (n = " << r.rates.sgemm_size << "), bf16 GEMM "
            << (r.rates.bf16_gemm_gflops > 0 ? fmt("%.1f TFLOP/s", r.rates.bf16_gemm_gflops / 1e3)
                                             : std::string("not measured (below sm_80)"))
            << ", memory " << fmt("%.0f GB/s", r.rates.memory_bandwidth_gb_s) << ", launch "
            << fmt("%.2f us", r.rates.launch_overhead_s * 1e6) << "\n";
      for (const GpuInfo& g : r.host.gpus) {
        out << "rank " << r.rank << " gpu " << g.index << ": " << g.name << ", sm_" << g.compute_major
            << g.compute_minor << ", " << g.sm_count << " SMs, ";
        // Free memory and copy rates are measured on the rank's own GPU only.
        if (g.index == r.rates.gpu_index)
          out << fmt("%.1f", static_cast<double>(g.memory_free) / (1 << 30)) << " of "
              << fmt("%.1f GiB free", static_cast<double>(g.memory_total) / (1 << 30)) << ", host->device "
              << fmt("%.1f GB/s", g.host_to_device_gb_s) << ", device->host "
              << fmt("%.1f GB/s", g.device_to_host_gb_s) << "\n";
        else
          out << fmt("%.1f GiB", static_cast<double>(g.memory_total) / (1 << 30)) << "\n";
      }
    }
    out << "compute relative to rank 0:";
    for (const RankFingerprint& r : c.ranks) out << " " << fmt("%.2f", r.rates.sgemm_gflops / base);
    out << "\n";
  }
  for (const RankFingerprint& r : c.ranks) {
    if (r.blocks.empty()) continue;
    out << "\nrank " << r.rank << " block profile (forward+backward per sample + per call):";
    for (size_t i = 0; i < r.blocks.size(); ++i)
      out << "\n  " << i << " " << r.blocks[i].kind << " " << fmt("%.1f us", r.blocks[i].fwd_bwd_s_per_sample * 1e6)
          << " + " << fmt("%.1f us", r.blocks[i].fwd_bwd_s_per_call * 1e6);
    if (r.gradient_bandwidth_gb_s > 0)
      out << "\n  copies of the model's gradient (triad over its size) " << fmt("%.1f GB/s", r.gradient_bandwidth_gb_s);
    out << "\n";
  }
  size_t n = c.ranks.size();
  if (n > 1) {
    out << "\nlinks" << (c.links_emulated ? " (EMULATED delays included)" : "")
        << ": one-way latency in us / bandwidth in GB/s\n";
    for (size_t i = 0; i < n; ++i) {
      out << "  " << i << ":";
      for (size_t j = 0; j < n; ++j)
        out << (i == j ? std::string("        -      ")
                       : fmt(" %8.1f", c.links.latency_s[i][j] * 1e6) +
                             fmt(" /%5.2f", c.links.bandwidth_bytes_per_s[i][j] / 1e9));
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace ht::probe
