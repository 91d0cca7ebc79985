// The planner's view of a cluster: per-rank speed and memory plus the links, in
// SI units. It comes either from a probe file (measured; what real runs are planned
// from) or from a synthetic spec over the datasheet catalogue configs/devices.json
// (for planning clusters one does not have). The planner sees no difference between
// the two except `measured`, so the same plan code serves both.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/device_kind.h"
#include "probe/fingerprint.h"

namespace ht::plan {

struct DeviceModel {
  std::string id;     // catalogue id ("rtx3060") or the probed device's model name
  std::string name;   // for people: full name, and the host for probed ranks
  DeviceKind kind = DeviceKind::cpu;
  double flops = 0;   // effective fp32 FLOP/s used for planning
  double memory_bytes = 0;
  double memory_bandwidth = 0;  // bytes/s
  // Bytes/s of a pass over buffers of the profiled model's parameter count, where a
  // cache may hold them (the probe's gradient_bandwidth_gb_s); 0: not measured.
  double gradient_bandwidth = 0;
  bool measured = false;        // from a probe, not a datasheet
  // A cgroup CPU limit the probe found: this fraction of a core per period (0 = none).
  double cpu_quota = 0, cpu_quota_period_s = 0;
  // Fixed seconds of one block's forward + backward call, for blocks the profile did not
  // time: a probed GPU's kLaunchesPerBlockCall launches at its measured launch overhead;
  // 0 = the engine's figure for the kind (block_costs.h).
  double call_seconds = 0;
  // Effective FLOP/s of its products under train.precision bf16 (block_costs.h's gemm_rate); 0:
  // none (a CPU, a GPU below sm_80, no figure), and bf16 plans it at `flops`.
  double bf16_flops = 0;
  // Its host (the probe's host name; ranks of one host share its memory) and that host's
  // memory (kUsableMemory of its total), where the model's blocks outside a rank's stage
  // live (memory_fit.h's host_memory); 0 where the cluster gives no host memory (a synth:
  // cluster): unchecked.
  std::string host;
  double host_memory_bytes = 0;
  bool device_in_host = false;  // its device is that memory: a CPU rank without a cap
  // A CPU rank of a host whose CPU ranks ask for more than its cores (each its threads, or
  // its CPU quota where it has one): the kernel's scheduler time-slices them, so a rank's
  // speed moves from one stretch of steps to the next (rebalance.h's ShareTuner).
  bool cores_shared = false;

  // What tables and messages call the device: the id, or the name where there is none.
  const std::string& label() const { return id.empty() ? name : id; }
  // What a pass over the model's gradient runs at (a deadline reduction's copies).
  double copy_bandwidth() const { return gradient_bandwidth > 0 ? gradient_bandwidth : memory_bandwidth; }
};

// The links of a cluster's ranks, one way: latency (s) and bandwidth (bytes/s), 0 from a
// rank to itself. Held by site: every rank has a site id, and the links between two ranks
// are their sites' entry in a table [site][site] (two ranks of one site: [s][s]), so that
// a cluster with structure costs O(ranks + sites^2): a synthetic one is one site (one link
// class for every pair: 4,096 ranks in a few bytes, where dense matrices would be 268 MB). A probe
// file's measured pairs are a site per rank, the table its matrices (dense, O(ranks^2);
// probe files hold at most a few hundred ranks). Setting one pair moves its two ranks to
// sites of their own (their other links copied), so every edit stays exact.
class Links {
 public:
  Links() = default;
  // `ranks` ranks, every pair joined by the same link.
  static Links uniform(size_t ranks, double latency_s, double bandwidth_bytes_per_s);
  // Dense [i][j] matrices (square, of one size): a site per rank.
  static Links from_matrices(std::vector<std::vector<double>> latency_s,
                             std::vector<std::vector<double>> bandwidth_bytes_per_s);
  // [rank] its site, and the tables [site][site] (square, covering every site named).
  static Links by_site(std::vector<size_t> site, std::vector<std::vector<double>> latency_s,
                       std::vector<std::vector<double>> bandwidth_bytes_per_s);

  size_t size() const { return site_.size(); }
  double latency(size_t i, size_t j) const { return i == j ? 0 : lat_[site_[i]][site_[j]]; }
  double bandwidth(size_t i, size_t j) const { return i == j ? 0 : bw_[site_[i]][site_[j]]; }
  // One way, i to j (i != j).
  void set_latency(size_t i, size_t j, double latency_s);
  void set_bandwidth(size_t i, size_t j, double bandwidth_bytes_per_s);
  // A new last rank, linked to and from every other rank by these figures.
  void add_rank(double latency_s, double bandwidth_bytes_per_s);
  // The links among `ranks` alone, in that order.
  Links of(const std::vector<int>& ranks) const;

  // [rank] its site, and the number of sites (some possibly without a rank).
  const std::vector<size_t>& sites() const { return site_; }
  size_t site_count() const { return lat_.size(); }
  // Link tiers of `ranks` (positions into it): ranks whose links are interchangeable, the
  // same latency and bandwidth to and from every third rank of `ranks` and the same both
  // ways between the two, numbered in the order of their first position; empty when the
  // links among `ranks` are not symmetric (then no two ranks are compared alike). Found
  // over sites: two ranks of one site are always alike, and two sites compare as up to
  // three ranks of each would (whether a site holds a third rank beside the two is all its
  // size tells): O(ranks + sites^2 x tiers).
  std::vector<int> tiers(const std::vector<int>& ranks) const;

 private:
  size_t own_site(size_t rank);  // moves `rank` to a site of its own, its links as they were
  std::vector<size_t> site_;
  std::vector<std::vector<double>> lat_, bw_;  // [site][site]
};

struct ClusterModel {
  std::vector<DeviceModel> ranks;
  Links links;
  std::string source;  // "probe FILE" or the "synth:..." spec
  // Optional: [rank][block] measured forward + backward seconds per sample from
  // `probe --model`; empty otherwise.
  std::vector<std::vector<double>> block_seconds;
  std::string model_signature;  // the profiled model's (probe::ClusterFingerprint), "" where not known
  // Optional, alongside: [rank][block] measured seconds of one optimiser step over the
  // block's parameters (0 where not measured), and the fixed seconds of one forward +
  // backward call (0 where not measured).
  std::vector<std::vector<double>> block_step_seconds;
  std::vector<std::vector<double>> block_call_seconds;
};

// Datasheet catalogue entries, as read from configs/devices.json.
struct CatalogueDevice {
  std::string id, name;
  DeviceKind kind = DeviceKind::cpu;
  double fp32_tflops = 0, tf32_tflops = 0, bf16_tflops = 0;
  double memory_gb = 0, memory_bandwidth_gb_s = 0;
  std::string host_link_kind;
  double host_link_gb_s = 0;
  double efficiency = 0;  // the factor for its kind
  std::string source;     // where the figures come from (optional in the file)
};
struct LinkClass {
  std::string id;
  double latency_s = 0, bandwidth_bytes_per_s = 0;
};
struct Catalogue {
  std::vector<CatalogueDevice> devices;  // file order
  std::vector<LinkClass> links;          // file order
};

// The shipped catalogue: $HETRAIN_DEVICES when set, else configs/devices.json of the
// source tree the binary was built from, else the installed copy.
std::string default_catalogue_path();

// Reads and validates the catalogue; errors (config::ConfigError) name the file and
// the JSON path.
Catalogue read_catalogue(const std::string& path);

// The share of a device's memory (or of an allocator cap) that plans made from a probe
// may fill: a step also holds small tensors that the memory model does not count (a
// micro-batch's input, the gradient sent back, the loss), and a pipeline planned at
// 43.9 of a 44 MiB cap ran out of memory by a few KiB in its first step. It is within the
// cap less the allocator's allowance for blocks larger than their requests (a 64th,
// Allocator::slack_allowance), so such blocks cannot take a plan past the cap.
inline constexpr double kUsableMemory = 0.98;
static_assert(kUsableMemory <= 1 - 1.0 / 64);

// Kernel launches in one block's forward + backward call on a GPU, for the fixed part of a
// call the profile did not time: a dense block with its activation launches about 8 (a
// product and a bias add forward, two products, a bias reduction and the activation's
// backward), a transformer block several times more. 12 at 5 us a launch was the 60 us
// guess of block_costs.h; the count stays an estimate, the launch overhead is measured.
inline constexpr double kLaunchesPerBlockCall = 12;

// Measured figures as they are, except three. A device's memory is kUsableMemory of it: a
// GPU rank with probed rates (rates.gpu_index set) has its GPU's free memory as its own
// process saw it (after its CUDA context), others their GPU's or host's total or the
// engine's cap. A cuda rank from a file without GPU rates recorded its host's CPU rates:
// with `catalogue`, a datasheet entry matching its GPU (match_catalogue) gives its flops
// and bandwidth as a synthetic cluster's, without, the recorded figures stand. And single
// link pairs far worse than both ranks' typical (median) links are bounded by the slower
// rank's typical link: with 4 ranks throttled on 2 cores, one ping-pong can catch both
// ends descheduled and read 1 ms where every other pair of those ranks reads 1 us.
// The rate a GPU rank's bf16 products run at: the probed bf16 GEMM (`probed_gflops`, the
// cluster file's bf16_gemm_gflops; 0: not measured or below sm_80), else the datasheet's
// bf16 dense peak x its efficiency (`sheet`, may be null); 0 where neither gives one.
double bf16_gemm_flops(double probed_gflops, const CatalogueDevice* sheet);

ClusterModel cluster_from_probe(const probe::ClusterFingerprint& fp, const Catalogue* catalogue = nullptr);

// The catalogue's cuda entry for a GPU the runtime names (cudaDeviceProp::name, e.g.
// "NVIDIA A100-SXM4-80GB"): entries whose id's family (the id up to its first '-', e.g.
// "a100") appears in the name, letters and digits only, case ignored; of those, the one
// whose memory is nearest `memory_bytes`. Null when none matches.
const CatalogueDevice* match_catalogue(const Catalogue& catalogue, const std::string& gpu_name,
                                       double memory_bytes);

// "synth:COUNTxID,COUNTxID,...[@LINKCLASS]": ranks in spec order, every pair joined by
// one link class ("pcie" when none is given). flops = fp32 peak x efficiency.
// Errors (config::ConfigError) name the offending token and list the known choices.
ClusterModel cluster_from_synth(const std::string& spec, const std::string& catalogue_path);

// Device classes: sets of ranks the planner may swap for one another without changing a
// figure it computes. A rank joins the class of the first lower rank it matches in every
// DeviceModel field, in its profile rows (block_seconds, block_step_seconds,
// block_call_seconds) and in its links: the same latency and bandwidth to and from every
// third rank, and the same both ways between the two (their link tier). Classes are
// listed in the order of their lowest rank, ranks ascending. O(ranks x classes) over the
// link tiers (Links::tiers) where the links are symmetric; pairwise otherwise,
// O(ranks^2 x classes).
std::vector<std::vector<int>> device_classes(const ClusterModel& cluster);

// "synth:..." or the path of a `hetrain probe --json` file. With `world_size`, a
// cluster of another size is refused.
ClusterModel load_cluster_model(const std::string& arg, const std::string& catalogue_path,
                                std::optional<int> world_size = std::nullopt);

}  // namespace ht::plan
