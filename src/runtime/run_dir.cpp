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
  if (!resume) {
    if (!fs::is_empty(rd.checkpoints(), ec))
      fail_as<RunDirInUse>("run directory '", path, "' already holds a run (checkpoints)");
    for (const char* name : {"metrics.jsonl", "summary.json", "config.json", "plan.json"})
      if (fs::exists(rd.file(name)))
        fail_as<RunDirInUse>("run directory '", path, "' already holds a run (", name, ")");
  }
  return rd;
}

}  // namespace ht::runtime
