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

}  // namespace ht
