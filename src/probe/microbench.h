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
  // n x n x n single-precision products through the rank's Backend::gemm: OpenBLAS on a
  // CPU; on a GPU cuBLAS as the engine calls it (fp32 math, no TF32).
  double sgemm_gflops = 0;
  int64_t sgemm_size = 0;
  // CPU: triad a = b + s * c over arrays beyond the caches. GPU: the backend's add of two
  // device arrays into a third (three arrays streamed), the path elementwise ops take.
  double memory_bandwidth_gb_s = 0;
  // GPU ranks only; 0 = not measured (a CPU rank, or a file from before GPU rates).
  int gpu_index = -1;              // the GPU it trains on: an index into host.gpus
  double bf16_gemm_gflops = 0;     // cuBLAS bf16 x bf16 -> fp32 at sgemm_size; 0 below sm_80
  double launch_overhead_s = 0;    // seconds per launch, back to back, of a one-element kernel
};

// The CPU's rates (the backend's gemm on this host, the triad).
DeviceRates measure_device(double seconds_per_benchmark);

// The streaming triad's arrays: 3 x 32 MiB, far beyond any last-level cache.
inline constexpr size_t kStreamFloats = size_t{8} << 20;

// GB/s of the triad z = x + 0.5 y over three arrays of `floats` floats each (three
// passes a call), the median call over `seconds`. Arrays that fit a cache run at its
// speed: over a 2.7 MB gradient's size, 64 GB/s on a 2-core AMD EPYC whose streaming
// triad ran at 19 (four processes at once: 64 against 9).
double triad_gb_s(size_t floats, double seconds);

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
// Every block runs on `be`, where its parameters must already live (an error names the
// first that does not); each timed call ends with be.synchronize(), so a GPU's calls are
// timed to their end, not to their launch.
std::vector<BlockTiming> profile_blocks(const nn::Sequential& model, int64_t small, int64_t large,
                                        double seconds_per_block,
                                        const config::OptimizerConfig& opt,
                                        Backend& be = cpu_backend());

}  // namespace ht::probe
