// metrics.jsonl: one JSON object per line, one line per logged step or evaluation.
// Records are open to new keys (later issues add per-rank timings); readers must
// ignore keys they do not know. Each line is flushed as written, so a killed run
// keeps every record it logged.
#pragma once

#include <cstdio>
#include <string>

namespace ht::report {

class MetricsLog {
 public:
  // Appends to `path` (a resumed run continues the same file).
  explicit MetricsLog(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // `json_object` is one serialised JSON object (no newline).
  void write(const std::string& json_object);

 private:
  std::string path_;
  std::FILE* file_;
};

}  // namespace ht::report
