#include "probe/gpu_query.h"

#ifdef HETRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ht::probe {

std::vector<GpuInfo> query_gpus(std::string& note) {
  std::vector<GpuInfo> gpus;
#ifdef HETRAIN_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // cudaErrorInsufficientDriver / NoDevice: a machine without a usable GPU.
    note = std::string("no GPU: ") + cudaGetErrorString(err);
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.compute_major = p.major;
    g.compute_minor = p.minor;
    g.sm_count = p.multiProcessorCount;
    g.memory_total = p.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      g.memory_free = free_b;
    gpus.push_back(g);
  }
  if (gpus.empty()) note = "no GPU visible";
#else
  note = "no GPU support in this build (CUDA not found at configure time)";
#endif
  return gpus;
}

}  // namespace ht::probe
