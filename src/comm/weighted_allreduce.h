// A sum all-reduce for ranks of unequal speed, built from point-to-point messages.
//
// Each tensor is cut into one part per rank, sized in proportion to the rank's weight
// (its speed; 0 owns nothing). Round 1: every rank sends each part to its owner, and each
// owner adds what it receives into its part. Round 2: every owner sends its summed part
// to every rank. Two rounds of latency, all messages of a round in flight at once, and a
// slow rank adds and sends only its small part, or none; waits back off instead of
// spinning, so a rank throttled by a CPU quota does not spend its quota waiting. An owner
// need not wait for its round-2 sends to arrive (finish, then drain later): with one
// owner, the others' lateness in taking the sums never holds it up. (Open MPI's MPI_Allreduce
// of the MLP's 2.7 MB over 4 ranks under quotas 0.8/0.4/0.2/0.2 took 19.8 ms here: its
// many rounds each wait for a throttled rank's next time slice.)
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace ht::comm {

// A host buffer of floats from a backend's host staging (Allocator::HostStaging): pinned,
// mapped host memory on a GPU, plain host memory on the CPU. Moves, never copies.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Backend& be, int64_t floats);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  float* get() const { return p_; }

 private:
  Allocator* alloc_ = nullptr;
  size_t bytes_ = 0;
  float* p_ = nullptr;
};

// [offsets[j], offsets[j + 1]) is rank j's part of an n-element tensor under `weights`
// (in proportion to them, rounded; every rank computes the same cuts).
std::vector<int64_t> part_offsets(int64_t n, const std::vector<double>& weights);

// The same all-reduce with tensors joining while it runs, so that it overlaps the
// backward pass: `add` the gradients of each block as its backward finishes (every rank
// adds the same tensors in the same order), call `progress` between blocks (it never
// blocks: round 1 of a tensor completes, its owner adds and starts round 2), and
// `finish` at the end. The sums are exactly those of the blocking call below.
//
// With `scatter_only`, round 2 waits to be asked: `finish` returns once this rank's part
// of every tensor holds its sum (the other parts keep what this rank added), and
// `gather(sources)` then sends this rank's part of each source to every rank and takes
// theirs, in place, and `finish` waits for that. Optimiser-state sharding runs its update
// between the two: each rank updates only the weights of its part, and round 2 carries
// the updated weights instead of the summed gradients.
class OverlappedAllreduce {
 public:
  // Every member passes the same weights, one per rank of `comm`, each >= 0, not all 0.
  OverlappedAllreduce(Communicator& comm, std::vector<double> weights, bool scatter_only = false);
  ~OverlappedAllreduce();
  // Contiguous float32 tensors on any backend, reduced in place (see Pending for how a
  // device's tensors are staged).
  void add(std::vector<Tensor> tensors);
  bool progress();  // whether any message completed
  size_t added() const { return added_; }  // tensors added so far
  // Waits until every tensor added holds its sums (with scatter_only: until this rank's
  // parts do, or after gather until every part arrived); this rank's round-2 sends may
  // still be in flight (from copies). On timed_out the tensors are in an unspecified state.
  WaitStatus finish(Timeout timeout);
  // Scatter_only, after finish: round 2 from `sources`, one per tensor added, in order,
  // each of its tensor's size (contiguous float32 on any backend).
  void gather(std::vector<Tensor> sources);
  // Scatter_only, after finish, instead of gather: where every rank reads the owners'
  // weights in place (shared memory), round 2 has nothing to carry.
  void end_without_gather();
  // Waits for the round-2 sends as well; call it before the job ends.
  WaitStatus drain(Timeout timeout);
  // The ranks of the communicator that unfinished messages of this rank are from or to,
  // in order: after a finish or drain that timed out, the ranks not heard from.
  std::vector<int> waiting_on() const;

 private:
  struct Pending;
  struct PeerRequest {  // a message from or to `peer`
    Request request;
    int peer;
  };
  struct Outgoing {  // one tensor's summed part, on its way to every peer
    HostBuffer data;
    std::vector<PeerRequest> sends;
  };
  WaitStatus poll(Timeout timeout, bool sends);
  void spread(Pending& x);  // starts round 2 of x from its tensor's part
  static void upload_peer_parts(Pending& x, int me);
  Communicator& comm_;
  std::vector<double> weights_;
  bool scatter_only_;
  std::vector<std::unique_ptr<Pending>> pending_;  // tensors in round 1 or 2
  std::vector<Outgoing> outgoing_;                 // round-2 sends not yet complete
  size_t added_ = 0;                               // tensors so far: their tags
};

// Collective over `comm`: every rank passes the same number of float32 tensors of the
// same sizes (contiguous, on any backend) and the same weights, one per rank, each >= 0
// and not all 0.
// In place; on timed_out the tensors are in an unspecified state.
WaitStatus allreduce_sum_weighted(Communicator& comm, std::vector<Tensor>& tensors,
                                  const std::vector<double>& weights,
                                  Timeout timeout);

}  // namespace ht::comm
