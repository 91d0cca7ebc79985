// The communication layer every distributed feature uses: ranks, sub-communicators,
// tensor point-to-point, a sum-allreduce of gradient buckets, and barriers, over
// OpenMPI. Every wait on a peer is bounded: each one takes a required Timeout, and there
// is no "wait forever". The waits that return a WaitStatus report a missed deadline as
// a status, not a hang: the straggler-tolerant paths are built from these non-blocking
// operations (a blocking collective cannot exclude a stalled rank). The waits that
// return nothing or a value (send, allgather, split, Consultation::finish) raise
// PeerTimeout instead, naming this rank, the ranks not heard from when known, what was
// awaited and for how long. Training passes parallel.peer_timeout_s.
//
// Without an MPI launcher (mpirun, srun: comm/launch.h) the world is one rank and MPI is
// never initialised, so single-process commands work everywhere.
//
// Tensors on a device other than the CPU are staged through host memory: Debian's
// OpenMPI is not CUDA-aware.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tensor/tensor.h"

namespace ht::comm {

using Clock = std::chrono::steady_clock;
// How long a wait on a peer may take: finite and >= 0 (a wait checks it).
using Timeout = std::chrono::duration<double>;

enum class WaitStatus { done, timed_out };

// A peer did not answer within the wait's timeout. The message names this rank, the
// peers not heard from (world ranks, when known), what was awaited and for how long.
class PeerTimeout : public Error {
 public:
  using Error::Error;
};

// The message of a PeerTimeout: `me` and `missing` are world ranks (`missing` empty:
// not known which), `what` is what was awaited ("the plan broadcast").
std::string peer_timeout_message(int me, const std::vector<int>& missing, std::string_view what,
                                 Timeout waited);

// Emulated link of one rank: every message this rank sends or receives crosses it.
// A message from a to b is delayed by latency_a + latency_b + bytes / min(bw_a, bw_b)
// (bandwidth 0 = unlimited). Emulation only; reports label it as such.
// Point to point, the path from a sender to one destination carries one message at a
// time: a message starts its bytes/bw term when the previous one on that path is through.
// Collectives complete no earlier than this model of them after the call (p ranks,
// hop = max over the ring i -> i+1 of latency_i + latency_{i+1}, bw = the smallest
// non-zero bandwidth among the ranks):
//   allreduce_sum: 2(p-1) hop + 2(p-1)/p * bytes / bw   (ring reduce-scatter + allgather)
//   allgather:      (p-1) hop +  (p-1) * largest item / bw  (ring)
//   barrier:   ceil(log2 p) * (sum of the two largest latencies)  (dissemination)
struct LinkEmulation {
  double latency_s = 0.0;
  double bandwidth_bytes_per_s = 0.0;
  bool active() const { return latency_s > 0.0 || bandwidth_bytes_per_s > 0.0; }
};

// A pending non-blocking operation. Destroying an unfinished receive cancels it (one
// already copying in finishes), so that a receive abandoned by an exception cannot
// hang. Destroying an unfinished send waits for it, but no longer than the timeout of
// its last wait (none when that wait timed out: it was reported then), or
// kUnwaitedSendLimit when it was never waited for; a send still pending then is
// abandoned with a line on stderr, and what it owns (its request, any buffer it holds)
// is kept, since MPI may still read it. A caller's own buffer must outlive such a send.
class Request {
 public:
  class Impl;
  Request();
  explicit Request(std::unique_ptr<Impl> impl);
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  ~Request();

  bool test();                          // completed (never blocks)
  WaitStatus wait(Timeout timeout);
  // As wait, but testing without a sleep between tests: for timing a round trip, which
  // wait's backoff sleeps would lengthen (they end late by up to a scheduler tick). It
  // spends the CPU while it waits, so keep such waits short.
  WaitStatus spin(Timeout timeout);
  // What the operation is, for a message about it; empty where not known.
  std::string label() const;

 private:
  std::unique_ptr<Impl> impl_;
  Timeout drop_wait_;  // how long the destructor waits for an unfinished send
};

// How long dropping a send that nobody waited for may wait for it. Such a drop happens
// while an error unwinds (the normal paths wait for their sends with the peer timeout);
// it bounds how long that can hold the error back from being reported.
inline constexpr Timeout kUnwaitedSendLimit{10.0};

// A gather to rank 0 that rank 0 answers, in two halves (Communicator::consult).
class Consultation {
 public:
  using Answer = std::function<std::string(const std::vector<std::string>& items)>;
  virtual ~Consultation() = default;
  // Rank 0: waits for every rank's item, returns answer(items) (in rank order) and sends
  // it to the others without waiting for them to take it. Any other rank: waits for rank
  // 0's answer and returns it (`answer` is not called). Keep the consultation until the
  // others have the answer (destroying it on rank 0 waits for that, up to `timeout`).
  // Each wait is bounded by `timeout`; a miss raises PeerTimeout naming `what` ("the
  // log step 50 consultation") and, on rank 0, the ranks whose items did not come.
  virtual std::string finish(const Answer& answer, Timeout timeout, std::string_view what) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank and rank count among the processes on this host (world communicator only;
  // sub-communicators report the world's values).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual std::string host() const = 0;

  // Ranks with equal `color` form a new communicator, ordered by `key`. A negative
  // color joins no group and gets nullptr. Every rank of this communicator must call it
  // within `timeout` of the others, or PeerTimeout names those that did not (`what`: what
  // the groups are for). The new communicator inherits its members' link emulation.
  virtual std::unique_ptr<Communicator> split(int color, int key, Timeout timeout,
                                              std::string_view what) = 0;

  // The world rank of this communicator's `rank` (error messages name world ranks).
  virtual int world_rank(int rank) const { return rank; }

  // Tags run from 0 to max_tag() (MPI guarantees at least 32767).
  virtual int max_tag() const = 0;

  // ---- point to point. Messages between a pair with one tag arrive in send order, and
  // receives posted for that pair and tag take them in the order they were posted.
  // A receive must match the message's size exactly (a mismatch raises ht::Error and
  // consumes the message). A wait on a receive that times out cancels it: its buffer is
  // never written afterwards (a message already being copied in completes and the wait
  // reports done). A send whose wait times out stays pending.
  // Requests must finish before their communicator is destroyed.
  virtual Request isend_bytes(const void* data, size_t bytes, int dst, int tag) = 0;
  virtual Request irecv_bytes(void* data, size_t bytes, int src, int tag) = 0;
  // Receives one whole message of any size; `*into` is resized to it on arrival.
  virtual Request irecv_message(std::shared_ptr<std::vector<char>> into, int src, int tag) = 0;
  // The blocking sends wait until the send completes, up to `timeout`; a miss raises
  // PeerTimeout naming the destination and `what` (the send stays pending, see Request).
  void send_bytes(const void* data, size_t bytes, int dst, int tag, Timeout timeout, std::string_view what);
  WaitStatus recv_bytes(void* data, size_t bytes, int src, int tag, Timeout timeout);
  // Tensors: `into` must already have the sender's shape and dtype. A tensor travels as
  // one message (a shape header and the dense bytes): do not receive it as bytes.
  Request isend(const Tensor& t, int dst, int tag);
  Request irecv(Tensor& into, int src, int tag);
  void send(const Tensor& t, int dst, int tag, Timeout timeout, std::string_view what);
  WaitStatus recv(Tensor& into, int src, int tag, Timeout timeout);

  // ---- collectives
  // In-place elementwise sum across ranks of each float32 tensor (gradient buckets).
  // After timed_out the communicator is unusable (MPI cannot cancel a collective): its
  // collectives and split() raise ht::Error; point to point still works. The buckets are
  // left as they were unless the result is done.
  virtual WaitStatus allreduce_sum(std::vector<Tensor>& buckets, Timeout timeout) = 0;
  virtual WaitStatus barrier(Timeout timeout) = 0;
  // Every rank's string, on every rank (small payloads: fingerprints, hashes, a plan).
  // Waits up to `timeout` for every rank's item; a miss raises PeerTimeout naming the
  // ranks whose items did not come and `what` ("the plan broadcast"). The MPI
  // communicator sends the items point to point, so that a miss knows whom it missed.
  virtual std::vector<std::string> allgather(const std::string& mine, Timeout timeout,
                                             std::string_view what) = 0;
  // Who did not take part, after allreduce_sum or barrier timed out (a collective cannot
  // say whom it waited for): every rank whose collective timed out answers this roll
  // call point to point, so it works on a communicator whose collective was abandoned,
  // and the ranks not heard from within `grace` (world ranks, ascending) are returned. A
  // rank stalled or dead, or one waiting elsewhere, does not answer. Its tag is a
  // collective's: every rank that calls it calls it in the same order of collectives.
  virtual std::vector<int> roll_call(Timeout grace) = 0;
  // Rank `root`'s `text` (a plan, say), returned on every rank; the others' `text` is
  // ignored. Each rank waits up to `timeout`: the others for the text, a miss naming
  // `root` and `what` ("the plan broadcast"); the root for the others to take it, a
  // miss naming those that did not.
  virtual std::string broadcast(const std::string& text, int root, Timeout timeout, std::string_view what) = 0;
  // Sends `mine` toward rank 0 and returns at once; finish() gives every rank rank 0's
  // answer to all the items. Every rank starts its consultations in one order and
  // finishes them in that order. For control between training steps: started after one
  // step and finished after the next, no rank waits for another's step to end (an
  // allgather holds every rank until the last one arrives). This implementation is an
  // allgather at finish(); the MPI communicator's sends point to point.
  virtual std::unique_ptr<Consultation> consult(const std::string& mine);

  // ---- link emulation: one entry per rank of this communicator (empty: none).
  virtual void set_link_emulation(std::vector<LinkEmulation> links) = 0;
  virtual const std::vector<LinkEmulation>& link_emulation() const = 0;
};

// After a wait on `c` that timed out after `timeout`: the ranks (world ranks) that miss a
// roll call of the ranks that timed out with this one (Communicator::roll_call, within
// min(timeout, 10 s): they time out within a step of each other, far under that).
std::vector<int> absent_after(Communicator& c, Timeout timeout);
// Of `waited_for` (world ranks that the wait timed out on), those absent_after names: a
// rank waited for may itself have been waiting, for the one that stalled. All of
// `waited_for` where it names none of them.
std::vector<int> stalled_among(Communicator& c, const std::vector<int>& waited_for, Timeout timeout);

// The process's world: MPI_COMM_WORLD under mpirun, else a single rank.
Communicator& world();

// Ends the whole job with `status`: MPI_Abort when MPI is running (so no peer is left
// waiting on this rank), plain exit otherwise.
[[noreturn]] void abort_job(int status);

}  // namespace ht::comm
