// Per-device memory accounting with an optional cap, over a cache of freed blocks.
//
// The cap is how memory-limited devices are emulated: a request that would take the
// live bytes past it throws OutOfMemory naming the request, the bytes in use and the
// cap. Freed blocks are kept for reuse because a training step allocates the same
// sizes every step; returning them to the OS (glibc does for large blocks) costs page
// faults on every step, and cudaMalloc is slow for the same reason on GPUs. A cached
// block serves any request up to a quarter smaller than itself, so that the changing
// batch sizes of a rebalanced run reuse blocks instead of adding new ones; the live and
// peak counts are of the requests (what the planner predicts), and a cap counts the
// whole blocks, with at most slack_allowance(cap) beyond the requests. Host staging
// blocks go straight back, unless the staging hook has a `reuse` step (set_host_staging).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
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

  // While one lives on this thread, this thread's allocations are host staging: host
  // memory outside the cap and the live/peak counts, counted apart (staged_bytes).
  // Checkpoints (and a relayout's optimiser state in transit) are read and assembled in
  // host memory, which an emulated device cap does not stand for; so are the probe's
  // benchmark tensors and the blocks of the model a rank does not compute with
  // (Tensor::rehome). A device allocator's staging blocks come from the hook that
  // set_host_staging installs (the CUDA backend's is pinned, mapped host memory, which
  // its copies and kernels reach directly); without one, from the raw allocation (the
  // CPU's memory is host memory already).
  class HostStaging {
   public:
    HostStaging();
    ~HostStaging();
    HostStaging(const HostStaging&) = delete;
    HostStaging& operator=(const HostStaging&) = delete;
  };

  bool staged(const void* p) const;  // whether p came from allocate under HostStaging
  // Where host staging blocks come from instead of the raw allocation (see HostStaging);
  // `alloc` returns null when the host is out of memory. Set before the first allocation.
  // With `reuse`, freed staging blocks are cached (up to the most staging bytes ever live
  // at once) and `reuse` runs before a cached one is handed out again: pinned memory is
  // slow to allocate and free (cudaHostAlloc pins pages, cudaFreeHost synchronises the
  // device), and a staging block may still be read or written by queued device work when
  // it is freed, which `reuse` waits for (the CUDA backend's synchronises its streams).
  void set_host_staging(std::function<void*(size_t)> alloc, std::function<void(void*)> free,
                        std::function<void()> reuse = {});
  size_t staged_bytes() const;       // host staging bytes live now
  size_t staged_peak_bytes() const;  // the most live at once
  void set_cap(size_t bytes);  // 0 removes the cap
  size_t cap() const;
  // Under a cap, the most that larger blocks serving smaller requests hold beyond the
  // requests (a 64th of the cap): live requests up to cap - slack_allowance(cap) always
  // fit, whatever blocks served them.
  static size_t slack_allowance(size_t cap) { return cap / 64; }
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
  std::map<size_t, std::vector<void*>> cache_;          // block size -> free blocks
  std::unordered_map<void*, size_t> oversize_;  // live blocks larger than their request -> block size
  std::function<void*(size_t)> staging_alloc_;  // empty: raw_alloc_
  std::function<void(void*)> staging_free_;
  std::function<void()> staging_reuse_;        // empty: staging blocks are not cached
  std::unordered_map<void*, size_t> staged_;  // live host staging blocks -> block size
  std::map<size_t, std::vector<void*>> staged_cache_;  // freed staging blocks, with staging_reuse_
  size_t staged_cached_ = 0;
  size_t cap_ = 0, live_ = 0, peak_ = 0, cached_ = 0, staged_live_ = 0, staged_peak_ = 0,
         slack_ = 0;  // slack_: the live blocks' bytes beyond their requests
};

}  // namespace ht
