// The communicator over OpenMPI (C API). Errors come back as return codes
// (MPI_ERRORS_RETURN on every communicator made here) and are raised as ht::Error
// carrying MPI_Error_string. Every wait polls with MPI_Test and a backoff, so a wait
// with a deadline reports a miss as a status, and waiting ranks leave the cores to
// computing ones.
//
// Receives match by probing (MPI_Improbe, then MPI_Imrecv of the probed size) rather
// than by a pre-posted MPI_Irecv: a receive buffer shorter than the message is a
// memory overwrite in OpenMPI 4.1.4 on one host (measured: a 10 kB message into a
// 16-byte MPI_Irecv wrote past the buffer), so the size is checked before any byte is
// written, and a receive withdrawn at its deadline has nothing to cancel.
#pragma once

#include <mpi.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_internal.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace ht::comm {

// MPI's text for an error code, with the code.
std::string mpi_error_string(int rc);

// Raises ht::Error of `parts` + " failed: " + MPI's text unless rc is MPI_SUCCESS.
template <class... Parts>
void check_mpi(int rc, const Parts&... parts) {
  if (rc != MPI_SUCCESS) [[unlikely]]
    fail(parts..., " failed: ", mpi_error_string(rc));
}

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

struct HostInfo {
  int local_rank = 0;
  int local_size = 1;
  std::string host;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` and sets its error handler to MPI_ERRORS_RETURN. Collective
  // over `comm` when `with_control`: duplicates it for the control messages (consult,
  // allgather, split's agreement), which thus have their own matching space and no link
  // emulation.
  MpiCommunicator(MPI_Comm comm, HostInfo host, std::vector<LinkEmulation> links,
                  bool with_control = true);
  // The world: a duplicate of MPI_COMM_WORLD (our error handler and tags stay ours),
  // with local rank and size from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
  static std::unique_ptr<MpiCommunicator> make_world();
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return host_.local_rank; }
  int local_size() const override { return host_.local_size; }
  std::string host() const override { return host_.host; }
  // A bounded allgather of the colours comes first, so that every rank is known to have
  // arrived; then MPI_Comm_split (see mpi_collectives.cpp for what that leaves unbounded).
  std::unique_ptr<Communicator> split(int color, int key, Timeout timeout, std::string_view what) override;
  int world_rank(int rank) const override { return world_rank_.at(static_cast<size_t>(rank)); }
  int max_tag() const override { return max_tag_; }

  Request isend_bytes(const void* data, size_t bytes, int dst, int tag) override;
  Request irecv_bytes(void* data, size_t bytes, int src, int tag) override;
  Request irecv_message(std::shared_ptr<std::vector<char>> into, int src, int tag) override;

  WaitStatus allreduce_sum(std::vector<Tensor>& buckets, Timeout timeout) override;
  WaitStatus barrier(Timeout timeout) override;
  // Point to point on the control communicator: every rank sends its item to every other
  // one, so that a rank that misses the deadline knows whose items did not come.
  std::vector<std::string> allgather(const std::string& mine, Timeout timeout, std::string_view what) override;
  std::vector<int> roll_call(Timeout grace) override;
  // Point to point on the control communicator, from the root to each other rank.
  std::string broadcast(const std::string& text, int root, Timeout timeout, std::string_view what) override;
  // Point to point on the control communicator, each consultation with its own tag.
  std::unique_ptr<Consultation> consult(const std::string& mine) override;

  void set_link_emulation(std::vector<LinkEmulation> links) override;
  const std::vector<LinkEmulation>& link_emulation() const override { return links_; }

  MPI_Comm handle() const { return comm_; }

 private:
  friend class MpiRecv;
  struct PendingRecv;
  class Delivery;  // the emulation thread that posts delayed sends
  // Requests and buffers of collectives abandoned at a deadline: MPI may still use them.
  struct Graveyard {
    std::vector<MPI_Request> requests;
    std::vector<std::vector<float>> buffers;
  };

  Request post(std::shared_ptr<PendingRecv> r);
  // Matches probed messages of (src, tag) to receives in posting order. Holds recv_mutex_.
  void match_locked(int src, int tag);
  bool test_recv(PendingRecv& r);
  bool expire_recv(PendingRecv& r);
  // Keeps an abandoned receive (and its buffers) for the process's life, past this
  // communicator's own: MPI may still write into it.
  static void bury(std::shared_ptr<PendingRecv> r) { (void)new std::shared_ptr<PendingRecv>(std::move(r)); }

  // Emulation: the time a message of `bytes` to `dst` may be posted. Holds emu_mutex_.
  Clock::time_point due_locked(size_t bytes, int dst);
  std::vector<LinkEmulation> links_snapshot() const;

  void check_usable(const char* op) const;
  // Sends `item` to every other rank and receives each one's on a fresh control tag, until
  // `deadline`; fills `got` (by rank) and returns the world ranks not heard from or not
  // reached, ascending. Sends left pending keep `item` alive for good.
  std::vector<int> swap_with_all(const std::shared_ptr<const std::string>& item,
                                 std::vector<std::shared_ptr<std::vector<char>>>& got, Deadline deadline);
  // Polls the collective's requests until they are done and `not_before` has passed.
  // At the deadline, requests still running are kept (MPI cannot cancel a collective)
  // together with `buffers`, and the communicator is marked unusable.
  WaitStatus wait_collective(std::vector<MPI_Request>& reqs,
                             std::vector<std::vector<float>>& buffers, Clock::time_point not_before,
                             Deadline deadline, const char* op);

  MPI_Comm comm_;
  HostInfo host_;
  int rank_ = 0, size_ = 1, max_tag_ = 32767;
  std::vector<int> world_rank_;  // per rank: its rank in MPI_COMM_WORLD (the doorbell's)

  std::mutex recv_mutex_;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<PendingRecv>>> recv_queues_;

  mutable std::mutex emu_mutex_;
  std::vector<LinkEmulation> links_;
  std::vector<Clock::time_point> path_free_;  // per destination: emulated path busy until
  std::vector<Clock::time_point> last_due_;   // per destination: keeps send order
  std::unique_ptr<Delivery> delivery_;        // started by the first emulated send

  std::string abandoned_;  // why collectives are refused; empty while usable
  std::unique_ptr<Graveyard> graveyard_;
  std::unique_ptr<MpiCommunicator> control_;  // consult, allgather and split's messages
  // The next control tag. Every rank makes its control exchanges in one order (they are
  // collective), so the counters agree and each exchange has a tag of its own.
  int64_t control_seq_ = 0;
  int next_control_tag();
};

}  // namespace ht::comm
