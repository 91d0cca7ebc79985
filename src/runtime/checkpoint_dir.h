// A run's checkpoints/ folder: ckpt-<step, 8+ digits>.safetensors files, the newest
// `keep` of them retained, and resume from the newest one that verifies.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"

namespace ht::runtime {

struct CheckpointFile {
  int64_t step = 0;
  std::string path;
  // Empty for a regular file; else what the entry of a checkpoint's name is instead ("a
  // directory", "a link to nothing", ...): such an entry is never loaded or deleted.
  std::string not_a_file;
};

class CheckpointDir {
 public:
  // `keep` >= 1. Nothing touches the disk until save() or list().
  explicit CheckpointDir(std::string dir, int64_t keep = 3);

  const std::string& dir() const { return dir_; }
  int64_t keep() const { return keep_; }
  // <dir>/ckpt-00000042.safetensors
  std::string path_for(int64_t step) const;

  // Writes the checkpoint for `step` atomically (creating the directory if needed), then
  // deletes the oldest checkpoints beyond `keep` among those of steps up to `step` (this
  // run's line: a higher step is of a future a resume left, which only an unreadable file
  // can be, as a readable one would have been resumed), never the one just written, never
  // one load_newest_valid passed over as unreadable (it is the user's to look at, and no
  // checkpoint to count) and never a file that does not match the name pattern. Such a
  // file at `step` itself is first renamed to <path>.unreadable (.unreadable.N where that
  // is taken; said on stderr), so that the new checkpoint neither replaces it nor goes
  // uncounted. A failed save deletes nothing. Returns the path written.
  std::string save(int64_t step, const std::vector<nn::NamedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata = {});
  // The same, for a checkpoint written as its tensors come: `fill` writes every slot
  // (CheckpointWriter::write); whatever it throws leaves no file and deletes nothing.
  std::string save(int64_t step, std::vector<CheckpointSlot> slots, const std::map<std::string, std::string>& metadata,
                   const std::function<void(CheckpointWriter&)>& fill);

  // Checkpoint files by ascending step; empty when the directory does not exist. With
  // `all`, entries of a checkpoint's name that are not regular files too (not_a_file).
  std::vector<CheckpointFile> list(bool all = false) const;

  // Reads checkpoints newest first and returns the first that verifies and whose metadata
  // step (where it has one) is its name's. Each one passed over (an entry of a
  // checkpoint's name that is no file included, later set aside as save says) is appended to
  // `skipped` as "<path>: <problem>; using <file>". Empty when there are no such entries;
  // throws ht::Error listing every attempt when none verifies.
  // keep_values as read_checkpoint's.
  std::optional<Checkpoint> load_newest_valid(std::vector<std::string>& skipped, bool keep_values = true);

  // Removes the partial writes (<checkpoint name>.tmp, regular files) that a run stopped
  // while writing left: never a checkpoint (the rename that makes one never came), and
  // 30-40 MB each of the MLP's. Only by the process holding the run directory's lock, so
  // that no write of its is in progress. Returns how many it removed.
  int remove_partial_writes() const;

 private:
  std::string prepare(int64_t step);               // the directory made, an unreadable file set aside
  void retain(int64_t step, const std::string& path);  // the oldest beyond keep deleted

  std::string dir_;
  int64_t keep_;
  std::set<std::string> passed_over_;  // paths load_newest_valid could not read
};

}  // namespace ht::runtime
