// A bound on MPI calls that cannot time out themselves.
//
// Most waits on a peer are polled against a deadline (communicator.h). A few MPI calls
// block inside the library with no way to give up: MPI_Init_thread (Open MPI's start-up
// exchange waits for every rank the launcher started), the collectives that make a
// communicator (MPI_Comm_dup, MPI_Comm_split, MPI_Comm_split_type), and MPI_Finalize.
// A rank stalled while its peers are inside one of them would hold them for as long as
// it stays stalled. A Watchdog guards such a stretch: if the scope has not ended within
// its limit, a thread reports what was awaited, as a peer timeout of this rank, on
// stderr, and ends the job (MPI_Abort once MPI is up, else the process alone, which
// mpirun answers by ending the others). The stalled rank cannot be named from inside
// the call; the message says which stretch it was.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace ht::comm {

// The limit of every Watchdog made without one: parallel.peer_timeout_s, set by the
// command before it first asks for the world (300 s until then).
void set_blocking_call_limit(std::chrono::duration<double> limit);
std::chrono::duration<double> blocking_call_limit();
// This process's world rank from the launcher's environment (comm/launch.h; 0 without
// one): known before MPI is up.
int launcher_rank();

// Prints a PeerTimeout's message (peer_timeout_message's) as this rank's error and ends
// the job: for waits that cannot raise, a watchdog's and the job's end.
[[noreturn]] void end_with_peer_timeout(const std::string& message);

class Watchdog {
 public:
  // `what` completes "timed out after N s waiting for ...".
  explicit Watchdog(std::string what);
  Watchdog(std::string what, std::chrono::duration<double> limit);
  ~Watchdog();  // disarms; the report is never made once the scope has ended
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace ht::comm
