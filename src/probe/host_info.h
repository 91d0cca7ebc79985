// What a rank runs on: host, CPU (through hwloc), memory, and the GPUs it can see.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht::probe {

struct GpuInfo {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int sm_count = 0;
  uint64_t memory_total = 0, memory_free = 0;
  double host_to_device_gb_s = 0, device_to_host_gb_s = 0;  // pinned 64 MiB copies
};

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
