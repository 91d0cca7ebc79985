// A weighted all-reduce through one host's shared memory, one exchange in flight at a
// time: the outer exchange of parallel.sync local (runtime/local_sync.h) where every
// member is on one host.
//
// Why: over messages (OverlappedAllreduce) each member receives every peer's copy of
// its part and then the other owners' sums, every byte copied by the receiving CPU, and
// on the MLP at 0.8/0.4/0.2/0.2 that was most of a rank's outer work (rank 0, which owns
// 57% of the parts: 6.4 ms of CPU a round, 1.5 of them its pass; 2.3 through this). Here
// a member writes its contribution once, where the owners read it, and reads the sums
// where the owners wrote them.
//
// How: the mapping holds two generations, by the exchange's number's parity, each a row
// of every tensor per member (contributions) and one more (the sums), and two counters
// per member: the last exchange it posted, the last whose parts it summed. Exchange e's
// owner of a part (part_offsets over the weights, tensor by tensor, as OverlappedAllreduce
// parts them) sums it once every member has posted e: its own contribution, then the
// others' in rank order, so the sums are bit-identical with OverlappedAllreduce's. A
// generation is reused by exchange e + 2, which no member posts before it has seen
// every part of e + 1 summed, and no owner sums before every member posted it, so
// before then every member has finished with e's sums and contributions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ht::comm {

class SharedAllreduce {
 public:
  // Collective over `comm`: maps the board for tensors of `sizes` float32 elements (the
  // same on every member): 2 x (members + 1) rows of them. Null on every member, with the
  // reason in `*why`, where a member's board would exceed a quarter of its host's memory
  // or map_shared refuses (members on different hosts, emulated links, no shared memory).
  static std::unique_ptr<SharedAllreduce> make(Communicator& comm, const std::vector<int64_t>& sizes,
                                               Timeout timeout, std::string* why = nullptr);

  // Where this rank writes its contribution of tensor `t` to exchange `e` (numbered
  // from 1, consecutively, on every member alike) before post(e).
  float* contribution(int64_t e, size_t t) const;
  // Exchange e's sums of tensor t, from finish() of e (done) until this rank posts
  // e + 2 (others may sum it once every member has).
  const float* sums(int64_t e, size_t t) const;
  // This rank's contributions to exchange e are written. `weights`: one per member, the
  // same on every member (as OverlappedAllreduce's), parting each tensor among owners.
  void post(int64_t e, std::vector<double> weights);
  // Sums this rank's parts of the posted exchange once every member has posted it;
  // never waits. Whether it summed.
  bool progress();
  // Waits (up to `timeout`) until every part of the posted exchange is summed.
  WaitStatus finish(Timeout timeout);
  // After a finish that timed out: the members (world ranks) that had not posted the
  // exchange, or where all had, those that had not summed their parts of it.
  std::vector<int> missing() const;
  int64_t posted() const { return posted_; }

 private:
  SharedAllreduce() = default;
  int64_t* counter(int member, int which) const;  // which: 0 posted, 1 summed
  float* row(int64_t e, int member) const;          // member == size: the sums
  void ring_others() const;
  std::shared_ptr<std::byte> memory_;
  std::vector<int64_t> sizes_, offsets_;  // offsets_: each tensor's start in a row, in floats
  int64_t row_floats_ = 0;
  int members_ = 0, me_ = 0;
  std::vector<int> world_ranks_;
  std::vector<double> weights_;
  // This rank's last exchange posted, summed its parts of, and seen finished.
  int64_t posted_ = 0, summed_ = 0, finished_ = 0;
};

}  // namespace ht::comm
