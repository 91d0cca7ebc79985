// The module's entry point and its device queries (cuda_module.h).
#include "backend/cuda/cuda_module.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "module_interface_hash.h"  // generated: src/backend/meson.build

namespace ht::cuda {

// cuda_probe.cpp.
std::vector<GpuFacts> list_gpus(std::string& note);
GpuTimings time_gpu(Backend& be, int device, double seconds);

namespace {

int device_count(std::string& why_none) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // cudaErrorInsufficientDriver where no driver is loaded, cudaErrorNoDevice where it
    // sees no GPU: both mean no usable GPU, not a failure.
    cudaGetLastError();
    why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return 0;
  }
  if (count == 0) why_none = "cudaGetDeviceCount: 0 devices";
  return count;
}

Backend& backend(int device) { return cuda_backend(device); }

// GPU to GPU without the host. The source's work is finished first (its values are
// computed); the copy runs on the destination's compute stream, after the work already
// issued there (the caching allocator may hand out a block that work still reads), and
// is waited for, so that the source block may be freed and reused at once.
bool peer_copy(Backend& dst_be, void* dst, Backend& src_be, const void* src, size_t bytes) {
  auto* d = dynamic_cast<CudaBackend*>(&dst_be);
  auto* s = dynamic_cast<CudaBackend*>(&src_be);
  if (d == nullptr || s == nullptr) return false;
  s->synchronize();
  const std::string where = s->device_name() + " to " + d->device_name();
  // cudaMemcpyDefault rather than cudaMemcpyPeerAsync, which takes device memory only: a
  // host-staged tensor (pinned, mapped) is a host pointer under unified addressing.
  HT_CUDA_ON(where, cudaSetDevice(d->device()));
  HT_CUDA_ON(where, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->compute_stream()));
  HT_CUDA_ON(where, cudaStreamSynchronize(d->compute_stream()));
  return true;
}

ModuleApi make_api() {
  ModuleApi api;
  api.abi = kModuleAbi;
  api.interface_hash = kModuleInterfaceHash;
  api.device_count = device_count;
  api.backend = backend;
  api.peer_copy = peer_copy;
  api.list_gpus = list_gpus;
  api.time_gpu = time_gpu;
  return api;
}

}  // namespace

}  // namespace ht::cuda

extern "C" const ht::cuda::ModuleApi* hetrain_cuda_module() {
  static const ht::cuda::ModuleApi api = ht::cuda::make_api();
  return &api;
}
