// A probe file's content of two ranks, one with a CPU quota and one on a GPU, with one
// block's timings: the seed of the probe-format tests and of the cluster reader's fuzz corpus.
#pragma once

#include "probe/fingerprint.h"

namespace ht::test_fixtures {

inline probe::ClusterFingerprint two_rank_probe() {
  probe::ClusterFingerprint c;
  for (int i = 0; i < 2; ++i) {
    probe::RankFingerprint r;
    r.rank = r.local_rank = i;  // one host: a local rank each
    r.host.host = "h";
    r.host.cpu_model = "cpu";
    r.host.physical_cores = 2;
    r.host.hardware_threads = 2;
    r.host.memory_total = 1 << 30;
    r.host.memory_available = 1 << 29;
    r.rates = {100.0 / (i + 1), 1024, 10.0};
    r.blocks = {{"dense_relu", 1e-5, 3e-6, 2e-4}};
    if (i == 0) r.cpu_quota = {0.25, 0.01};
    if (i == 1) {
      probe::GpuInfo g;
      g.name = "NVIDIA H200";
      g.compute_major = 9;
      g.sm_count = 132;
      g.memory_total = 141ull << 30;
      g.memory_free = 140ull << 30;
      g.host_to_device_gb_s = 50.5;
      r.host.gpus.push_back(g);
      r.device = DeviceKind::cuda;  // with the rates a GPU rank's probe writes
      r.rates.gpu_index = 0;
      r.rates.bf16_gemm_gflops = 700000;
      r.rates.launch_overhead_s = 4e-6;
    }
    c.ranks.push_back(r);
  }
  c.links.latency_s = {{0, 1e-6}, {1e-6, 0}};
  c.links.bandwidth_bytes_per_s = {{0, 5e9}, {5e9, 0}};
  return c;
}

}  // namespace ht::test_fixtures
