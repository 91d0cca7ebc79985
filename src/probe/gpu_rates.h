// The rates of the GPU a rank trains on, for the planner's cost model: the engine's fp32
// product and elementwise bandwidth through the rank's Backend (what its ops will get),
// the launch overhead of one small kernel, and cuBLAS's bf16 product (what mixed precision
// could reach). Timed by the CUDA backend module (backend/cuda/cuda_probe.cpp), which
// holds every CUDA call.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/cuda_module.h"
#include "probe/host_info.h"
#include "probe/microbench.h"

namespace ht::probe {

// Size of the GPU's square products (cuda_module.h says why).
inline constexpr int64_t kGpuGemmSize = cuda::kGpuGemmSize;

// `be` is the CUDA backend of GPU `device`. The buffers come from cudaMalloc, outside the
// engine's allocator, so an emulated cap does not hold them and they are freed on return.
// Each figure is the median over rounds of a few calls ended by be.synchronize(), for
// about `seconds` over all four. Throws ht::Error where the build has no CUDA backend or
// its module cannot be loaded, naming why.
// `own`, where given, is this host's entry for that GPU: its free memory and pinned copy
// rates are filled in (the listing leaves them 0, host_info.h).
DeviceRates measure_gpu(Backend& be, int device, double seconds, GpuInfo* own = nullptr);

}  // namespace ht::probe
