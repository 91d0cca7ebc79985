// Training progress for people: a one-line bar redrawn in place when stdout is a
// terminal, plain periodic log lines otherwise (CI logs, files), nothing when quiet.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ht::report {

class Progress {
 public:
  enum class Mode { bar, lines, quiet };
  // bar when stdout is a terminal, lines otherwise; quiet overrides both.
  static Mode detect(bool quiet);

  Progress(Mode mode, int64_t total_steps, int64_t log_every);

  // After each optimiser step (1-based count of steps done); a NaN loss shows as "-".
  void step(int64_t done, float loss, float lr, double samples_per_s, double eta_s);
  // A line that must not be overwritten by the bar (evaluations, checkpoints).
  void note(const std::string& line);
  void finish();

 private:
  void clear_bar();

  Mode mode_;
  int64_t total_, log_every_;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "42s"

}  // namespace ht::report
