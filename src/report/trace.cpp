#include "report/trace.h"

#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ht::report {

namespace {

bool known_category(const std::string& c) {
  return c == "compute" || c == "comm" || c == "idle";
}

}  // namespace

std::string to_chrome_trace(const std::vector<Span>& spans, const std::string& title) {
  using nlohmann::json;
  json events = json::array();
  std::set<int> lanes;  // ordered, so the metadata events come out in rank order
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    HT_CHECK(s.rank >= 0, "to_chrome_trace: span ", i, " (", s.name, ") has rank ", s.rank,
             "; expected >= 0");
    HT_CHECK(s.end_s >= s.start_s, "to_chrome_trace: span ", i, " (", s.name, " on rank ",
             s.rank, ") ends at ", s.end_s, " s before it starts at ", s.start_s, " s");
    HT_CHECK(known_category(s.category), "to_chrome_trace: span ", i, " (", s.name,
             ") has category '", s.category, "'; expected compute, comm or idle");
    lanes.insert(s.rank);
    // Chrome's trace format counts in microseconds; fractional values are allowed and keep
    // sub-microsecond predictions (small messages) visible rather than rounding them to 0.
    events.push_back({{"name", s.name},
                      {"cat", s.category},
                      {"ph", "X"},
                      {"ts", s.start_s * 1e6},
                      {"dur", (s.end_s - s.start_s) * 1e6},
                      {"pid", 0},
                      {"tid", s.rank},
                      {"args", {{"micro_batch", s.micro_batch}, {"stage", s.stage}}}});
  }
  for (int rank : lanes) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    // Without a sort index viewers order lanes by first appearance, not by rank.
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", rank},
                      {"args", {{"sort_index", rank}}}});
  }
  const json trace = {{"traceEvents", std::move(events)},
                      {"displayTimeUnit", "ms"},
                      {"otherData", {{"title", title}}}};
  return trace.dump();
}

}  // namespace ht::report
