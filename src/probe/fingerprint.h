// The cluster fingerprint: what `hetrain probe --json FILE` writes and what the planner
// (`hetrain plan --cluster FILE`) reads. The schema is in docs/formats.md ("Cluster file").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "probe/host_info.h"
#include "probe/link_matrix.h"
#include "probe/microbench.h"

namespace ht::probe {

inline constexpr const char* kClusterFormat = "hetrain-cluster/1";

// A CFS bandwidth limit (cgroup): `fraction` of a core per `period_s`. A rank that has
// used its quota waits for the next period, so besides running slower it answers a
// message late; the planner's cost model counts that (plan/plan_costs.h).
struct CpuQuota {
  double fraction = 0;  // 0 = no limit
  double period_s = 0;
};

struct RankFingerprint {
  int rank = 0, local_rank = 0;
  HostInfo host;
  DeviceKind device = DeviceKind::cpu;  // what this rank trains on
  int threads = 1;              // compute threads it uses
  DeviceRates rates;
  uint64_t memory_cap = 0;      // engine allocator cap in bytes (0 = none)
  CpuQuota cpu_quota;           // optional in files
  std::vector<BlockTiming> blocks;  // with --model: per-block profile on this device
  // With --model, a CPU rank: the triad's GB/s over arrays of the model's parameter count
  // (microbench.h's triad_gb_s), what copies of its gradient run at; 0 = not measured.
  double gradient_bandwidth_gb_s = 0;
  std::vector<std::string> emulation;  // what about this rank is emulated, in words
};

struct ClusterFingerprint {
  std::vector<RankFingerprint> ranks;
  LinkMatrix links;
  bool links_emulated = false;
  std::string model;  // the config whose blocks were profiled, if any
  // Its blocks' shapes in a word (the caller's; "" where not known), so that a profile is
  // not taken for another model's with blocks of the same kinds.
  std::string model_signature;
};

std::string rank_to_json(const RankFingerprint& r);
RankFingerprint rank_from_json(const std::string& text);
std::string cluster_to_json(const ClusterFingerprint& c);

// Reads and validates a cluster file; errors (config::ConfigError, exit 2) name the file
// and the JSON path. With `expected_world_size`, a file for another world size is refused.
ClusterFingerprint read_cluster(const std::string& path,
                                std::optional<int> expected_world_size = std::nullopt);

}  // namespace ht::probe
