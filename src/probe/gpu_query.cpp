#include "probe/gpu_query.h"

#include "backend/cuda/cuda_module.h"
#include "backend/registry.h"

namespace ht::probe {

std::vector<GpuInfo> query_gpus(std::string& note) {
  const cuda::ModuleApi* api = loaded_cuda_module(note);
  if (api == nullptr) return {};
  return api->list_gpus(note);
}

}  // namespace ht::probe
