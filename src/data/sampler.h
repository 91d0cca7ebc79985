// Samplers that map a global stream position k = 0, 1, 2, ... to a sample, as a pure
// function of (seed, k). Every consumer (rank) of a global batch holds the same sampler
// and reads its own slice of positions, so no rank needs another's state and resuming
// from a stream position is exact.
#pragma once

#include <cstdint>
#include <vector>

namespace ht::data {

// splitmix64 finaliser: a bijective 64-bit mix, the hash behind both samplers.
uint64_t mix64(uint64_t x);

class Sampler {
 public:
  virtual ~Sampler() = default;

  // The sample (index or window start) at stream position k >= 0.
  virtual int64_t at(int64_t k) = 0;
  // Positions [begin, begin + count).
  std::vector<int64_t> at_range(int64_t begin, int64_t count);
};

// Position k -> perm_e[k mod N], e = k / N, where perm_e is a Fisher-Yates shuffle of
// 0..N-1 drawn from Rng(mix of seed and e). Each epoch (N consecutive positions from a
// multiple of N) visits every index exactly once.
class ShuffledSampler : public Sampler {
 public:
  ShuffledSampler(int64_t dataset_size, uint64_t seed);
  int64_t at(int64_t k) override;
  int64_t dataset_size() const { return n_; }
  // The permutation of epoch e (not cached).
  std::vector<int32_t> permutation(int64_t epoch) const;

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int32_t> perm_;  // (N) the cached epoch's permutation
};

// Position k -> a window start uniform in [0, num_tokens - window], from a counter-based
// hash of (seed, k): random access with no sequential generator state. The modulo
// reduction's bias is below range / 2^64, negligible for any corpus.
class WindowSampler : public Sampler {
 public:
  WindowSampler(int64_t num_tokens, int64_t window, uint64_t seed);
  int64_t at(int64_t k) override;
  int64_t window() const { return window_; }
  int64_t num_starts() const { return starts_; }

 private:
  int64_t window_, starts_;
  uint64_t key_;  // mixed seed
};

}  // namespace ht::data
