// Two ranks of one process for the weighted all-reduce's tests: PairComm(0, box) and
// PairComm(1, box) share a mailbox. A send copies its bytes into the mailbox at once (so
// it is complete when posted); a receive takes the oldest message of its (source, tag)
// when tested. Nothing blocks: a test drives both ranks from one thread, calling each
// side's progress in turn. Only point to point is offered; the rest throws.
#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "comm/comm_internal.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace ht::harness {

struct PairMailbox {
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> queue;  // (src, dst, tag)
};

class PairComm final : public comm::Communicator {
 public:
  PairComm(int rank, std::shared_ptr<PairMailbox> box) : rank_(rank), box_(std::move(box)) {}

  int rank() const override { return rank_; }
  int size() const override { return 2; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return 2; }
  std::string host() const override { return "pair"; }
  std::unique_ptr<Communicator> split(int, int, comm::Timeout, std::string_view) override {
    unsupported("split");
  }
  int max_tag() const override { return 32767; }

  comm::Request isend_bytes(const void* data, size_t bytes, int dst, int tag) override {
    const char* p = static_cast<const char*>(data);
    box_->queue[{rank_, dst, tag}].emplace_back(p, p + bytes);
    return comm::Request(std::make_unique<Done>());
  }
  comm::Request irecv_bytes(void* data, size_t bytes, int src, int tag) override {
    return comm::Request(
        std::make_unique<Recv>(box_, std::make_tuple(src, rank_, tag), data, bytes));
  }
  comm::Request irecv_message(std::shared_ptr<std::vector<char>>, int, int) override {
    unsupported("irecv_message");
  }
  comm::WaitStatus allreduce_sum(std::vector<Tensor>&, comm::Timeout) override {
    unsupported("allreduce_sum");
  }
  comm::WaitStatus barrier(comm::Timeout) override { unsupported("barrier"); }
  std::vector<std::string> allgather(const std::string&, comm::Timeout, std::string_view) override {
    unsupported("allgather");
  }
  std::vector<int> roll_call(comm::Timeout) override { unsupported("roll_call"); }
  std::string broadcast(const std::string&, int, comm::Timeout, std::string_view) override {
    unsupported("broadcast");
  }
  void set_link_emulation(std::vector<comm::LinkEmulation>) override {
    unsupported("set_link_emulation");
  }
  const std::vector<comm::LinkEmulation>& link_emulation() const override { return links_; }

 private:
  struct Done final : comm::Request::Impl {
    bool test() override { return true; }
  };
  struct Recv final : comm::Request::Impl {
    Recv(std::shared_ptr<PairMailbox> b, std::tuple<int, int, int> k, void* d, size_t n)
        : box(std::move(b)), key(k), data(d), bytes(n) {}
    bool test() override {
      if (done) return true;
      auto& q = box->queue[key];
      if (q.empty()) return false;
      HT_CHECK(q.front().size() == bytes, "PairComm: a message of ", q.front().size(),
               " bytes for a receive of ", bytes);
      std::memcpy(data, q.front().data(), bytes);
      q.pop_front();
      return done = true;
    }
    bool is_receive() const override { return true; }
    std::shared_ptr<PairMailbox> box;
    std::tuple<int, int, int> key;
    void* data;
    size_t bytes;
    bool done = false;
  };
  [[noreturn]] static void unsupported(const char* what) {
    fail("PairComm: ", what, " is not offered by the test communicator");
  }
  int rank_;
  std::shared_ptr<PairMailbox> box_;
  std::vector<comm::LinkEmulation> links_;
};

}  // namespace ht::harness

#include "comm/weighted_allreduce.h"

namespace ht::harness {

// The weighted all-reduce of `a` (rank 0's tensors) and `b` (rank 1's) over a PairComm,
// weights 1 : 2, both ranks driven from this thread; both end holding the sums.
inline void pair_allreduce(std::vector<Tensor>& a, std::vector<Tensor>& b) {
  auto box = std::make_shared<PairMailbox>();
  PairComm c0(0, box), c1(1, box);
  comm::OverlappedAllreduce r0(c0, {1.0, 2.0}), r1(c1, {1.0, 2.0});
  r0.add(a);
  r1.add(b);
  for (int i = 0; i < 8; ++i) {  // round 1, the sums and round 2 take three turns each
    r0.progress();
    r1.progress();
  }
  HT_CHECK(r0.finish(comm::Timeout(1.0)) == comm::WaitStatus::done &&
               r1.finish(comm::Timeout(1.0)) == comm::WaitStatus::done &&
               r0.drain(comm::Timeout(1.0)) == comm::WaitStatus::done &&
               r1.drain(comm::Timeout(1.0)) == comm::WaitStatus::done,
           "pair_allreduce: the all-reduce did not finish");
}

}  // namespace ht::harness
