// The rates of the GPU a rank trains on, for the planner's cost model: the engine's fp32
// product and elementwise bandwidth through the rank's Backend (what its ops will get),
// the launch overhead of one small kernel, and cuBLAS's bf16 product (what mixed precision
// could reach; the engine has no bf16 op yet).
#pragma once

#include "backend/backend.h"
#include "probe/microbench.h"

namespace ht::probe {

// Size of the GPU's square products: 1024^3 (the CPU's size) takes tens of microseconds on
// a large GPU, so it times launches and tails more than the arithmetic units.
inline constexpr int64_t kGpuGemmSize = 4096;

// `be` is the CUDA backend of GPU `device`. The buffers come from cudaMalloc, outside the
// engine's allocator, so an emulated cap does not hold them and they are freed on return.
// Each figure is the median over rounds of a few calls ended by be.synchronize(), for
// about `seconds` over all four. Throws ht::Error on a build without CUDA, naming it.
DeviceRates measure_gpu(Backend& be, int device, double seconds);

}  // namespace ht::probe
