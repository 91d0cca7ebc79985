// Small statistics shared by the planner and the runtime.
#pragma once

#include <algorithm>
#include <cstddef>
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
  std::vector<double> means;
  for (size_t i = 0; i + window <= v.size(); i += window) {
    double sum = 0;
    for (size_t k = i; k < i + window; ++k) sum += v[k];
    means.push_back(sum / static_cast<double>(window));
  }
  if (means.empty()) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  }
  return median(std::move(means));
}

}  // namespace ht
