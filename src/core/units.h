// Numbers for people: the one spelling of bytes and durations in tables, messages and
// pictures. It sits in core because error messages at every layer (the allocator's cap,
// the planner's shortfalls) spell sizes too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

// printf for numbers only (text is concatenated), so a small buffer always suffices.
[[gnu::format(printf, 1, 2)]] std::string number(const char* format, ...);

// 1024-based units: "512 B", "1.5 KiB", "310.0 MiB", "1.25 GiB".
std::string format_bytes(double bytes);

// "12.3 µs", "4.56 ms", "1.23 s".
std::string format_seconds(double seconds);

// Numbers joined for people: "0, 2, 3" (ranks), or with "/" "64/32/16/16" (shares).
std::string join(const std::vector<int64_t>& items, const std::string& separator = ", ");

// Ranks for people: ascending runs of three or more as "a-b", others one by one,
// "0-11, 16, 17" (a volunteer pool's 56 idle ranks were a line of 56 numbers, thousands
// at scale).
std::string join_ranks(const std::vector<int>& ranks);

}  // namespace ht
