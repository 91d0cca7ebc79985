// The world of one process, used when the program runs without mpirun: sends to self go
// through an in-process queue, allreduce is the identity and barriers return at once.
// Link emulation applies to sends to self (2 x latency + bytes / bandwidth), so code
// that reacts to slow links can be tried in a single process.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ht::comm {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::vector<LinkEmulation> links = {});

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string host() const override;
  std::unique_ptr<Communicator> split(int color, int key, Timeout timeout, std::string_view what) override;
  int max_tag() const override;

  Request isend_bytes(const void* data, size_t bytes, int dst, int tag) override;
  Request irecv_bytes(void* data, size_t bytes, int src, int tag) override;
  Request irecv_message(std::shared_ptr<std::vector<char>> into, int src, int tag) override;

  WaitStatus allreduce_sum(std::vector<Tensor>& buckets, Timeout timeout) override;
  WaitStatus barrier(Timeout timeout) override;
  std::vector<std::string> allgather(const std::string& mine, Timeout timeout, std::string_view what) override;
  std::vector<int> roll_call(Timeout grace) override;
  std::string broadcast(const std::string& text, int root, Timeout timeout, std::string_view what) override;

  void set_link_emulation(std::vector<LinkEmulation> links) override;
  const std::vector<LinkEmulation>& link_emulation() const override { return links_; }

 private:
  friend class LocalRecv;

  struct Message {
    Clock::time_point due;  // emulated arrival; now when emulation is off
    std::vector<char> bytes;
  };
  struct PendingRecv {
    void* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<std::vector<char>> any;  // irecv_message: takes any size
    int tag = 0;
    bool done = false, cancelled = false;
    std::string error;
  };

  Request post(std::shared_ptr<PendingRecv> recv);
  // Hands arrived messages of `tag` to receives in posting order. Caller holds mutex_.
  void match_locked(int tag);
  bool test_recv(PendingRecv& r);
  bool expire_recv(PendingRecv& r);

  std::mutex mutex_;
  std::map<int, std::deque<Message>> messages_;                     // by tag
  std::map<int, std::deque<std::shared_ptr<PendingRecv>>> posted_;  // by tag
  std::vector<LinkEmulation> links_;
  Clock::time_point path_free_{};  // emulation: when the path to self is free again
  Clock::time_point last_due_{};   // keeps emulated messages in send order
};

}  // namespace ht::comm
