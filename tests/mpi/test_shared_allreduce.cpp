// The weighted all-reduce through shared memory (comm/shared_allreduce.h) on 4 ranks of
// one host: its sums are OverlappedAllreduce's bit for bit, exchange after exchange
// through both generations, and near the sums in double; a rank that never posts is
// named by the others' bounded wait; a board too large for the host is not made.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/shared_allreduce.h"
#include "comm/weighted_allreduce.h"
#include "mpi_util.h"

using namespace ht;
using namespace ht::comm;
using namespace mpi_test;

namespace {

// Tensors of several sizes: one empty, one smaller than the members, one whose parts
// are uneven; a member of weight 0 owns no part.
const std::vector<int64_t> kSizes{1000, 3, 0, 333};
const std::vector<double> kWeights{0.5, 0.3, 0.2, 0.0};

// Values of mixed sign and of magnitudes 2^-10 .. 2^9, with mantissas of every kind:
// their float sums depend on the order of the additions, so an owner adding in another
// order than OverlappedAllreduce's shows.
float value(int64_t e, size_t t, int64_t i, int rank) {
  uint64_t h = static_cast<uint64_t>(e * 1000003 + static_cast<int64_t>(t) * 7919 + i * 104729 + rank * 15485863);
  h ^= h >> 13;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  const double mantissa = static_cast<double>(h % 1000003) / 1000003.0 - 0.5;
  return static_cast<float>(std::ldexp(mantissa, static_cast<int>((h >> 20) % 20) - 10));
}

}  // namespace

TEST_CASE("shared allreduce: the sums are OverlappedAllreduce's bit for bit, exchange after exchange") {
  Communicator& world = comm::world();
  if (world.size() != 4) return;
  std::string why;
  const auto board = SharedAllreduce::make(world, kSizes, kLong, &why);
  CAPTURE(why);
  REQUIRE(board != nullptr);  // 4 ranks of one host, no emulated link
  const int me = world.rank();
  int64_t differing = 0, off_reference = 0;
  for (int64_t e = 1; e <= 5; ++e) {  // both generations, each reused twice
    std::vector<Tensor> messages;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      float* mine = board->contribution(e, t);
      std::vector<float> v(static_cast<size_t>(kSizes[t]));
      for (int64_t i = 0; i < kSizes[t]; ++i) v[static_cast<size_t>(i)] = mine[i] = value(e, t, i, me);
      messages.push_back(Tensor::from_vector(v, {kSizes[t]}, cpu_backend()));
    }
    board->post(e, kWeights);
    REQUIRE(board->finish(kLong) == WaitStatus::done);
    OverlappedAllreduce reduce(world, kWeights);
    reduce.add(messages);
    REQUIRE(reduce.finish(kLong) == WaitStatus::done);
    REQUIRE(reduce.drain(kLong) == WaitStatus::done);
    for (size_t t = 0; t < kSizes.size(); ++t) {
      const float* sums = board->sums(e, t);
      for (int64_t i = 0; i < kSizes[t]; ++i) {
        differing += sums[i] != messages[t].data()[i];
        // Three float additions: each errs by at most half an ulp of a partial sum,
        // which is at most the sum of the magnitudes.
        double exact = 0, magnitude = 0;
        for (int r = 0; r < 4; ++r) {
          exact += value(e, t, i, r);
          magnitude += std::fabs(value(e, t, i, r));
        }
        off_reference += std::fabs(sums[i] - exact) > 3 * std::ldexp(magnitude, -24);
      }
    }
  }
  CHECK(differing == 0);
  CHECK(off_reference == 0);
}

TEST_CASE("shared allreduce: a rank that never posts is named by the others' bounded wait") {
  Communicator& world = comm::world();
  if (world.size() != 4) return;
  const auto board = SharedAllreduce::make(world, {64}, kLong);
  REQUIRE(board != nullptr);
  if (world.rank() != 2) {
    board->contribution(1, 0)[0] = 1;
    board->post(1, kWeights);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(board->finish(std::chrono::milliseconds(300)) == WaitStatus::timed_out);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    // No one could sum without rank 2's contribution: the one named.
    CHECK(board->missing() == std::vector<int>{2});
  }
  // The board is left mid-exchange: every rank drops it together.
  REQUIRE(world.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("shared allreduce: a board over a quarter of the host's memory is not made, on any member") {
  Communicator& world = comm::world();
  if (world.size() != 4) return;
  // One tensor of the host's bytes in floats: 10 rows of it, 10 x the memory.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  REQUIRE((pages > 0 && page > 0));
  std::string why;
  const auto board = SharedAllreduce::make(world, {static_cast<int64_t>(pages) * page / 4}, kLong, &why);
  CHECK(board == nullptr);
  CHECK(why.find("exceed a quarter of this host's memory") != std::string::npos);
}
