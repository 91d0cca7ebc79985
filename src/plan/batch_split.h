// The data-parallel batch split: how many samples of one global batch each replica
// processes, so that uneven devices finish their shares at about the same time instead
// of every rank waiting for the slowest one (what an equal DDP split does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ht::plan {

struct ReplicaCapacity {
  double samples_per_s = 0;  // measured or modelled throughput of the replica
  int64_t max_samples = -1;  // the most samples per step its memory holds (-1 = unlimited)
  double fixed_seconds = 0;  // what a step costs it besides its samples (>= 0)
};

// Integer shares, one per replica, that sum exactly to `global_batch`.
//
// A replica's time for a share is fixed_seconds + share / samples_per_s.
//
// Continuous target: water-filling. Shares are (level - fixed_seconds) x samples_per_s at
// one common level (seconds per step), clamped to [1, max_samples]; capacity a cap frees
// goes to the uncapped replicas in proportion to their speed because they all share the
// level.
//
// Rounding: floor the continuous shares, then hand each leftover sample to the replica
// that would finish share+1 soonest (fixed + (share+1)/speed smallest, lower index on
// ties). This is largest-remainder rounding with the remainder measured in seconds rather
// than in samples; plain largest remainder by sample fraction is NOT min-max optimal (speeds 1
// and 10 with fractions .6 and .5: giving the sample to the slow replica costs .4 s on
// the step, giving it to the fast one .05 s).
//
// Guarantee (tested by brute force): the result minimises max_i time_i(share_i) over
// all integer splits with 1 <= share_i <= max_samples and sum = global_batch. Every
// replica gets at least one sample.
//
// Errors (ht::Error): no replicas; global_batch < number of replicas; a speed that is
// not positive and finite; a fixed_seconds that is negative or not finite; a max_samples
// that is neither -1 nor >= 1; the caps together holding fewer samples than global_batch.
std::vector<int64_t> split_batch(int64_t global_batch,
                                 const std::vector<ReplicaCapacity>& replicas);

// max_i fixed_seconds + shares[i] / samples_per_s: the compute part of one step when
// each replica runs its share at its throughput. Sizes must match.
double predicted_step_seconds(const std::vector<int64_t>& shares,
                              const std::vector<ReplicaCapacity>& replicas);

// The DDP baseline: global_batch / n each, the remainder one apiece to the first ranks.
std::vector<int64_t> equal_split(int64_t global_batch, size_t replicas);

}  // namespace ht::plan
