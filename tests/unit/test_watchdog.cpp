// comm::Watchdog: a guarded stretch that outlasts its limit ends the process with a peer
// timeout naming what was awaited; one that ends in time leaves no trace. The first runs
// in a forked child, whose exit status and stderr the test reads.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "comm/watchdog.h"

using namespace std::chrono_literals;

TEST_CASE("a watchdog whose scope outlasts its limit ends the process, naming what was awaited") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    ht::comm::Watchdog bound("the test's blocking call", 0.2s);
    std::this_thread::sleep_for(30s);  // the "call" that never returns
    _exit(0);
  }
  close(fds[1]);
  std::string err;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(took >= 0.2);
  CHECK(took < 20);  // long before the 30 s call would have returned
  CHECK_MESSAGE(err.find("hetrain: rank 0: error: timed out after 0.2 s waiting for the test's blocking call") !=
                    std::string::npos,
                err);
}

TEST_CASE("a watchdog whose scope ends in time does nothing, and its limit defaults to the set one") {
  const auto before = ht::comm::blocking_call_limit();
  ht::comm::set_blocking_call_limit(0.05s);
  CHECK(ht::comm::blocking_call_limit().count() == doctest::Approx(0.05));
  { ht::comm::Watchdog bound("a quick call"); }  // ends at once; were it to fire, this process would exit 1
  std::this_thread::sleep_for(0.15s);
  ht::comm::set_blocking_call_limit(before);
  CHECK(ht::comm::blocking_call_limit() == before);
}
