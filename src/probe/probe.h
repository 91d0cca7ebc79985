// `hetrain probe`: every rank fingerprints its hardware, measures its device, and
// optionally profiles a model's blocks on it; then all ranks measure their links.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/block.h"
#include "probe/fingerprint.h"

namespace ht::probe {

// The probe's bound on a wait for another rank. It runs before (or without) a training
// config whose parallel.peer_timeout_s would apply, and its ranks time seconds of their
// own work between exchanges: a rank a minute late has stalled.
inline constexpr double kProbePeerTimeoutS = 60;
// The least bound of the quick probe a job runs before it plans, which otherwise takes
// the job's parallel.peer_timeout_s (a job that allows longer stalls allows them there
// too; one that allows less still gives a throttled rank's benchmarks their time).
inline constexpr double kJobProbeLeastTimeoutS = 30;

struct ProbeOptions {
  bool quick = false;                   // shorter benchmarks: under 5 s on 4 ranks
  std::optional<config::Config> model;  // profile this config's blocks; apply its emulate section
  // Builds `model`'s blocks (required with `model`). The caller supplies it because the
  // model builders sit above the probe (runtime::make_task).
  std::function<nn::Sequential(const config::Config&)> build_model;
  double peer_timeout_s = kProbePeerTimeoutS;  // the bound on each exchange between the ranks
  // The device this rank trains on, chosen by the caller (backend/cuda/device_select.h
  // sits above the probe): null is the CPU. With a CUDA backend, `gpu_index` is its GPU,
  // and the rank's rates are that GPU's (gpu_rates.h); `model` must then be built on it.
  Backend* backend = nullptr;
  int gpu_index = -1;
};

// Collective: every rank of `comm` calls it and gets the whole cluster's fingerprint.
ClusterFingerprint run_probe(comm::Communicator& comm, const ProbeOptions& opts);

// The human table rank 0 prints.
std::string format_cluster(const ClusterFingerprint& c);

// This process's CPU quota from its cgroup (v1 cpu.cfs_quota_us / period, or v2
// cpu.max); fraction 0 when unlimited or unknown.
CpuQuota cgroup_cpu_quota();

}  // namespace ht::probe
