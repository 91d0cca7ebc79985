#include "runtime/run_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace ht::runtime {

namespace fs = std::filesystem;

RunDir RunDir::open(const std::string& path, bool resume) {
  HT_CHECK(!path.empty(), "the run directory path is empty; expected a directory name");
  RunDir rd;
  rd.path_ = path;
  std::error_code ec;
  fs::create_directories(path, ec);
  HT_CHECK(!ec, "cannot create run directory '", path, "': ", ec.message());
  HT_CHECK(fs::is_directory(path), "run directory '", path, "' exists but is not a directory");
  fs::create_directories(rd.checkpoints(), ec);
  HT_CHECK(!ec, "cannot create '", rd.checkpoints(), "': ", ec.message());
  // Prove writability now rather than after the first hour of training.
  std::string probe = rd.file(".write-test");
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HT_CHECK(fd >= 0, "run directory '", path, "' is not writable: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());

  bool has_metrics = fs::exists(rd.file("metrics.jsonl"));
  bool has_checkpoints = !fs::is_empty(rd.checkpoints(), ec);
  const bool had_run = has_metrics || has_checkpoints || fs::exists(rd.file("summary.json"));
  if (!resume && had_run)
    fail_as<RunDirInUse>("run directory '", path, "' already holds a run (",
                         has_checkpoints ? "checkpoints" : "metrics", ")");
  return rd;
}

}  // namespace ht::runtime
