// Pieces shared by the communicator implementations (not part of the public API):
// the request interface, the polled deadline wait, argument checks, and the link
// emulation model.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/doorbell.h"

namespace ht::comm {

class Request::Impl {
 public:
  virtual ~Impl() = default;
  // Advances the operation without blocking; true once it has completed. Throws
  // ht::Error when the operation failed.
  virtual bool test() = 0;
  // Called when a wait's deadline passes. Receives cancel themselves and return true
  // only when the message had already started arriving (it is then finished and the
  // request completed after all). Sends stay pending and return false.
  virtual bool expire() { return false; }
  // A cancelled request never completes; waits report timed_out at once.
  virtual bool cancelled() const { return false; }
  // True for receives: destroying an unfinished one cancels it (expire) instead of
  // waiting, which could be forever when no message comes.
  virtual bool is_receive() const { return false; }
  // What the operation is, for a message about it ("a send to rank 3, tag 7, 40 bytes");
  // empty where not known.
  virtual std::string label() const { return {}; }
};

// A request that is complete from the start (buffered local sends).
class DoneRequest final : public Request::Impl {
 public:
  bool test() override { return true; }
};

using Deadline = std::optional<Clock::time_point>;

// Checks `timeout` (finite, not negative; `op` names the caller) and turns it into a
// deadline from now. Timeouts beyond a year are taken as none (now + s could overflow).
Deadline deadline_from(Timeout timeout, const char* op);

// Time this process did not run does not count against its peers. A wait that finds
// kOwnStallGap or more between two of its polls (this rank was stopped, SIGSTOP, or not
// scheduled: its own pauses are at most a millisecond) moves its deadline on by the gap.
// Else a rank continued after a stop longer than the peer timeout found its deadline
// passed at once and named a peer that had been waiting for it (a data-parallel rank
// stopped 8 s under a 5 s timeout named rank 0 as it woke). Work inside a poll (an
// all-reduce's sums of its part) moves it on too: that was not the peers' time either,
// and it is finite, so the wait stays bounded by the timeout of time this rank ran and
// waited. The deadline policy's waits do the same with their patience (Presence in
// deadline_reduce.cpp).
inline constexpr auto kOwnStallGap = std::chrono::milliseconds(500);
class OwnStall {
 public:
  // Once per poll.
  void forgive(Deadline& deadline) {
    const auto now = Clock::now();
    const Clock::duration gap = now - last_;
    last_ = now;
    if (deadline && gap >= kOwnStallGap) *deadline += gap;
  }

 private:
  Clock::time_point last_ = Clock::now();
};

// Calls `done` until it returns true (done) or the deadline passes (timed_out); `done`
// is always called at least once, and a gap between polls is forgiven (OwnStall). Spins
// briefly, then sleeps 20 us doubling to 1 ms (backoff_pauses) between polls: waiting
// ranks would otherwise take the core that a computing rank on the same machine needs
// (OpenMPI's own waits spin). A ring of the doorbell (a peer on this host sent or
// received something) ends a sleep early and starts the backoff over.
template <class Done>
WaitStatus poll_until(Done&& done, Deadline deadline);

// ---- argument checks; `op` names the operation in the error.
void check_peer(int peer, int size, const char* op, const char* role);
void check_tag(int tag, int max_tag, const char* op);
void check_buffer(const void* data, size_t bytes, const char* op);

// Every bucket defined, float32, and at most INT_MAX elements (an MPI count).
void check_buckets(const std::vector<Tensor>& buckets, const char* op);
// Copies numel * dtype size dense host bytes into `into`, which may be a strided view.
void copy_host_into(Tensor& into, const void* host);

// ---- link emulation model (see LinkEmulation in communicator.h)
void check_links(const std::vector<LinkEmulation>& links, int size, const char* who);
bool any_active(const std::vector<LinkEmulation>& links);
// The smaller non-zero bandwidth of a and b; 0 when both are unlimited.
double pair_bandwidth(const LinkEmulation& a, const LinkEmulation& b);
enum class Collective { allreduce, allgather, barrier };
// Emulated duration of a collective over all of `links`; `bytes` is the buffer size of
// an allreduce or the largest item of an allgather.
double collective_delay_s(const std::vector<LinkEmulation>& links, Collective kind, size_t bytes);

// Duration as a steady-clock duration, rounded up so that "not before" holds.
Clock::duration seconds_to_duration(double s);

// ---- the polled wait (template, so that MPI_Test calls inline into the loop)
// `heard`: the doorbell's counter read before the poll that found nothing.
void backoff_sleep(int& polls, std::chrono::microseconds& pause, Deadline deadline, uint32_t heard);

template <class Done>
WaitStatus poll_until(Done&& done, Deadline deadline) {
  int polls = 0;
  std::chrono::microseconds pause = backoff_pauses().min;
  OwnStall own;
  for (;;) {
    const uint32_t heard = doorbell_heard();
    if (done()) return WaitStatus::done;
    own.forgive(deadline);
    if (deadline && Clock::now() >= *deadline) return WaitStatus::timed_out;
    backoff_sleep(polls, pause, deadline, heard);
  }
}

}  // namespace ht::comm
