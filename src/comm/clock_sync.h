// Where each rank's clock stands against rank 0's, so that what ranks measure can be laid
// on one time line (the measured --timeline of `hetrain train`).
#pragma once

#include <vector>

#include "comm/communicator.h"

namespace ht::comm {

// A moment that this rank's steady clock reads as t, rank 0's reads as t + offset_s,
// within +-error_s.
struct ClockOffset {
  double offset_s = 0;
  double error_s = 0;
};

// A reading of this process's steady clock (the one Clock::now() reads), in seconds.
double clock_seconds(Clock::time_point t = Clock::now());

// Collective. Rank 0 takes `rounds` round trips with each other rank in turn: it reads its
// clock (a) and pings the rank, the rank answers with its own reading (t), and rank 0 reads
// its clock again when the answer arrives (b). The rank read t between a and b, so its
// offset is (a + b) / 2 - t within +-(b - a) / 2, and the round trip of least error
// counts (scheduling, or a rank throttled by a CPU quota, only ever lengthens one). Ranks
// on one host read one clock (Linux's CLOCK_MONOTONIC) and are measured all the same: the
// mpi suite checks that they come out within their error of 0. Rank 0 gets one entry per
// rank (its own is 0 +- 0); the others get none. A rank that does not answer within
// `timeout` raises PeerTimeout naming it.
std::vector<ClockOffset> clock_offsets(Communicator& comm, int rounds, Timeout timeout);

}  // namespace ht::comm
