#include "probe/gpu_query.h"

#ifdef HETRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>

#include "core/wall_time.h"
#endif

namespace ht::probe {

#ifdef HETRAIN_HAVE_CUDA
namespace {

// Copy rates between pinned host memory and the current device: the path activations
// take between a GPU rank and the (host-staged) MPI layer. Best of a few 64 MiB copies.
void measure_copies(GpuInfo& g) {
  const size_t bytes = size_t{64} << 20;
  void *host = nullptr, *dev = nullptr;
  if (cudaMallocHost(&host, bytes) != cudaSuccess) return;
  if (cudaMalloc(&dev, bytes) == cudaSuccess) {
    auto rate = [&](cudaMemcpyKind kind) {
      double best = 0;
      for (int i = 0; i < 4; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        bool ok = (kind == cudaMemcpyHostToDevice ? cudaMemcpy(dev, host, bytes, kind)
                                                  : cudaMemcpy(host, dev, bytes, kind)) == cudaSuccess &&
                  cudaDeviceSynchronize() == cudaSuccess;
        double s = seconds_since(t0);
        if (ok && i > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
      }
      return best;
    };
    g.host_to_device_gb_s = rate(cudaMemcpyHostToDevice);
    g.device_to_host_gb_s = rate(cudaMemcpyDeviceToHost);
    cudaFree(dev);
  }
  cudaFreeHost(host);
}

}  // namespace
#endif

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
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      g.memory_free = free_b;
      measure_copies(g);
    }
    gpus.push_back(g);
  }
  if (gpus.empty()) note = "no GPU visible";
#else
  note = "no GPU support in this build (CUDA not found at configure time)";
#endif
  return gpus;
}

}  // namespace ht::probe
