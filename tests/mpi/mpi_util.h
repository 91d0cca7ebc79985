// Helpers shared by the MPI suite's test files.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/wall_time.h"

namespace mpi_test {

using namespace std::chrono_literals;

using ht::seconds_since;

// Generous: a test that fails on one rank must not leave the others hanging for long.
constexpr auto kLong = 30s;

// Every world rank's process id, exchanged once (the ranks of this suite share a host).
inline const std::vector<pid_t>& world_pids() {
  static const std::vector<pid_t> pids = [] {
    std::vector<pid_t> out;
    for (const std::string& p : ht::comm::world().allgather(std::to_string(getpid()), kLong, "the pids"))
      out.push_back(static_cast<pid_t>(std::stol(p)));
    return out;
  }();
  return pids;
}

// Whether `pid` is stopped (state T in /proc/PID/stat; the state follows the ")" that
// ends the command name).
inline bool is_stopped(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'T' || stat[close + 2] == 't');
}

// Continues `pid` once it has stopped: a SIGCONT sent before its SIGSTOP took hold would
// be lost and leave it stopped for good. Throws when it never stops (within kLong).
inline void continue_once_stopped(pid_t pid) {
  const auto start = std::chrono::steady_clock::now();
  while (!is_stopped(pid)) {
    if (std::chrono::steady_clock::now() - start > kLong)
      ht::fail("process ", pid, " did not stop within ", kLong.count(), " s; expected its raise(SIGSTOP)");
    std::this_thread::sleep_for(1ms);
  }
  kill(pid, SIGCONT);
}

}  // namespace mpi_test
