#include "comm/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace ht::comm {

std::shared_ptr<std::byte> map_shared(Communicator& comm, int owner, size_t bytes, bool willing, Timeout timeout,
                                      std::string* why) {
  HT_CHECK(owner >= 0 && owner < comm.size(), "map_shared: owner ", owner, " of ", comm.size(),
           " ranks; expected one of them");
  HT_CHECK(bytes > 0, "map_shared: 0 bytes; expected some");
  auto refuse = [why](std::string reason) {
    if (why) *why = std::move(reason);
    return std::shared_ptr<std::byte>();
  };
  const std::vector<std::string> hosts = comm.allgather(std::string(willing ? "1" : "0") + comm.host(), timeout,
                                                            "the shared-memory hosts check");
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (hosts[r][0] == '0') return refuse("rank " + std::to_string(r) + " keeps its own copy");
    if (hosts[r] != hosts[0])
      return refuse("ranks on hosts " + hosts[0].substr(1) + " and " + hosts[r].substr(1));
  }
  for (const LinkEmulation& l : comm.link_emulation())
    if (l.active()) return refuse("the links are emulated, and shared memory would bypass them");

  // The owner names and sizes the memory; every member then maps it and says how it went.
  static std::atomic<unsigned> made{0};
  std::string name, error;
  if (comm.rank() == owner) {
    name = "/hetrain-shared-" + std::to_string(getpid()) + "-" + std::to_string(made++);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    // posix_fallocate reserves the pages: a /dev/shm too small for them refuses here,
    // where after ftruncate alone the first touch of a missing page would be a SIGBUS.
    int err = 0;
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) err = errno;
    else err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      error = "cannot create " + std::to_string(bytes) + " bytes of shared memory " + name + ": " +
              std::strerror(err);
      if (fd >= 0) {
        close(fd);
        shm_unlink(name.c_str());
      }
      name.clear();
    } else {
      close(fd);
    }
  }
  name = comm.allgather(name, timeout, "the shared memory's name")[static_cast<size_t>(owner)];
  void* at = MAP_FAILED;
  if (!name.empty()) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd >= 0) at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) error = "cannot map shared memory " + name + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
  }
  const std::vector<std::string> errors = comm.allgather(error, timeout, "the shared memory's mapping");
  if (comm.rank() == owner && !name.empty()) shm_unlink(name.c_str());
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) {
      if (at != MAP_FAILED) munmap(at, bytes);
      return refuse("rank " + std::to_string(r) + ": " + errors[r]);
    }
  return {static_cast<std::byte*>(at), [bytes](std::byte* p) { munmap(p, bytes); }};
}

}  // namespace ht::comm
