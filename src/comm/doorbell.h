// The doorbell: wakes a rank sleeping in a polled wait as soon as a peer on the same host
// sends it something, so that a wait costs neither a spinning core nor the rest of a
// sleep.
//
// Why: OpenMPI's shared-memory transport cannot block, so every wait here polls, backing
// off to sleeps of up to 1 ms (a spinning rank would burn the CPU quota, or the core, that
// a computing rank beside it needs). A message that lands during a sleep waits for its
// end, and a timed sleep here ends late: a message sent 20 ms into a wait was taken a
// median 1.6-2.1 ms after it was sent, against 0.14 ms with the doorbell. A
// data-parallel step hands over twice (the gradients to the reducing rank, the weights
// back). The mpi test "doorbell: a message ends ..." checks the wake-up with sleeps of 2 s.
//
// How: the ranks of one host share a page of POSIX shared memory, one 32-bit counter per
// rank. A rank that posts a send, or completes a receive (which its sender may be waiting
// on), increments its peer's counter and wakes it with FUTEX_WAKE. A waiting rank reads
// its own counter before it tests its requests and then sleeps with FUTEX_WAIT on that
// value, so a ring between the test and the sleep is not lost: the sleep returns at once.
// Sleeps keep their length limit, so what no ring announces (a peer on another host, the
// steps inside MPI's own collectives) is found as before.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ht::comm {

class Doorbell {
 public:
  // The shared mapping's size for `slots` ranks: a counter each, a cache line apart (rings
  // to one rank do not slow another's), at least a page.
  static size_t bytes_for(int slots);
  // `words`: such a mapping (the doorbell unmaps it); `slot_of`: per world rank, its slot
  // on this host or -1 (another host); `mine`: this rank's slot.
  Doorbell(void* words, size_t bytes, std::vector<int> slot_of, int mine);
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // Wakes `world_rank` if it is on this host (and sleeping); otherwise nothing.
  void ring(int world_rank) const;
  // This rank's counter, to pass to sleep() after testing.
  uint32_t heard() const;
  // Sleeps until this rank's counter differs from `heard` or `pause` has passed. True when
  // it was rung.
  bool sleep(uint32_t heard, std::chrono::microseconds pause) const;

 private:
  uint32_t* word(int slot) const;
  void* words_;
  size_t bytes_;
  std::vector<int> slot_of_;
  int mine_;
};

// The process's doorbell, which every polled wait sleeps on (set once, by the MPI world
// on start-up); null when there is none (one process, or no shared memory), and the waits
// then sleep out their pauses.
void set_process_doorbell(std::unique_ptr<Doorbell> bell);
const Doorbell* process_doorbell();

// Rings `world_rank` on the process's doorbell (nothing without one).
void ring_doorbell(int world_rank);

// The waits' side: the counter before a test (0 without a doorbell), and the sleep after
// it (a plain sleep without one). True when rung.
uint32_t doorbell_heard();
bool sleep_unless_rung(uint32_t heard, std::chrono::microseconds pause);

// The polled waits' sleeps: from `min`, doubling to `max` (20 us to 1 ms), for this
// process. The mpi tests lengthen them to seconds around a wait, so that a ring the
// doorbell missed shows as the rest of a long sleep, where a scheduler's delay under load
// could hide the millisecond a short one costs.
struct BackoffPauses {
  std::chrono::microseconds min{20}, max{1000};
};
BackoffPauses backoff_pauses();
// Throws unless 1 us <= min <= max.
void set_backoff_pauses(BackoffPauses pauses);

}  // namespace ht::comm
