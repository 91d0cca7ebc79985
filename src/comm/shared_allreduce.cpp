#include "comm/shared_allreduce.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "comm/comm_internal.h"
#include "comm/doorbell.h"
#include "comm/shared_memory.h"
#include "comm/weighted_allreduce.h"
#include "core/error.h"

namespace ht::comm {

namespace {

constexpr size_t kLine = 64;                       // bytes: one counter per cache line
constexpr int64_t kAlignFloats = kLine / 4;        // each tensor starts on a cache line
constexpr int64_t kSumBlock = 4096;                // floats summed a block at a time (16 KiB, in L1)

int64_t aligned(int64_t floats) { return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

std::unique_ptr<SharedAllreduce> SharedAllreduce::make(Communicator& comm, const std::vector<int64_t>& sizes,
                                                       Timeout timeout, std::string* why) {
  auto s = std::unique_ptr<SharedAllreduce>(new SharedAllreduce());
  s->members_ = comm.size();
  s->me_ = comm.rank();
  s->sizes_ = sizes;
  for (int64_t n : sizes) {
    HT_CHECK(n >= 0, "shared allreduce: a tensor of ", n, " elements; expected >= 0");
    s->offsets_.push_back(s->row_floats_);
    s->row_floats_ += aligned(n);
  }
  for (int j = 0; j < s->members_; ++j) s->world_ranks_.push_back(comm.world_rank(j));
  // Counters (posted, summed: a line each per member), then two generations of
  // (members + 1) rows.
  const size_t header = static_cast<size_t>(s->members_) * 2 * kLine;
  const size_t bytes = header + 2 * static_cast<size_t>(s->members_ + 1) * static_cast<size_t>(s->row_floats_) * 4;
  // Shared memory is the host's RAM, held for the whole job: a board of more than a
  // quarter of it (a large model, rows for every member twice over) is not made, and the
  // exchange keeps to messages. Every member says whether it is willing, so they agree.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const size_t quarter = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) / 4 : 0;
  const bool fits = bytes <= quarter;
  s->memory_ = map_shared(comm, 0, bytes, fits, timeout, why);
  if (!s->memory_) {
    if (!fits && why)
      *why = std::to_string(bytes) + " bytes of board exceed a quarter of this host's memory (" +
             std::to_string(quarter) + " bytes)";
    return nullptr;
  }
  return s;
}

int64_t* SharedAllreduce::counter(int member, int which) const {
  return reinterpret_cast<int64_t*>(memory_.get() + (static_cast<size_t>(member) * 2 + static_cast<size_t>(which)) * kLine);
}

float* SharedAllreduce::row(int64_t e, int member) const {
  const size_t header = static_cast<size_t>(members_) * 2 * kLine;
  const size_t generation = static_cast<size_t>(e % 2) * static_cast<size_t>(members_ + 1);
  return reinterpret_cast<float*>(memory_.get() + header) +
         (generation + static_cast<size_t>(member)) * static_cast<size_t>(row_floats_);
}

float* SharedAllreduce::contribution(int64_t e, size_t t) const {
  // Its generation was exchange e - 2's, which every member finished with before any
  // part of e - 1 was summed: seen here as e - 1 finished.
  HT_CHECK(e == posted_ + 1 && finished_ == posted_ && t < sizes_.size(), "shared allreduce: a contribution to exchange ",
           e, " tensor ", t, " with exchange ", posted_, (finished_ == posted_ ? " finished" : " not finished"),
           "; expected exchange ", posted_ + 1, " after finish() of the one before, and one of ", sizes_.size(), " tensors");
  return row(e, me_) + offsets_[t];
}

const float* SharedAllreduce::sums(int64_t e, size_t t) const {
  HT_CHECK(e >= 1 && e <= finished_ && e + 1 >= posted_ && t < sizes_.size(), "shared allreduce: the sums of exchange ",
           e, " tensor ", t, "; expected the last finished (", finished_, ") or the one before the posted (", posted_,
           "), and one of ", sizes_.size(), " tensors");
  return row(e, members_) + offsets_[t];
}

// A counter moved: the members waiting on it wake (comm/doorbell.h).
void SharedAllreduce::ring_others() const {
  for (int j = 0; j < members_; ++j)
    if (j != me_) ring_doorbell(world_ranks_[static_cast<size_t>(j)]);
}

void SharedAllreduce::post(int64_t e, std::vector<double> weights) {
  HT_CHECK(e == posted_ + 1, "shared allreduce: exchange ", e, " posted after ", posted_, "; expected consecutive");
  HT_CHECK(finished_ == posted_, "shared allreduce: exchange ", e, " posted before exchange ", posted_,
           " finished; expected finish() first");
  HT_CHECK(static_cast<int>(weights.size()) == members_, "shared allreduce: ", weights.size(), " weights for ",
           members_, " members; expected one each");
  weights_ = std::move(weights);
  posted_ = e;
  std::atomic_ref<int64_t>(*counter(me_, 0)).store(e, std::memory_order_release);
  ring_others();
  progress();
}

bool SharedAllreduce::progress() {
  if (summed_ == posted_) return false;
  const int64_t e = posted_;
  for (int j = 0; j < members_; ++j)
    if (std::atomic_ref<int64_t>(*counter(j, 0)).load(std::memory_order_acquire) < e) return false;
  float* sums = row(e, members_);
  for (size_t t = 0; t < sizes_.size(); ++t) {
    const std::vector<int64_t> off = part_offsets(sizes_[t], weights_);
    const int64_t begin = offsets_[t] + off[static_cast<size_t>(me_)];
    const int64_t n = off[static_cast<size_t>(me_) + 1] - off[static_cast<size_t>(me_)];
    if (n == 0) continue;
    // Its own row first, then the others in rank order, as OverlappedAllreduce's owner
    // adds them; a block at a time, so that the sums stay in cache between the rows.
    for (int64_t b = 0; b < n; b += kSumBlock) {
      const int64_t len = std::min(kSumBlock, n - b);
      float* out = sums + begin + b;
      const float* own = row(e, me_) + begin + b;
      std::copy(own, own + len, out);
      for (int j = 0; j < members_; ++j) {
        if (j == me_) continue;
        const float* in = row(e, j) + begin + b;
        for (int64_t k = 0; k < len; ++k) out[k] += in[k];
      }
    }
  }
  summed_ = e;
  std::atomic_ref<int64_t>(*counter(me_, 1)).store(e, std::memory_order_release);
  ring_others();
  return true;
}

WaitStatus SharedAllreduce::finish(Timeout timeout) {
  const int64_t e = posted_;
  const WaitStatus status = poll_until(
      [&] {
        progress();
        for (int j = 0; j < members_; ++j)
          if (std::atomic_ref<int64_t>(*counter(j, 1)).load(std::memory_order_acquire) < e) return false;
        return true;
      },
      deadline_from(timeout, "shared allreduce"));
  if (status == WaitStatus::done) finished_ = e;
  return status;
}

std::vector<int> SharedAllreduce::missing() const {
  // Those that did not post hold everyone up; only where all posted, the owners late
  // with their sums.
  for (int which : {0, 1}) {
    std::vector<int> out;
    for (int j = 0; j < members_; ++j)
      if (std::atomic_ref<int64_t>(*counter(j, which)).load(std::memory_order_acquire) < posted_)
        out.push_back(world_ranks_[static_cast<size_t>(j)]);
    if (!out.empty()) return out;
  }
  return {};
}

}  // namespace ht::comm
