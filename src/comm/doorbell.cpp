// The doorbell's counters and futex calls (see doorbell.h).
#include "comm/doorbell.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <ctime>
#include <thread>

#include "core/error.h"

namespace ht::comm {

namespace {

constexpr size_t kStride = 64;  // see bytes_for

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

std::atomic<int64_t> min_pause_us{BackoffPauses{}.min.count()}, max_pause_us{BackoffPauses{}.max.count()};

std::unique_ptr<Doorbell>& the_bell() {
  static std::unique_ptr<Doorbell> bell;
  return bell;
}

}  // namespace

size_t Doorbell::bytes_for(int slots) { return std::max<size_t>(static_cast<size_t>(slots) * kStride, 4096); }

Doorbell::Doorbell(void* words, size_t bytes, std::vector<int> slot_of, int mine)
    : words_(words), bytes_(bytes), slot_of_(std::move(slot_of)), mine_(mine) {}

Doorbell::~Doorbell() { munmap(words_, bytes_); }

uint32_t* Doorbell::word(int slot) const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(words_) + static_cast<size_t>(slot) * kStride);
}

void Doorbell::ring(int world_rank) const {
  if (world_rank < 0 || static_cast<size_t>(world_rank) >= slot_of_.size()) return;
  const int slot = slot_of_[static_cast<size_t>(world_rank)];
  if (slot < 0) return;
  uint32_t* w = word(slot);
  std::atomic_ref<uint32_t>(*w).fetch_add(1);
  // Shared (not FUTEX_PRIVATE): the sleeper is another process mapping the same page.
  futex(w, FUTEX_WAKE, INT_MAX, nullptr);
}

uint32_t Doorbell::heard() const { return std::atomic_ref<uint32_t>(*word(mine_)).load(); }

bool Doorbell::sleep(uint32_t heard, std::chrono::microseconds pause) const {
  uint32_t* w = word(mine_);
  const auto us = pause.count();
  const timespec timeout{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  // Returns at once when the counter already moved (EAGAIN); a signal (EINTR) or a
  // spurious wake ends the sleep early, which only costs one more poll.
  futex(w, FUTEX_WAIT, heard, &timeout);
  return std::atomic_ref<uint32_t>(*w).load() != heard;
}

void set_process_doorbell(std::unique_ptr<Doorbell> bell) { the_bell() = std::move(bell); }

const Doorbell* process_doorbell() { return the_bell().get(); }

void ring_doorbell(int world_rank) {
  if (const Doorbell* bell = process_doorbell()) bell->ring(world_rank);
}

uint32_t doorbell_heard() {
  const Doorbell* bell = process_doorbell();
  return bell ? bell->heard() : 0;
}

bool sleep_unless_rung(uint32_t heard, std::chrono::microseconds pause) {
  if (const Doorbell* bell = process_doorbell()) return bell->sleep(heard, pause);
  std::this_thread::sleep_for(pause);
  return false;
}

BackoffPauses backoff_pauses() {
  return {std::chrono::microseconds(min_pause_us.load()), std::chrono::microseconds(max_pause_us.load())};
}

void set_backoff_pauses(BackoffPauses pauses) {
  HT_CHECK(pauses.min.count() >= 1 && pauses.max >= pauses.min, "backoff pauses ", pauses.min.count(), " to ",
           pauses.max.count(), " us; expected 1 us <= min <= max");
  min_pause_us.store(pauses.min.count());
  max_pause_us.store(pauses.max.count());
}

}  // namespace ht::comm
