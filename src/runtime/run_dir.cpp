#include "runtime/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace ht::runtime {

namespace fs = std::filesystem;

namespace {

// Opens `dir`'s lock file and takes its flock without waiting: the descriptor, or -1 when
// another process holds it (then `holder` is what that process wrote into it).
int take_lock(const std::string& dir, std::string& holder) {
  const std::string path = dir + "/" + RunDir::kLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  HT_CHECK(fd >= 0, "cannot open the run directory's lock ", path, ": ", std::strerror(errno));
  // A filesystem without flock (ENOLCK, EOPNOTSUPP) runs unlocked, as it did before locks.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    char buf[256] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

RunDir::~RunDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock; the file stays, empty of meaning
}

RunDir RunDir::open(const std::string& path, bool resume) {
  HT_CHECK(!path.empty(), "the run directory path is empty; expected a directory name");
  RunDir rd;
  rd.path_ = path;
  std::error_code ec;
  fs::create_directories(path, ec);
  HT_CHECK(!ec, "cannot create run directory '", path, "': ", ec.message());
  HT_CHECK(fs::is_directory(path), "run directory '", path, "' exists but is not a directory");
  const bool had_checkpoints = fs::exists(rd.checkpoints(), ec);
  fs::create_directories(rd.checkpoints(), ec);
  HT_CHECK(!ec, "cannot create '", rd.checkpoints(), "': ", ec.message());
  // Prove writability now rather than after the first hour of training, with a file of
  // a name no other holds (mkstemp), so that no file of the user's is truncated.
  std::string probe = rd.file(".hetrain-write-test-XXXXXX");
  int fd = ::mkstemp(probe.data());
  HT_CHECK(fd >= 0, "run directory '", path, "' is not writable: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  std::string holder;
  const bool had_lock_file = fs::exists(rd.file(kLockFile), ec);
  rd.lock_fd_ = take_lock(path, holder);
  if (rd.lock_fd_ < 0)
    fail("run directory '", path, "' is in use by another hetrain process (",
         holder.empty() ? std::string("it holds ") + kLockFile : holder,
         "); expected one run in a directory at a time: wait for it to end, or use another run directory");
  // Who holds it, for the message of a process refused while it does.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host;
  if (::ftruncate(rd.lock_fd_, 0) == 0 && ::pwrite(rd.lock_fd_, me.data(), me.size(), 0) < 0) {
    // What it holds is for messages only; the lock is the flock.
  }

  // A new run writes these: a directory holding any of them holds a run, or files of the
  // user's that the run would overwrite.
  if (!resume)
    if (const std::string held = held_by(path); !held.empty()) {
      // Refused, it leaves the directory as it found it: no lock file or empty
      // checkpoints/ of its own behind.
      if (!had_lock_file) ::unlink(rd.file(kLockFile).c_str());
      if (!had_checkpoints) fs::remove(rd.checkpoints(), ec);
      fail_as<RunDirInUse>("run directory '", path, "' already holds a run (", held, ")");
    }
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
  if (!fs::is_directory(path, ec)) return;
  std::string holder;
  int lock = -1;
  try {
    lock = take_lock(path, holder);
  } catch (const Error&) {
    return;  // a lock that cannot even be opened: leave everything as it is
  }
  if (lock < 0) return;  // another process's run: its files are not this one's to take
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock};
  const std::string checkpoints = path + "/checkpoints", metrics = path + "/metrics.jsonl";
  if (fs::exists(checkpoints, ec) && !fs::is_empty(checkpoints, ec)) return;
  if (fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0) return;
  for (const char* name : kRunFiles) fs::remove(path + "/" + name, ec);
  fs::remove(checkpoints, ec);  // only when empty, as fs::remove does for a directory
  fs::remove(path + "/" + kLockFile, ec);  // the run's too: a directory of the user's is left as it was
  if (remove_dir) fs::remove(path, ec);
}

}  // namespace ht::runtime
