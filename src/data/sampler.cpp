#include "data/sampler.h"

#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace ht::data {

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// ---- Sampler

std::vector<int64_t> Sampler::at_range(int64_t begin, int64_t count) {
  HT_CHECK(begin >= 0 && count >= 0, "sampler: range [", begin, ", ", begin, " + ", count,
           ") is invalid; expected begin >= 0 and count >= 0");
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = at(begin + i);
  return out;
}

// ---- ShuffledSampler

ShuffledSampler::ShuffledSampler(int64_t dataset_size, uint64_t seed)
    : n_(dataset_size), seed_(seed) {
  // int32 permutation entries halve the cache; datasets here are far below 2^31.
  HT_CHECK(dataset_size > 0 && dataset_size <= std::numeric_limits<int32_t>::max(),
           "ShuffledSampler: dataset size ", dataset_size, " is out of range; expected 1 .. ",
           std::numeric_limits<int32_t>::max());
}

std::vector<int32_t> ShuffledSampler::permutation(int64_t epoch) const {
  std::vector<int32_t> perm(static_cast<size_t>(n_));
  std::iota(perm.begin(), perm.end(), 0);
  // Mix the epoch through the hash (not seed + epoch) so that (seed, epoch + 1) and
  // (seed + 1, epoch) do not share a shuffle.
  Rng rng(mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch) + 0x9E3779B97F4A7C15ull)));
  for (int64_t i = n_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

int64_t ShuffledSampler::at(int64_t k) {
  HT_CHECK(k >= 0, "ShuffledSampler: position ", k, " is negative");
  const int64_t e = k / n_;
  if (e != cached_epoch_) {
    perm_ = permutation(e);
    cached_epoch_ = e;
  }
  return perm_[static_cast<size_t>(k % n_)];
}

// ---- WindowSampler

WindowSampler::WindowSampler(int64_t num_tokens, int64_t window, uint64_t seed)
    : window_(window), starts_(num_tokens - window + 1), key_(mix64(seed ^ 0x5851F42D4C957F2Dull)) {
  HT_CHECK(window > 0 && num_tokens >= window, "WindowSampler: ", num_tokens,
           " tokens cannot hold a window of ", window, "; expected num_tokens >= window > 0");
}

int64_t WindowSampler::at(int64_t k) {
  HT_CHECK(k >= 0, "WindowSampler: position ", k, " is negative");
  // The splitmix64 stream evaluated at index k: counter-based, so any position is O(1).
  const uint64_t h = mix64(key_ + (static_cast<uint64_t>(k) + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<int64_t>(h % static_cast<uint64_t>(starts_));
}

}  // namespace ht::data
