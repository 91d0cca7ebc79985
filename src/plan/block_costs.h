// The cost model that feeds the planner: per rank and block, forward + backward seconds
// per sample; per block, the bytes of weight state and of activations per sample.
// Principle: measure, don't assume. A rank's measured profile (`probe --model`, in
// ClusterModel::block_seconds) is used when there is one; otherwise the time is
// modelled as 3 x forward FLOPs / the device's FLOP/s, since a backward pass costs about
// twice the forward (gradients for the inputs and for the weights), so forward +
// backward ~ 3 x forward FLOPs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "nn/block.h"
#include "nn/block_shape.h"
#include "plan/cluster_model.h"

namespace ht::plan {

// Bytes per parameter: fp32 weights and fp32 gradients.
inline constexpr double kWeightBytesPerParam = 4;
inline constexpr double kGradBytesPerParam = 4;
// Forward + backward ~ 3 x forward FLOPs (the FLOPs / rate model).
inline constexpr double kTrainFlopsPerForwardFlop = 3;
// Bytes an optimiser step streams per parameter besides its state (read the weight and
// the gradient, write the weight); the state is read and written once each.
inline constexpr double kStepBytesPerParam = 12;

// Fixed cost of one block's forward + backward call regardless of the batch (dispatch,
// kernel launches, small-tensor bookkeeping) where the profile did not measure it:
// conservative figures for this engine, so that the search does not cut a batch into
// micro-batches of one sample where the model says it would be free.
inline constexpr double kCallSecondsCpu = 20e-6;
inline constexpr double kCallSecondsCuda = 60e-6;

inline constexpr const char* kSourceMeasured = "measured profile";
inline constexpr const char* kSourceModelled = "FLOPs / rate";

struct BlockCosts {
  std::vector<std::vector<double>> seconds_per_sample;  // [rank][block] forward + backward
  std::vector<std::vector<double>> call_seconds;        // [rank][block] fixed part per call
  // [rank][block] one optimiser step over the block's parameters: measured when the
  // profile has it, else bytes streamed / memory bandwidth (0 without a bandwidth).
  std::vector<std::vector<double>> step_seconds;
  std::vector<double> flops;             // [block] forward FLOPs per sample
  std::vector<double> params;            // [block] parameter count
  double optimizer_bytes_per_param = 0;  // see optimizer_state_bytes_per_param
  std::vector<double> state_bytes;       // [block] params + grads + optimiser state
  std::vector<double> activation_bytes;  // [block] per sample
  // [block] per sample: the transients while it runs (nn::Block's workspace), the last
  // block's with the loss's (it keeps the logits, one log-sum-exp and loss a prediction).
  // Empty: none (hand-built costs).
  std::vector<double> workspace_bytes;
  // Rank 0's evaluation of the whole model between steps (runtime/trainer_evaluation.cpp):
  // the bytes a sample adds to its fullest moment (nn/cost_model.h), and its batch,
  // train.eval_batch_size at most eval_max_samples (0: not checked; plan/memory_fit.h).
  double eval_bytes_per_sample = 0;
  double eval_fused_bytes_per_sample = 0;  // on a GPU rank 0 (nn::Block's)
  int64_t eval_batch = 0;
  // Beside them, whatever the batch: the allocator rounds each tensor up to 64 bytes
  // (backend/allocator.cpp), and no block holds 16 at once.
  static constexpr double kEvalFixedBytes = 16 * 64;
  std::vector<double> input_bytes;       // [block] per sample: what it receives (and what
                                         // recomputation keeps of it)
  std::vector<double> output_bytes;      // [block] per sample: what it hands to the next
  std::vector<std::string> source;       // [rank] "measured profile" or "FLOPs / rate"
  // [rank] what a step costs the rank besides its blocks: the CPU its communication takes
  // from its quota (measured while training, see calibrated_costs; empty or 0 before).
  std::vector<double> comm_overhead_seconds;
};

// costs.comm_overhead_seconds[rank], 0 where not measured.
inline double comm_overhead_seconds(const BlockCosts& costs, size_t rank) {
  return rank < costs.comm_overhead_seconds.size() ? costs.comm_overhead_seconds[rank] : 0;
}

// Predictions a sample makes: the logits' values over the classes (1 for a label, T for
// a sequence).
double predictions_per_sample(const nn::ModelShape& model);

// The bytes a sample adds to rank 0's evaluation at its fullest moment (BlockCosts'
// eval_bytes_per_sample), as the CPU runs attention or, with `fused_attention`, as a GPU
// does (nn::Block's eval_fused_bytes_per_sample). 0 for an empty model.
double eval_bytes_per_sample(const nn::ModelShape& model, bool fused_attention);

// Optimiser state bytes per parameter: AdamW 8 (two fp32 moments), SGD with momentum 4
// (one buffer), SGD without 0. An unknown type is an ht::Error.
double optimizer_state_bytes_per_param(const config::OptimizerConfig& opt);

// Per rank: cluster.block_seconds[rank] when present (a non-empty row), else
// 3 x flops_per_sample / ranks[rank].flops; likewise for the optimiser step, per block.
// Reads only the model's shapes, so a model described from its config (no weights) is
// planned as its built Blocks would be. Errors (ht::Error): a measured row whose block
// count differs from the model's (naming both counts); a modelled rank whose flops is
// not positive; more profile rows than ranks.
// `precision` is train.precision: under "bf16" a modelled GPU rank runs at gemm_rate.
BlockCosts block_costs(const nn::ModelShape& model, const ClusterModel& cluster,
                       const config::OptimizerConfig& opt, std::string_view precision = "fp32");
// The same for a built model: block_costs(nn::shape_of(model), ...).
BlockCosts block_costs(const nn::Sequential& model, const ClusterModel& cluster,
                       const config::OptimizerConfig& opt, std::string_view precision = "fp32");

// The FLOP/s a rank's modelled blocks run at under train.precision `precision`: its
// bf16_flops for a GPU rank under "bf16" that has one (the probed bf16 GEMM, or the
// datasheet's bf16 peak x efficiency), else its fp32 flops. A block's FLOPs are its
// products' (nn/cost_model.h), which bf16 runs on tensor cores; the rest of a step stays
// fp32 and is not in the FLOPs, and the fused attention kernel, fp32 in every mode, is
// priced at this rate too (an optimistic share of a long-context transformer block). A
// measured profile is fp32's (the probe times fp32) and stands as measured. "fp16" is
// priced at the fp32 rate: the probe times no fp16 product, so its gain is not assumed.
double gemm_rate(const DeviceModel& dev, std::string_view precision);

// Samples per second of one replica holding the whole model on `rank`:
// 1 / sum of the rank's seconds_per_sample.
double replica_samples_per_s(const BlockCosts& costs, int rank);

}  // namespace ht::plan
