#include "report/metrics_log.h"

#include <stdio_ext.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ht::report {

namespace {

// The file's length without a last line that lacks its newline: a record cut short by a
// write that failed (a full disk) or a process killed mid-line. Appending after it would
// join the next record onto it and leave one line that is not JSON.
long whole_lines_length(std::FILE* f, const std::string& path) {
  HT_CHECK(std::fseek(f, 0, SEEK_END) == 0, "cannot seek in metrics log '", path, "': ", std::strerror(errno));
  long end = std::ftell(f);
  HT_CHECK(end >= 0, "cannot read the length of metrics log '", path, "': ", std::strerror(errno));
  while (end > 0) {
    HT_CHECK(std::fseek(f, end - 1, SEEK_SET) == 0, "cannot seek in metrics log '", path, "': ", std::strerror(errno));
    const int c = std::fgetc(f);
    HT_CHECK(c != EOF, "cannot read metrics log '", path, "': ", std::strerror(errno));
    if (c == '\n') break;
    --end;
  }
  return end;
}

void truncate_to(std::FILE* f, long length, const std::string& path) {
  HT_CHECK(::ftruncate(::fileno(f), length) == 0, "cannot truncate metrics log '", path, "' to ", length,
           " bytes: ", std::strerror(errno));
  HT_CHECK(std::fseek(f, 0, SEEK_END) == 0, "cannot seek in metrics log '", path, "': ", std::strerror(errno));
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "a+")) {
  HT_CHECK(file_, "cannot open metrics log '", path, "' for appending: ", std::strerror(errno));
  struct stat sb {};
  HT_CHECK(::fstat(::fileno(file_), &sb) == 0 && S_ISREG(sb.st_mode), "metrics log '", path,
           "' is not a regular file; expected the run directory's metrics.jsonl");
  const long whole = whole_lines_length(file_, path);
  if (whole < sb.st_size) truncate_to(file_, whole, path);
  // Between reading and writing an update stream: a seek (appends go to the end anyway).
  HT_CHECK(std::fseek(file_, 0, SEEK_END) == 0, "cannot seek in metrics log '", path, "': ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const std::string& json_object) {
  const long before = std::ftell(file_);
  const bool ok = std::fputs(json_object.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF &&
                  std::fflush(file_) == 0;
  if (!ok) {
    const int err = errno;
    // Whatever part of the line reached the file comes off again, so that the log stays
    // whole lines (the constructor's repair covers a process killed here instead).
    // The buffer's unwritten rest is dropped too, or closing the file would write it.
    __fpurge(file_);
    std::clearerr(file_);
    if (before >= 0) (void)::ftruncate(::fileno(file_), before);
    fail("cannot write to metrics log '", path_, "': ", std::strerror(err));
  }
}

}  // namespace ht::report
