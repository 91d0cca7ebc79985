#include "backend/allocator.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace ht {

Allocator::Allocator(std::string device, std::function<void*(size_t)> raw_alloc,
                     std::function<void(void*)> raw_free)
    : device_(std::move(device)), raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}

Allocator::~Allocator() {
  release_cache_locked();
  // The staging cache is host memory: a device cap never asks for it back, only the end.
  for (auto& [size, blocks] : staged_cache_)
    for (void* p : blocks) staging_free_ ? staging_free_(p) : raw_free_(p);
}

namespace {
thread_local int staging_depth = 0;
}

Allocator::HostStaging::HostStaging() { ++staging_depth; }
Allocator::HostStaging::~HostStaging() { --staging_depth; }

size_t Allocator::round_up(size_t bytes) { return bytes == 0 ? 64 : (bytes + 63) & ~size_t{63}; }

namespace {

// A cached block serves a request up to a quarter smaller than itself. A rebalanced
// batch changes every activation's size a little; exact sizes alone would miss the cache
// at every new split and grow it (and the process) by a step's activations each time.
void* take_fitting(std::map<size_t, std::vector<void*>>& cache, size_t size, size_t most, size_t& block) {
  auto it = cache.lower_bound(size);
  if (it == cache.end() || it->first > size + size / 4 || it->first > most) return nullptr;
  void* p = it->second.back();
  block = it->first;
  it->second.pop_back();
  if (it->second.empty()) cache.erase(it);
  return p;
}

}  // namespace

void* Allocator::allocate(size_t bytes, const char* what) {
  size_t size = round_up(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (staging_depth > 0) {
    size_t block = size;
    void* p = staging_reuse_ ? take_fitting(staged_cache_, size, SIZE_MAX, block) : nullptr;
    if (p) {
      staged_cached_ -= block;
      staging_reuse_();
    } else {
      block = size;
      p = staging_alloc_ ? staging_alloc_(size) : raw_alloc_(size);
    }
    if (!p)
      fail_as<OutOfMemory>(what, ": out of host memory staging ", size, " bytes for ", device_,
                           " with ", staged_live_, " staging bytes in use");
    staged_.emplace(p, block);
    staged_live_ += block;
    if (staged_live_ > staged_peak_) staged_peak_ = staged_live_;
    return p;
  }
  if (cap_ && live_ + slack_ + size > cap_)
    fail_as<OutOfMemory>(what, ": out of memory on ", device_, ": requested ", size, " bytes with ",
                         live_ + slack_, " bytes in use and a cap of ", cap_,
                         " bytes; expected the request to fit under the cap");
  // Under a cap a larger block may serve only where the whole of it fits, and only while
  // the blocks' bytes beyond their requests stay within slack_allowance: beyond that
  // they counted against the cap by the run's history, past what the planner and the
  // evaluation check compute (a batch the check found to fit ran out of memory).
  size_t block = size, most = SIZE_MAX;
  if (cap_) {
    const size_t allowance = slack_allowance(cap_), spare = allowance > slack_ ? allowance - slack_ : 0;
    most = std::min(size + spare, cap_ - live_ - slack_);
  }
  void* p = take_fitting(cache_, size, most, block);
  if (p) {
    cached_ -= block;
  } else {
    // Under a cap, cached blocks count against the device too: drop them before
    // growing past it.
    if (cap_ && live_ + slack_ + cached_ + size > cap_) release_cache_locked();
    p = raw_alloc_(size);
    if (!p) {
      release_cache_locked();
      p = raw_alloc_(size);
    }
    if (!p)
      fail_as<OutOfMemory>(what, ": out of memory on ", device_, ": the device refused ", size,
                           " bytes with ", live_ + slack_, " bytes in use");
  }
  if (block != size) {
    oversize_.emplace(p, block);
    slack_ += block - size;
  }
  live_ += size;
  if (live_ > peak_) peak_ = live_;
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  size_t size = round_up(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (!staged_.empty()) {
    auto it = staged_.find(p);
    if (it != staged_.end()) {
      const size_t block = it->second;
      staged_live_ -= block;
      staged_.erase(it);
      if (staging_reuse_ && staged_cached_ + block <= staged_peak_) {
        staged_cache_[block].push_back(p);
        staged_cached_ += block;
      } else if (staging_free_) {
        staging_free_(p);
      } else {
        raw_free_(p);
      }
      return;
    }
  }
  size_t block = size;
  if (!oversize_.empty()) {
    auto it = oversize_.find(p);
    if (it != oversize_.end()) {
      block = it->second;
      slack_ -= block - size;
      oversize_.erase(it);
    }
  }
  live_ -= size;
  cache_[block].push_back(p);
  cached_ += block;
}

void Allocator::set_cap(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  cap_ = bytes;
  if (cap_ && live_ + slack_ + cached_ > cap_) release_cache_locked();
}

size_t Allocator::cap() const { std::lock_guard<std::mutex> l(mu_); return cap_; }
size_t Allocator::live_bytes() const { std::lock_guard<std::mutex> l(mu_); return live_; }
size_t Allocator::peak_bytes() const { std::lock_guard<std::mutex> l(mu_); return peak_; }
void Allocator::reset_peak() { std::lock_guard<std::mutex> l(mu_); peak_ = live_; }

void Allocator::set_host_staging(std::function<void*(size_t)> alloc, std::function<void(void*)> free,
                                 std::function<void()> reuse) {
  std::lock_guard<std::mutex> l(mu_);
  staging_alloc_ = std::move(alloc);
  staging_free_ = std::move(free);
  staging_reuse_ = std::move(reuse);
}

size_t Allocator::staged_bytes() const { std::lock_guard<std::mutex> l(mu_); return staged_live_; }
size_t Allocator::staged_peak_bytes() const { std::lock_guard<std::mutex> l(mu_); return staged_peak_; }

bool Allocator::staged(const void* p) const {
  std::lock_guard<std::mutex> l(mu_);
  return staged_.count(const_cast<void*>(p)) > 0;
}

void Allocator::release_cache_locked() {
  for (auto& [size, blocks] : cache_)
    for (void* p : blocks) raw_free_(p);
  cache_.clear();
  cached_ = 0;
}

}  // namespace ht
