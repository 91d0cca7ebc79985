// Small statistics shared by the planner and the runtime.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

namespace ht {

// The upper median (the element at size / 2 once sorted); 0 for an empty vector.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// The median of the means of consecutive windows of `window` values (a partial window at
// the end left out); the mean of all when there are fewer than `window`, 0 when none.
inline double median_window_mean(const std::vector<double>& v, size_t window) {
  if (v.empty() || window == 0) return 0;
  if (v.size() < window) return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  const auto n = static_cast<std::ptrdiff_t>(window);
  std::vector<double> means;
  for (auto w = v.begin(); v.end() - w >= n; w += n)
    means.push_back(std::accumulate(w, w + n, 0.0) / static_cast<double>(n));
  return median(std::move(means));
}

// The window for a run's measured step: `at_least` steps (10: under a CPU quota one step
// runs in a burst and the next waits out the period), rounded up to whole rounds of
// `round` steps under parallel.sync local, so that each window holds one round end per
// round: a window of 10 steps in rounds of 25 held no round end 6 times in 10, and the
// median of such windows left out the outer exchange's wait and the pass.
inline size_t step_window(size_t round, size_t at_least = 10) {
  if (round <= 1) return at_least;
  return (at_least + round - 1) / round * round;
}

}  // namespace ht
