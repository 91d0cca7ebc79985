// What a rank runs on: host, CPU (through hwloc), memory, and the GPUs it can see.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cuda_module.h"

namespace ht::probe {

// One visible GPU: the CUDA module lists them in this form.
using GpuInfo = cuda::GpuFacts;

struct HostInfo {
  std::string host;
  std::string cpu_model;
  int physical_cores = 0;
  int hardware_threads = 0;
  uint64_t memory_total = 0;      // bytes
  uint64_t memory_available = 0;  // bytes
  std::vector<GpuInfo> gpus;      // empty without CUDA or without a driver
  std::string gpu_note;           // why there are none, when there are none
};

HostInfo read_host_info();

}  // namespace ht::probe
