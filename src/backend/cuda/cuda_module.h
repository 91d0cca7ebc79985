// The CUDA backend module's interface: what hetrain-cuda.so offers the executable that
// loads it (backend/registry.h, cuda_module()).
//
// The module holds everything that links the CUDA runtime, cuBLAS and cuDNN: the backend
// (cuda_backend.h), the GPU-to-GPU copy and the probe's GPU queries and timings
// (cuda_probe.cpp). Loading it costs a process about 225 MB resident (the dynamic
// loader's relocations of those libraries), so the executable loads it the first time a
// GPU is asked for, and a CPU rank never pays it. The module leaves every other symbol
// (the backend interface, the allocator, the registry, core) undefined, to be bound to
// the executable's own when it is loaded: one registry, one CPU backend, in the
// executable, which exports its symbols for that (-rdynamic, src/backend/cuda/meson.build).
//
// Its one entry point, hetrain_cuda_module(), returns a table whose first field is the
// interface's version; the loader refuses a module of another version before reading
// anything else, then one whose hash of the headers it binds to (module_interface_hash.h,
// made by the build) is not the executable's: a module and an executable from different
// states of those headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ht::cuda {

// Bumped whenever ModuleApi changes; a change of a type it names, or of any header the
// module binds to, changes the interface hash as well.
inline constexpr int kModuleAbi = 3;
// The module's file name, looked for beside the running executable.
inline constexpr const char* kModuleFile = "hetrain-cuda.so";
// The environment variable naming another path for it.
inline constexpr const char* kModuleEnv = "HETRAIN_CUDA_MODULE";

// One visible GPU, as the probe lists it (probe::GpuInfo is this type).
struct GpuFacts {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int sm_count = 0;
  uint64_t memory_total = 0;
  // Measured by the rank that trains on this GPU only (time_gpu), 0 for the others: opening
  // a context on every GPU of the node from every rank held a context per rank on each.
  uint64_t memory_free = 0;
  double host_to_device_gb_s = 0, device_to_host_gb_s = 0;  // pinned 64 MiB copies
};

// Size of the probe's square products on a GPU: 1024^3 (the CPU's size) takes tens of
// microseconds on a large GPU, so it times launches and tails more than the arithmetic
// units.
inline constexpr int64_t kGpuGemmSize = 4096;

// A GPU's rates as the probe times them (probe::DeviceRates, probe/gpu_rates.h).
struct GpuTimings {
  int64_t sgemm_size = 0;
  double sgemm_gflops = 0;
  double memory_bandwidth_gb_s = 0;
  double launch_overhead_s = 0;
  double bf16_gemm_gflops = 0;  // 0 below sm_80
  // The GPU's free memory before the benchmarks, and its pinned copy rates (GpuFacts').
  uint64_t memory_free = 0;
  double host_to_device_gb_s = 0, device_to_host_gb_s = 0;
};

struct ModuleApi {
  int abi = 0;  // kModuleAbi of the module's build; stays the first field
  uint64_t interface_hash = 0;  // kModuleInterfaceHash of the module's build
  // GPUs the CUDA runtime sees; 0 with `why_none` set where none is usable (no driver,
  // no device).
  int (*device_count)(std::string& why_none) = nullptr;
  // The process's backend of GPU `device`, made on first use and kept to the end.
  Backend& (*backend)(int device) = nullptr;
  // GPU to GPU without the host; false where either backend is not the module's.
  bool (*peer_copy)(Backend& dst_backend, void* dst, Backend& src_backend, const void* src,
                    size_t bytes) = nullptr;
  // The visible GPUs with their memory and host copy rates; empty with `note` set where
  // there are none.
  std::vector<GpuFacts> (*list_gpus)(std::string& note) = nullptr;
  // The probe's timings of GPU `device` through `be`, its backend, for about `seconds`.
  GpuTimings (*time_gpu)(Backend& be, int device, double seconds) = nullptr;
};

}  // namespace ht::cuda

// The module's entry point (cuda_module.cpp). The executable finds it by dlsym, or
// linked in (the cuda test suite links the backend into its program).
extern "C" const ht::cuda::ModuleApi* hetrain_cuda_module();
