// The run directory: resolved config, metrics.jsonl, summary.json and checkpoints/.
// Opening one never destroys a previous run: a directory that already holds one is
// refused unless the run is being resumed, and one that another hetrain process has open
// (its lock, .hetrain.lock, held with flock) is refused either way: two runs started at
// once into one directory wrote into each other's files, and the one refused removed the
// other's as its own.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"

namespace ht::runtime {

// A new run refused because the directory holds an earlier one; the caller, which knows
// how a user resumes or picks another directory, says so.
class RunDirInUse : public Error {
 public:
  using Error::Error;
};

class RunDir {
 public:
  RunDir() = default;
  RunDir(RunDir&& other) noexcept : path_(std::move(other.path_)), lock_fd_(other.lock_fd_) { other.lock_fd_ = -1; }
  RunDir& operator=(RunDir&&) = delete;
  RunDir(const RunDir&) = delete;
  ~RunDir();
  // The lock's file name in the run directory.
  static constexpr const char* kLockFile = ".hetrain.lock";
  // Creates `path` (and parents) for a new run, or opens it to resume one. Throws
  // naming the path and the reason when it cannot be created or written, and
  // RunDirInUse when a new run would overwrite an earlier one.
  static RunDir open(const std::string& path, bool resume);
  // The files a new run writes into its directory (beside checkpoints/).
  static constexpr const char* kRunFiles[] = {"metrics.jsonl", "summary.json", "config.json", "plan.json"};
  // Whether `path` holds a run's files or checkpoints.
  static bool holds_run(const std::string& path) { return !held_by(path).empty(); }
  // The first of them that `path` holds ("checkpoints" for any checkpoint), or "".
  static std::string held_by(const std::string& path);
  // After a new run into `path` failed: where it trained no step worth keeping (no
  // checkpoint, no metrics record) the files it wrote go, and `path` itself when
  // `remove_dir` and nothing else is in it, so that the next try is not refused as
  // "already holds a run". The caller knows `path` held no run before (holds_run).
  // Nothing is touched while another process holds the directory's lock: the files are
  // then that process's.
  static void discard_unused(const std::string& path, bool remove_dir);

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string checkpoints() const { return file("checkpoints"); }

 private:
  std::string path_;
  int lock_fd_ = -1;  // holds the flock for the run's life
};

}  // namespace ht::runtime
