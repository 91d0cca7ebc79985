// Training progress for people: a one-line bar redrawn in place when the output reaches
// a terminal, plain periodic log lines otherwise (CI logs, files), nothing when quiet.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ht::report {

// Whether what this process writes to `fd` reaches a terminal. Under an MPI launcher a
// rank's stdout is a pseudo-terminal that the launcher copies to its own stdout, so the
// rank sees a terminal even for `mpirun ... > log`. `forwarded_to` names the descriptor
// the output is copied on to (e.g. "/proc/<launcher pid>/fd/1"), or is empty when
// nothing forwards it; then that one must be a terminal too.
bool reaches_terminal(int fd, const std::string& forwarded_to = "");

class Progress {
 public:
  enum class Mode { bar, lines, quiet };
  // bar when the output reaches a terminal, lines otherwise; quiet overrides both.
  static Mode detect(bool quiet, bool terminal);

  // Writes to `out` (stdout unless a test gives another stream).
  Progress(Mode mode, int64_t total_steps, std::FILE* out = stdout);

  // After each optimiser step (1-based count of steps done): redraws the bar with the
  // latest loss known (a NaN loss shows as "-"). Lines are written by `logged`.
  void step(int64_t done, float loss, float lr, double samples_per_s, double eta_s);
  // A log step's line, once its loss is known: under MPI that is a step or a round after
  // the step itself, and a line written at the step would show an older step's loss.
  // `samples_per_s` and `eta_s` are as of the step. Only in lines mode.
  void logged(int64_t done, float loss, float lr, double samples_per_s, double eta_s);
  // A line that must not be overwritten by the bar (evaluations, checkpoints).
  void note(const std::string& line);
  void finish();

 private:
  void clear_bar();

  Mode mode_;
  int64_t total_;
  std::FILE* out_;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "42s"

}  // namespace ht::report
