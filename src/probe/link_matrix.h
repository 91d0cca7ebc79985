// Latency and bandwidth between every pair of ranks, by ping-pong. Pairs are measured
// in rounds of disjoint pairs (the round-robin "circle" schedule): n - 1 rounds for n
// ranks, every rank busy with at most one partner per round, so the whole matrix
// costs O(n) rounds instead of n^2 / 2 sequential tests.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace ht::probe {

struct LinkMatrix {
  std::vector<std::vector<double>> latency_s;              // one-way, [i][j]; 0 on the diagonal
  std::vector<std::vector<double>> bandwidth_bytes_per_s;  // [i][j]; 0 on the diagonal
};

// The pairs measured in each round, for n ranks.
std::vector<std::vector<std::pair<int, int>>> pairing_rounds(int n);

struct LinkProbeOptions {
  int pings = 20;                      // small-message round trips per pair (fastest taken)
  int64_t bulk_bytes = 16 << 20;       // message size for bandwidth
  // The fastest of these: a rank under a CPU quota copies a message in with its own CPU,
  // and one throttled mid-copy measured its link 10x slower than it is (0.9 against 5-10
  // GB/s), often enough in the fastest of 2 to make the planner leave two CNN ranks idle.
  int bulk_repeats = 6;
  double round_timeout_s = 60;         // a round that takes longer names the missing ranks
};

// Collective over `comm`: every rank calls it; every rank gets the full matrix.
LinkMatrix measure_links(comm::Communicator& comm, const LinkProbeOptions& opts);

}  // namespace ht::probe
