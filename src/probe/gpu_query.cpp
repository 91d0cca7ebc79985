#include "probe/gpu_query.h"

#include "backend/cuda/cuda_module.h"
#include "backend/registry.h"

namespace ht::probe {

std::vector<GpuInfo> query_gpus(std::string& note) {
  std::vector<GpuInfo> gpus;
  const cuda::ModuleApi* api = loaded_cuda_module(note);
  if (api == nullptr) return gpus;
  for (const cuda::GpuFacts& f : api->list_gpus(note)) {
    GpuInfo g;
    g.index = f.index;
    g.name = f.name;
    g.compute_major = f.compute_major;
    g.compute_minor = f.compute_minor;
    g.sm_count = f.sm_count;
    g.memory_total = f.memory_total;
    g.memory_free = f.memory_free;
    g.host_to_device_gb_s = f.host_to_device_gb_s;
    g.device_to_host_gb_s = f.device_to_host_gb_s;
    gpus.push_back(g);
  }
  return gpus;
}

}  // namespace ht::probe
