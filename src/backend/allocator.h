// Per-device memory accounting with an optional cap, over a cache of freed blocks.
//
// The cap is how memory-limited devices are emulated: a request that would take the
// live bytes past it throws OutOfMemory naming the request, the bytes in use and the
// cap. Freed blocks are kept for reuse because a training step allocates the same
// sizes every step; returning them to the OS (glibc does for large blocks) costs page
// faults on every step, and cudaMalloc is slow for the same reason on GPUs.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ht {

class Allocator {
 public:
  Allocator(std::string device, std::function<void*(size_t)> raw_alloc,
            std::function<void(void*)> raw_free);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // `what` names the requester (usually an op) for the out-of-memory message.
  void* allocate(size_t bytes, const char* what);
  void deallocate(void* p, size_t bytes);

  // While one lives on this thread, this thread's allocations are host staging: outside
  // the cap and the counts. Checkpoints (and a relayout's optimiser state in transit) are
  // read and assembled in host memory, which an emulated device cap does not stand for
  // (on a GPU they never touch device memory); so are the probe's benchmark tensors and
  // the blocks of the model a rank does not compute with (Tensor::rehome).
  class HostStaging {
   public:
    HostStaging();
    ~HostStaging();
    HostStaging(const HostStaging&) = delete;
    HostStaging& operator=(const HostStaging&) = delete;
  };

  bool staged(const void* p) const;  // whether p came from allocate under HostStaging
  void set_cap(size_t bytes);  // 0 removes the cap
  size_t cap() const;
  size_t live_bytes() const;
  size_t peak_bytes() const;
  void reset_peak();

 private:
  static size_t round_up(size_t bytes);
  void release_cache_locked();

  std::string device_;
  std::function<void*(size_t)> raw_alloc_;
  std::function<void(void*)> raw_free_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> cache_;  // rounded size -> free blocks
  std::unordered_set<void*> staged_;  // host staging blocks, freed straight back
  size_t cap_ = 0, live_ = 0, peak_ = 0, cached_ = 0;
};

}  // namespace ht
