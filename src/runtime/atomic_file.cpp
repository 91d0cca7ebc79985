#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace ht::runtime {

namespace {
std::string os_reason(int err) { return std::system_category().message(err); }
}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Written through a link: the rename would replace the link itself and leave the file
  // it names as it was.
  if (fs::is_symlink(fs::symlink_status(path_, ec))) {
    const fs::path target = fs::weakly_canonical(path_, ec);
    if (!ec) path_ = target.string();
  }
  // The rename would put a plain file where a device (/dev/null as root), a pipe or a
  // socket was.
  const fs::file_status st = fs::status(path_, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    fail("cannot write ", what_, " ", path_,
         ": it is not a regular file (a directory, device, pipe or socket), which writing there would replace; "
         "expected a regular file path (nothing was written)");
  tmp_ = path_ + ".tmp";
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_os("creating", errno);
}

AtomicFile::~AtomicFile() { abandon(); }

void AtomicFile::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_) ::unlink(tmp_.c_str());  // may not exist (open failed): harmless
}

void AtomicFile::fail_os(const char* doing, int err) {
  abandon();
  fail("cannot write ", what_, " ", path_, ": ", os_reason(err), " (while ", doing, " ", tmp_,
       "; any existing file at ", path_, " is unchanged)");
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    // A short write is legal; the next call then reports why (ENOSPC, EFBIG). A write
    // of 0 bytes would loop forever, so treat it as a full device.
    if (n <= 0) fail_os("writing", n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_os("writing", n < 0 ? errno : ENOSPC);
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  HT_CHECK(fd_ >= 0 && !committed_, "AtomicFile::commit: ", tmp_, " is not open");
  // Without the fsync the rename could reach the disk before the data, and a crash would
  // leave a complete-looking file full of zeros.
  if (::fsync(fd_) != 0) fail_os("syncing", errno);
  int fd = fd_;
  fd_ = -1;
  // close() can report a deferred write error (NFS, quota), so it is checked too.
  if (::close(fd) != 0) fail_os("closing", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_os("renaming", errno);
  committed_ = true;

  std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = dfd < 0 ? errno : 0;
  if (dfd >= 0 && ::fsync(dfd) != 0) err = errno;
  if (dfd >= 0) ::close(dfd);
  // EINVAL: the filesystem cannot sync directories; nothing more can be done there.
  if (err != 0 && err != EINVAL)
    fail("wrote ", what_, " ", path_, " but could not sync its directory ", dir, ": ",
         os_reason(err), " (the new file may not survive a power loss)");
}

void write_file_atomically(const std::string& path, const std::string& content,
                           const std::string& what) {
  AtomicFile file(path, what);
  file.write(content.data(), content.size());
  file.commit();
}

}  // namespace ht::runtime
