// GPUs visible to this process, through the CUDA backend module (backend/cuda/cuda_module.h)
// where this process has loaded it: a process that asked for no GPU lists none rather than
// load the module (about 225 MB resident) to report them.
#pragma once

#include <string>
#include <vector>

#include "probe/host_info.h"

namespace ht::probe {

// Empty when the build has no CUDA, the module is not loaded (no GPU was asked for, or it
// failed to load), no driver is loaded or no device is visible; `note` then says which.
std::vector<GpuInfo> query_gpus(std::string& note);

}  // namespace ht::probe
