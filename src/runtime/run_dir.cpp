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
  // Prove writability now rather than after the first hour of training, with a file of
  // a name no other holds (mkstemp), so that no file of the user's is truncated.
  std::string probe = rd.file(".hetrain-write-test-XXXXXX");
  int fd = ::mkstemp(probe.data());
  HT_CHECK(fd >= 0, "run directory '", path, "' is not writable: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());

  // A new run writes these: a directory holding any of them holds a run, or files of the
  // user's that the run would overwrite.
  if (!resume)
    if (const std::string held = held_by(path); !held.empty())
      fail_as<RunDirInUse>("run directory '", path, "' already holds a run (", held, ")");
  return rd;
}

std::string RunDir::held_by(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path + "/checkpoints", ec) && !fs::is_empty(path + "/checkpoints", ec)) return "checkpoints";
  for (const char* name : kRunFiles)
    if (fs::exists(path + "/" + name, ec)) return name;
  return "";
}

void RunDir::discard_unused(const std::string& path, bool remove_dir) {
  std::error_code ec;
  const std::string checkpoints = path + "/checkpoints", metrics = path + "/metrics.jsonl";
  if (fs::exists(checkpoints, ec) && !fs::is_empty(checkpoints, ec)) return;
  if (fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0) return;
  for (const char* name : kRunFiles) fs::remove(path + "/" + name, ec);
  fs::remove(checkpoints, ec);  // only when empty, as fs::remove does for a directory
  if (remove_dir) fs::remove(path, ec);
}

}  // namespace ht::runtime
