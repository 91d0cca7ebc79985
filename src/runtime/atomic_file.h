// Replace a file so that readers (and a crash at any moment) see either the complete old
// contents or the complete new ones, never a mix: data goes to `path + ".tmp"` in the same
// directory (so the rename cannot cross filesystems), is fsynced, renamed over `path`, and
// the directory is fsynced so the rename itself survives a power loss. A link is written
// through (the file it names is replaced); a path that exists as no regular file (a
// directory, a device such as /dev/null, a pipe) is refused before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ht::runtime {

class AtomicFile {
 public:
  // Creates (truncates) the temporary file. `what` names the file in errors ("checkpoint").
  AtomicFile(std::string path, std::string what);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Each checks every OS call. On failure the temporary file is removed, `path` is left
  // as it was, and an ht::Error names `path` and the OS reason ("File too large",
  // "No space left on device", "Permission denied", ...).
  void write(const void* data, size_t bytes);                 // appends
  void write_at(uint64_t offset, const void* data, size_t bytes);  // overwrites in place
  void commit();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail_os(const char* doing, int err);
  void abandon() noexcept;

  std::string path_, tmp_, what_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole of `content` as one AtomicFile: readers see the old file or the new one.
void write_file_atomically(const std::string& path, const std::string& content,
                           const std::string& what);

}  // namespace ht::runtime
