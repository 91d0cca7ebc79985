#include "report/metrics_log.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ht::report {

MetricsLog::MetricsLog(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "a")) {
  HT_CHECK(file_, "cannot open metrics log '", path, "' for appending: ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const std::string& json_object) {
  bool ok = std::fputs(json_object.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF &&
            std::fflush(file_) == 0;
  HT_CHECK(ok, "cannot write to metrics log '", path_, "': ", std::strerror(errno));
}

}  // namespace ht::report
