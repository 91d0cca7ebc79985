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

}  // namespace ht
