#include "core/units.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace ht {

std::string number(const char* format, ...) {
  // Sized by a first pass: a "%.2f" of 1e300 is 304 characters, and a fixed buffer cut
  // it short without a sign that it had.
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

std::string format_bytes(double bytes) {
  constexpr double kib = 1024, mib = kib * 1024, gib = mib * 1024;
  if (bytes >= 1e6 * gib) return number("%.3g GiB", bytes / gib);
  if (bytes >= gib) return number("%.2f GiB", bytes / gib);
  if (bytes >= mib) return number("%.1f MiB", bytes / mib);
  if (bytes >= kib) return number("%.1f KiB", bytes / kib);
  return number("%.0f B", bytes);
}

std::string format_seconds(double s) {
  // By magnitude: a negative duration (time gained) reads in the unit of its size. None at
  // all is "0 s" (as "0.0 µs" it read as a measured sliver, -0 as time gained).
  if (s == 0) return "0 s";
  if (std::fabs(s) < 1e-3) return number("%.1f µs", s * 1e6);
  if (std::fabs(s) < 1) return number("%.2f ms", s * 1e3);
  if (std::fabs(s) < 1e6) return number("%.2f s", s);
  return number("%.3g s", s);  // past a million seconds (or inf, nan): an exponent, never cut short
}

std::string join(const std::vector<int64_t>& items, const std::string& separator) {
  std::string out;
  for (int64_t x : items) out += (out.empty() ? "" : separator) + std::to_string(x);
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i < 2) j = i;  // a run of one or two: one by one
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace ht
