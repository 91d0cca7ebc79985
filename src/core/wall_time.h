// Wall-clock intervals on the monotonic clock, for timing steps, probes and waits.
#pragma once

#include <chrono>

namespace ht {

// Seconds from `t` to now.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace ht
