// Microbenchmarks of the device a rank trains on. Each runs for a time budget and
// reports the median call, not the best: under a CPU quota q a call counts its CPU
// seconds / q, since a throttled rank runs in bursts and what it sustains is what
// training will see.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "nn/block.h"

namespace ht::probe {

struct DeviceRates {
  double sgemm_gflops = 0;          // n x n x n single-precision products
  int64_t sgemm_size = 0;
  double memory_bandwidth_gb_s = 0;  // triad a = b + s * c over arrays beyond the caches
};

DeviceRates measure_device(double seconds_per_benchmark);

struct BlockTiming {
  std::string kind;
  double fwd_bwd_s_per_sample = 0;  // forward + backward of the block alone, per sample
  // The fixed part of one forward + backward call whatever its batch (dispatch, small
  // tensors, cold caches); 0 = none seen (see profile_blocks), or not measured (files
  // from before it was).
  double fwd_bwd_s_per_call = 0;
  // One step of the config's optimiser over the block's parameters; 0 = not measured
  // (files from before it was) or a block without parameters.
  double optimizer_step_s = 0;
};

// Times each Block of `model` alone on batches of `small` and `large` samples, in turn
// (forward, then backward of the output against a gradient of ones, the input's
// gradient too for every block but the first), and fits time = call + samples x
// per-sample, so that a plan giving one rank many more samples than another is costed
// at its own batch (no fixed part where the line would cross zero above no samples);
// then `opt` stepping its parameters: a small model's optimiser state sits in cache, so
// bytes over memory bandwidth would overstate that step several times.
std::vector<BlockTiming> profile_blocks(const nn::Sequential& model, int64_t small, int64_t large,
                                        double seconds_per_block,
                                        const config::OptimizerConfig& opt);

}  // namespace ht::probe
