// The run configuration: one JSON file with sections model, data, train, checkpoint,
// parallel, run and (optionally) emulate. load_config() validates everything before any work starts; every error
// names the JSON path, the value and what was expected (ConfigError, exit code 2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ht::config {

// A rejected config. The CLI prints it and exits with status 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

struct ModelConfig {
  std::string type;  // "mlp" | "cnn" | "gpt"
  // mlp
  std::vector<int64_t> hidden{512, 512};
  // cnn
  std::vector<int64_t> channels{32, 64};
  int64_t fc_hidden = 128;
  // gpt
  int64_t context = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t d_model = 128;
  float dropout = 0.f;
};

struct DataConfig {
  std::string dataset;  // "fashion_mnist" | "text"
  // fashion_mnist: directory holding the four gzipped IDX files
  std::string dir = "/usr/share/datasets/fashion-mnist";
  // text: files, or directories whose regular files are all read (sorted by name),
  // skipping names that end in one of skip_suffixes
  std::vector<std::string> paths;
  std::vector<std::string> skip_suffixes;
  double validation_fraction = 0.1;  // text: tail share of the corpus held out
};

struct OptimizerConfig {
  std::string type = "adamw";  // "adamw" | "sgd"
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
  float momentum = 0.f;                             // sgd
  bool nesterov = false;                            // sgd
  float weight_decay = 0.f;
};

struct ScheduleConfig {
  std::string type = "constant";  // "constant" | "cosine"
  int64_t warmup_steps = 0;       // linear warmup from 0 (cosine)
  float min_lr = 0.f;             // cosine floor
};

// train.loss_scale: the dynamic loss scale of runtime/loss_scale.h. mode "auto" scales
// under precision fp16 only; "dynamic" under any precision (under fp32 it changes no
// bit of the run while nothing overflows: the scales are powers of two, so scaling and
// unscaling are exact); "none" never (refused under fp16, whose gradients would flush
// to zero). The scale halves after a step whose gradients overflowed and doubles after
// growth_interval clean steps, within [min, max].
struct LossScaleSettings {
  static constexpr int kMaxLog2 = 64;  // initial, min and max: powers of two from 2^-64 to 2^64
  std::string mode = "auto";
  double initial = 65536;
  int64_t growth_interval = 2000;
  double min = 1;
  double max = 16777216;
};

struct TrainConfig {
  // The most steps a run may take: the checkpoint keeps the optimiser's step count as an int32.
  static constexpr int64_t kMaxSteps = 2147483647;
  // Exactly one of steps / epochs is given; epochs become steps from the dataset
  // size (resolved_steps, filled in once the data is known).
  std::optional<int64_t> steps;
  std::optional<double> epochs;
  int64_t batch_size = 128;    // global batch per optimiser step
  int64_t micro_batches = 1;   // gradient accumulation: batch_size splits into this many
  uint64_t seed = 1;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  float grad_clip = 0.f;       // global L2 norm; 0 = off
  int64_t eval_every = 0;      // steps; 0 = only at the end
  int64_t eval_batch_size = 1000;
  int64_t eval_max_samples = 0;  // 0 = the whole evaluation set
  int64_t log_every = 50;      // steps between metrics records and log lines
  // The products' arithmetic: "fp32" | "bf16" (bf16 tensor cores, fp32 accumulation and
  // master weights; a CUDA device of sm_80+) | "fp16" (fp16 tensor cores, fp32
  // accumulation and master weights, with a dynamic loss scale; a CUDA device). Checked
  // against the run's device when it is selected (backend/cuda/device_select.h).
  std::string precision = "fp32";
  LossScaleSettings loss_scale;
};

// Whether the run scales its loss dynamically: mode "dynamic", or "auto" under fp16.
bool dynamic_loss_scale(const TrainConfig& t);

// The samples of one evaluation batch: eval_batch_size, at most eval_max_samples.
int64_t eval_batch(const TrainConfig& t);

struct CheckpointConfig {
  int64_t every = 0;  // steps; 0 = only at the end
  int64_t keep = 3;   // newest checkpoints kept
};

// Emulation of a heterogeneous cluster on one machine (labelled as emulation wherever
// it shows). Per rank: an added link latency and a bandwidth limit on every message the
// rank sends or receives, and a cap on the engine's device memory.
struct RankEmulation {
  // The what-if's bounds for a link (plan/what_if.h): 1,000 s; a byte a second to 1 PB/s.
  static constexpr double kMaxLatencyMs = 1e6, kMinBandwidthMbS = 1e-6, kMaxBandwidthMbS = 1e9;
  int64_t rank = 0;
  double latency_ms = 0;
  double bandwidth_mb_s = 0;  // megabytes (1e6) per second; 0 = unlimited
  int64_t memory_cap_mb = 0;  // MiB; 0 = no cap
};

struct EmulateConfig {
  std::vector<RankEmulation> ranks;
};

// parallel.strategy, what the config asks of the planner. automatic ("auto"): the
// planner's fastest layout (data, pipeline or hybrid); data: data parallel only;
// pipeline: one pipeline over all ranks; equal: the DDP baseline (equal batches, whole
// model per rank), kept for comparison.
enum class ParallelStrategy { automatic, data, pipeline, equal };
const char* to_string(ParallelStrategy s);  // "auto", "data", "pipeline", "equal"
std::vector<std::string> parallel_strategy_names();
std::optional<ParallelStrategy> parse_parallel_strategy(std::string_view s);

// parallel.sync, how the replicas of a step agree. sync: every contribution, every step
// (exact; the reference). deadline: a step's reduction closes when its budget expires,
// leaving out what has not arrived. local: groups of ranks step on their own for
// local_steps inner steps, then join an outer step (DiLoCo).
enum class SyncPolicy { sync, deadline, local };
const char* to_string(SyncPolicy s);  // "sync", "deadline", "local"
std::vector<std::string> sync_policy_names();
std::optional<SyncPolicy> parse_sync_policy(std::string_view s);

// The most a setting that counts steps may be (parallel.local_steps, outer_delay,
// max_staleness; the guard's window and counts): a round's H and D are held in 32 bits,
// and a count is added to a step.
inline constexpr int64_t kMaxStepCount = 1'000'000'000;

// How the work is split over the ranks of an mpirun job.
struct ParallelConfig {
  ParallelStrategy strategy = ParallelStrategy::automatic;
  // Every this many steps a job that planned for itself compares what each rank measured
  // with the plan and re-splits the batch over the replicas when that is predicted to
  // be faster (not under equal, never changing the layout); 0 = never.
  int64_t rebalance_every = 10;
  // Not given: the planner chooses (auto may take local for ranks a synchronous plan
  // would leave idle or starved); given, it is kept. sync_policy() reads it with the default.
  std::optional<SyncPolicy> sync;
  SyncPolicy sync_policy() const { return sync.value_or(SyncPolicy::sync); }
  // The longest any rank waits on a peer before it ends the job naming that peer. Long
  // enough for rank 0's evaluation and checkpoint writes between steps, which its peers
  // wait through; short enough that a dead rank does not hold a job for long.
  double peer_timeout_s = 300;
  static constexpr double kMaxPeerTimeoutS = 7 * 24 * 3600.0;
  // deadline: a step's budget is the predicted step x (1 + deadline_slack); a
  // contribution later than that is dropped (max_staleness 0) or applied up to
  // max_staleness steps late.
  double deadline_slack = 0.5;
  int64_t max_staleness = 0;
  // local: steps per round (0: chosen from the measured link and compute times), and
  // the outer optimiser (Nesterov momentum over the sample-weighted mean of the groups'
  // deltas). The mean of groups that each took some of the round's steps is a shorter
  // move than those steps taken in a row, hence a learning rate above 1; much above it
  // the step extrapolates each group's few steps too far, early in training most (the
  // measurements behind the defaults: docs/architecture.md, "Accuracy per sample").
  int64_t local_steps = 0;
  // local: the job step of the next round after which a round's outer step lands (0:
  // at that round's end; later where the exchange needs more steps; plan/local_plan.h's
  // apply_outer_delay). Sooner leaves the groups' steps less far behind the others'
  // progress, but a late group less slack before the others wait on it.
  int64_t outer_delay = 0;
  double outer_lr = 1.5;
  double outer_momentum = 0;
};

// The bad-node guard: a contribution with a non-finite value, or a gradient norm above
// norm_ratio x the median of its rank's last `window` norms (norm_ratio 0: no norm
// check), is left out of its step. A rank left out quarantine_after times within
// `window` steps is quarantined (its contributions left out) for quarantine_steps steps.
// norm_ratio 100: a healthy block group of a few samples spikes past 10x its median
// early in a transformer's training (docs/faults.md); garbage of 1000x is still caught.
struct GuardConfig {
  double norm_ratio = 100;
  int64_t window = 20;
  int64_t quarantine_after = 3;
  int64_t quarantine_steps = 50;
};

struct RunConfig {
  std::string dir;  // default: runs/<config file stem>
};

struct Config {
  std::string source_path;  // the file it was read from
  std::string name;         // the file's stem, e.g. "fashion_mnist_mlp"
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  GuardConfig guard;
  RunConfig run;
  EmulateConfig emulate;
  // The device the run computes on: "cpu", "cuda" (the GPU of the process's MPI local
  // rank), "cuda:N" or "auto" (a GPU where one is usable, else the CPU); the forms are
  // core/device_request.h's, and backend/cuda/device_select.h chooses from them.
  std::string device = "cpu";
  // A list instead (`"device": ["cuda", "cpu", "cpu"]`): one device per world rank, in
  // world rank order, for a job of GPU and CPU ranks. Empty: `device` for every rank.
  std::vector<std::string> rank_devices;
};

// The device text of world rank `rank` in a job of `world_size` ranks: the config's list
// entry where it lists one per rank, else its one device. Throws ConfigError (at
// "device") where the list's length is not the world size.
std::string device_of_rank(const Config& c, int rank, int world_size);

// Reads and validates. Throws ConfigError naming the JSON path on any problem.
Config load_config(const std::string& path);
// Validates an already parsed document (text form, for tests and tools).
Config parse_config(const std::string& json_text, const std::string& source_path);
// The fully resolved config (defaults filled in) as JSON, for the run directory.
std::string to_json(const Config& c);
// 8 hex digits of CRC-32 over to_json(c) without run.dir: the ranks of a job compare it
// to be sure they train the same thing.
std::string config_hash(const Config& c);
// The same over what a plan depends on (model, dataset, batch and micro-batches,
// optimiser type, parallel.strategy and parallel.sync): a plan file records it, and training with a
// plan checks it, so --steps or a new learning rate does not invalidate a plan.
std::string plan_hash(const Config& c);

}  // namespace ht::config
