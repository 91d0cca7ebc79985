// GPUs visible to this process, through the CUDA runtime when the build has CUDA.
#pragma once

#include <string>
#include <vector>

#include "probe/host_info.h"

namespace ht::probe {

// Empty when the build has no CUDA, no driver is loaded or no device is visible;
// `note` then says which.
std::vector<GpuInfo> query_gpus(std::string& note);

}  // namespace ht::probe
