// A validator for integer options. CLI11 (2.1, Debian's) converts with strtoll/strtoull in
// base 0, so "010" was read as 8, "-1" as 2^64 - 1 for an unsigned option, an overflow as
// the largest value, and "" as 0, each without a word. This checks the text itself first:
// decimal digits (a leading '-' where the range allows it), within [lo, hi], and hands
// CLI11 the canonical form ("010" -> "10"), so that its conversion cannot differ (attach
// it with transform(): check() hands a validator a copy).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>

namespace hetrain_cli {

template <typename T>
CLI::Validator whole_number(T lo, T hi) {
  const std::string range = "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        T v{};
        const char* end = text.data() + text.size();
        const auto [at, ec] = std::from_chars(text.data(), end, v, 10);
        // from_chars takes no '+', spaces or base prefix: any of them stops it short.
        if (text.empty() || at != end) return "'" + text + "' is not " + range;
        if (ec == std::errc::result_out_of_range || v < lo || v > hi) return text + " is out of range; expected " + range;
        text = std::to_string(v);
        return {};
      },
      "", "whole_number");
}

}  // namespace hetrain_cli
