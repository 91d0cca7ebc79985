#include "backend/cuda/cuda_memory.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "core/units.h"

namespace ht::cuda {

namespace {

// Frees run from destructors and from the Allocator's cache release: they report a failure
// instead of throwing. At process exit the runtime may already be unloading, which is not
// a failure worth a line.
void report_free_failure(cudaError_t e, const char* call, const std::string& device) {
  if (e == cudaSuccess || e == cudaErrorCudartUnloading) return;
  std::fprintf(stderr, "hetrain: %s\n", describe(e, call, device).c_str());
}

}  // namespace

DeviceMemory::DeviceMemory(int device, std::string name) : device_(device), name_(std::move(name)) {}

void* DeviceMemory::allocate(size_t bytes) {
  HT_CUDA_ON(name_, cudaSetDevice(device_));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (e == cudaSuccess) {
    retrying_ = false;
    blocks_[p] = bytes;
    held_ += bytes;
    return p;
  }
  if (e != cudaErrorMemoryAllocation) check(e, "cudaMalloc(&p, bytes)", name_);
  cudaGetLastError();  // an allocation failure is not sticky; clear it for the next check
  if (!retrying_) {
    retrying_ = true;
    return nullptr;
  }
  retrying_ = false;
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo(&free, &total)", name_);
  fail_as<OutOfMemory>("out of memory on ", name_, ": cudaMalloc refused ", bytes, " bytes (",
                       format_bytes(bytes), ") with ", held_, " bytes (", format_bytes(held_),
                       ") in use by hetrain and ", free, " bytes (", format_bytes(free),
                       ") free on the device of ", total, " bytes; expected the request to fit "
                       "in the free memory (another process may hold the rest: nvidia-smi "
                       "lists them; or lower the batch)");
}

void DeviceMemory::release(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it != blocks_.end()) {
      held_ -= it->second;
      blocks_.erase(it);
    }
  }
  // On this memory's device, whatever the calling thread last selected (a cache release
  // runs before any allocation sets it; a thread with none would open a context on GPU 0).
  // The blocks freed here come from the Allocator's cache, free only in stream order:
  // work queued before their release may still use them, and cudaFree is not promised to
  // wait for it. Releases are rare (a cap reached, an out-of-memory retry, the end).
  report_free_failure(cudaSetDevice(device_), "cudaSetDevice(device)", name_);
  report_free_failure(cudaDeviceSynchronize(), "cudaDeviceSynchronize()", name_);
  report_free_failure(cudaFree(p), "cudaFree(p)", name_);
}

size_t DeviceMemory::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

std::unique_ptr<Allocator> make_device_allocator(std::shared_ptr<DeviceMemory> memory,
                                                 const std::string& name) {
  return std::make_unique<Allocator>(
      name, [memory](size_t bytes) { return memory->allocate(bytes); },
      [memory](void* p) { memory->release(p); });
}

void* pinned_alloc(size_t bytes, const std::string& name) {
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;  // the Allocator reports it, naming the request and the bytes in use
  }
  check(e, "cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped)", name);
  return p;
}

void pinned_free(void* p, const std::string& name) {
  report_free_failure(cudaFreeHost(p), "cudaFreeHost(p)", name);
}

std::unique_ptr<Allocator> make_pinned_allocator(const std::string& name) {
  return std::make_unique<Allocator>(
      name, [name](size_t bytes) { return pinned_alloc(bytes, name); },
      [name](void* p) { pinned_free(p, name); });
}

}  // namespace ht::cuda
