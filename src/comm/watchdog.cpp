#include "comm/watchdog.h"

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/launch.h"

namespace ht::comm {

namespace {
std::atomic<double> g_limit_s{300.0};

[[noreturn]] void report_and_end(const std::string& what, double limit_s) {
  end_with_peer_timeout(peer_timeout_message(launcher_rank(), {}, what, std::chrono::duration<double>(limit_s)));
}
}  // namespace

void end_with_peer_timeout(const std::string& msg) {
  std::fprintf(stderr, "hetrain: rank %d: error: %s\n", launcher_rank(),
               msg.substr(msg.find(": ") + 2).c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // Inside MPI_Init_thread MPI is not up yet, and exit() would run the destructors of
  // what the blocked main thread is still building: end the process alone.
  if (initialized && !finalized) abort_job(1);
  std::_Exit(1);
}

int launcher_rank() { return launch().rank; }

void set_blocking_call_limit(std::chrono::duration<double> limit) { g_limit_s = limit.count(); }
std::chrono::duration<double> blocking_call_limit() { return std::chrono::duration<double>(g_limit_s.load()); }

Watchdog::Watchdog(std::string what) : Watchdog(std::move(what), blocking_call_limit()) {}

Watchdog::Watchdog(std::string what, std::chrono::duration<double> limit) {
  thread_ = std::thread([this, what = std::move(what), limit] {
    std::unique_lock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(limit);
    if (cv_.wait_until(lock, deadline, [this] { return done_; })) return;
    report_and_end(what, limit.count());
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

}  // namespace ht::comm
