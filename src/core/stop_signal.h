// A stop asked of a job's ranks by signals, as the ranks agree on it where they were
// given different ones: SIGTERM (a scheduler's, a pre-emption's) wins over SIGINT (a
// Ctrl-C), so that every rank, signalled or stopping on another's word, exits with one
// status, 143 where any rank was terminated (130 otherwise).
#pragma once

#include <csignal>

namespace ht {

// The signal a stop asked with `a` and with `b` is agreed with (0: no stop asked).
constexpr int stronger_stop(int a, int b) {
  if (a == SIGTERM || b == SIGTERM) return SIGTERM;
  return a != 0 ? a : b;
}

// The shell's status of a process stopped by `sig` (128 + the signal), for a stop agreed
// with `sig`: 143 for SIGTERM, 130 for SIGINT and for a stop with no signal known.
constexpr int stop_status(int sig) { return 128 + (sig == SIGTERM ? SIGTERM : SIGINT); }

}  // namespace ht
