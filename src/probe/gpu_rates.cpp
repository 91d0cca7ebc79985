#include "probe/gpu_rates.h"

#include <string>

#include "backend/registry.h"
#include "core/error.h"

namespace ht::probe {

DeviceRates measure_gpu(Backend& be, int device, double seconds, GpuInfo* own) {
  HT_CHECK(be.kind() == DeviceKind::cuda, "probe: measure_gpu was given the ", be.name(),
           " backend; expected a CUDA backend");
  std::string why;
  const cuda::ModuleApi* api = cuda_module(why);
  if (api == nullptr)
    fail("probe: GPU ", device, " on ", be.name(), ": ", why, "; expected the CUDA backend to probe a GPU");
  const cuda::GpuTimings t = api->time_gpu(be, device, seconds);
  DeviceRates r;
  r.gpu_index = device;
  r.sgemm_size = t.sgemm_size;
  r.sgemm_gflops = t.sgemm_gflops;
  r.memory_bandwidth_gb_s = t.memory_bandwidth_gb_s;
  r.launch_overhead_s = t.launch_overhead_s;
  r.bf16_gemm_gflops = t.bf16_gemm_gflops;
  if (own != nullptr) {
    own->memory_free = t.memory_free;
    own->host_to_device_gb_s = t.host_to_device_gb_s;
    own->device_to_host_gb_s = t.device_to_host_gb_s;
  }
  return r;
}

}  // namespace ht::probe
