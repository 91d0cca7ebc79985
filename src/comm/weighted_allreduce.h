// A sum all-reduce for ranks of unequal speed, built from point-to-point messages.
//
// Each tensor is cut into one part per rank, sized in proportion to the rank's weight
// (its speed). Round 1: every rank sends each part to its owner, and each owner adds
// what it receives into its part. Round 2: every owner sends its summed part to every
// rank. Two rounds of latency, all messages of a round in flight at once, and a slow
// rank adds and sends only its small part; waits back off instead of spinning, so a rank
// throttled by a CPU quota does not spend its quota waiting. (Open MPI's MPI_Allreduce
// of the MLP's 2.7 MB over 4 ranks under quotas 0.8/0.4/0.2/0.2 took 19.8 ms here: its
// many rounds each wait for a throttled rank's next time slice.)
#pragma once

#include <vector>

#include "comm/communicator.h"

namespace ht::comm {

// Collective over `comm`: every rank passes the same number of float32 tensors of the
// same sizes (contiguous, on the CPU) and the same weights, one per rank, each > 0.
// In place; on timed_out the tensors are in an unspecified state.
WaitStatus allreduce_sum_weighted(Communicator& comm, std::vector<Tensor>& tensors,
                                  const std::vector<double>& weights,
                                  Timeout timeout = std::nullopt);

}  // namespace ht::comm
