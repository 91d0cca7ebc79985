// Device and pinned host memory for the CUDA backend.
//
// Device memory goes through the engine's Allocator (backend/allocator.h), the same
// accounting, cap and cache of freed blocks as the CPU, over plain cudaMalloc: never
// managed memory, whose page migration would hide transfers from the planner.
// cudaMalloc and cudaFree synchronise the device, so the cache matters more here than
// on the CPU.
//
// Pinned host memory (cudaHostAlloc) is what copies between the host and the device go
// through: the DMA engine reads and writes it directly, and a copy from pageable memory
// would be staged by the driver through a pinned bounce buffer of its own anyway.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/allocator.h"

namespace ht::cuda {

// The raw layer under a device's Allocator: cudaMalloc/cudaFree on one device, with the
// bytes it holds (in use plus the Allocator's cache).
//
// The out-of-memory report needs the device's free memory, which only this layer can ask
// for. Allocator::allocate, when the raw allocation fails, drops its cache and asks once
// more; so the first failure returns null (the cache may be what fills the device) and a
// failure right after it throws OutOfMemory naming the bytes requested, the bytes still
// held (all in use then, the cache being empty), and the device's free and total memory.
class DeviceMemory {
 public:
  DeviceMemory(int device, std::string name);

  void* allocate(size_t bytes);
  void release(void* p);
  size_t held_bytes() const;

 private:
  int device_;
  std::string name_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> blocks_;
  size_t held_ = 0;
  bool retrying_ = false;  // the last cudaMalloc failed: the next one is the Allocator's retry
};

// A device's Allocator over a DeviceMemory.
std::unique_ptr<Allocator> make_device_allocator(std::shared_ptr<DeviceMemory> memory,
                                                 const std::string& name);

// Pinned host memory (cudaHostAlloc, portable and mapped) without an Allocator: null when
// the host is out of memory, any other failure throws naming `name`. The CUDA backend's
// host staging hook (Allocator::set_host_staging) and the pinned Allocator below use it.
void* pinned_alloc(size_t bytes, const std::string& name);
void pinned_free(void* p, const std::string& name);

// An Allocator of pinned host memory (cudaHostAlloc, portable across devices and mapped
// into the device's address space): accounted and cached like device memory, never capped.
std::unique_ptr<Allocator> make_pinned_allocator(const std::string& name);

}  // namespace ht::cuda
