// Training progress output: a stream that reaches no terminal gets plain lines, never
// the bar's carriage returns and escape codes (a log file under mpirun stays readable).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "report/progress.h"

using namespace ht::report;
namespace fs = std::filesystem;

namespace {

// Everything `run` writes through a Progress on a temporary file.
template <class F>
std::string written(F run) {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  run(f);
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

void train_ten_steps(Progress& p) {
  p.note("training mlp: 10 steps");
  for (int s = 1; s <= 10; ++s) {
    p.step(s, s < 5 ? NAN : 0.5f, 1e-3f, 1000.0, 10.0 - s);
    // A log step's line comes when its loss is known: step 5's after step 6.
    if (s == 6) p.logged(5, 0.75f, 1e-3f, 1000.0, 5.0);
  }
  p.logged(10, 0.5f, 1e-3f, 1000.0, 0.0);
  p.note("checkpoint run/checkpoints/step-10");
  p.finish();
}

}  // namespace

TEST_CASE("progress: a file is no terminal, so it gets plain lines without escape codes") {
  const std::string out = written([](std::FILE* f) {
    CHECK_FALSE(reaches_terminal(fileno(f)));
    Progress p(Progress::detect(false, reaches_terminal(fileno(f))), 10, f);
    train_ten_steps(p);
  });
  CHECK(out.find('\033') == std::string::npos);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out ==
        "training mlp: 10 steps\n"
        "step 5/10  loss 0.7500  lr 1.00e-03  1000 samples/s  eta 5s\n"
        "step 10/10  loss 0.5000  lr 1.00e-03  1000 samples/s  eta 0s\n"
        "checkpoint run/checkpoints/step-10\n");
}

TEST_CASE("progress: the bar is what writes escape codes, and quiet writes nothing") {
  // The bar, forced on a file: the check above would fail if lines mode drew it.
  const std::string bar = written([](std::FILE* f) {
    Progress p(Progress::Mode::bar, 10, f);
    train_ten_steps(p);
  });
  CHECK(bar.find("\033[K") != std::string::npos);
  CHECK(bar.find("\r[") != std::string::npos);
  CHECK(bar.find("step 5/10") == std::string::npos);  // the log lines are lines mode's
  CHECK(written([](std::FILE* f) {
          Progress p(Progress::detect(true, true), 10, f);
          train_ten_steps(p);
        }).empty());
}

TEST_CASE("progress: a terminal forwarded to a file or a pipe is no terminal") {
  // A pseudo-terminal stands for the one an MPI launcher gives each rank.
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  const std::string slave_path = ptsname(master);
  const int slave = open(slave_path.c_str(), O_RDWR | O_NOCTTY);
  REQUIRE(slave >= 0);
  CHECK(reaches_terminal(slave));
  CHECK(reaches_terminal(slave, slave_path));  // forwarded on to a terminal: the bar
  const fs::path log = fs::temp_directory_path() / ("ht_progress_" + std::to_string(getpid()) + ".log");
  std::ofstream(log) << "";
  CHECK_FALSE(reaches_terminal(slave, log.string()));  // `mpirun ... > log`
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const std::string pipe_path = "/proc/self/fd/" + std::to_string(fds[1]);
  CHECK_FALSE(reaches_terminal(slave, pipe_path));  // `mpirun ... | tee log`
  CHECK_FALSE(reaches_terminal(slave, "/nonexistent/fd/1"));  // unknown: lines
  close(fds[0]);
  close(fds[1]);
  fs::remove(log);
  close(slave);
  close(master);
}
