// CPU time of this process, for telling a rank's sustained speed under a CPU quota from
// the speed of one burst (see plan/rebalance.h and run_for in probe/microbench.cpp).
#pragma once

#include <ctime>

namespace ht {

// CPU seconds this process has used so far, all threads.
inline double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace ht
