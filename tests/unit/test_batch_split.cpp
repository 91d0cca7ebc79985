// The data-parallel batch split: exact proportional shares, exact sums, caps and their
// redistribution, min-max optimality against brute force, and every error message.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/batch_split.h"

using namespace ht;
using namespace ht::plan;

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// The best max fixed + share/speed over every split with 1 <= share_i <= cap_i summing to batch.
double brute_force_best(int64_t batch, const std::vector<ReplicaCapacity>& r) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> s(r.size());
  std::function<void(size_t, int64_t)> rec = [&](size_t i, int64_t left) {
    if (i + 1 == r.size()) {
      s[i] = left;
      if (left < 1 || (r[i].max_samples >= 0 && left > r[i].max_samples)) return;
      best = std::min(best, predicted_step_seconds(s, r));
      return;
    }
    for (int64_t k = 1; k <= left; ++k) {
      if (r[i].max_samples >= 0 && k > r[i].max_samples) break;
      s[i] = k;
      rec(i + 1, left - k);
    }
  };
  rec(0, batch);
  return best;
}

}  // namespace

TEST_CASE("batch split: speeds 4:2:1:1 split 128 exactly 64,32,16,16, 2x over equal") {
  const std::vector<ReplicaCapacity> r{{4, -1}, {2, -1}, {1, -1}, {1, -1}};
  const auto s = split_batch(128, r);
  CHECK(s == std::vector<int64_t>{64, 32, 16, 16});
  CHECK(predicted_step_seconds(s, r) == doctest::Approx(16.0));
  const double equal_s = predicted_step_seconds(equal_split(128, r.size()), r);
  CHECK(equal_s == doctest::Approx(32.0));
  // Equal split waits for the slowest (32 samples at 1/s); the speed-up is total speed
  // over n x slowest speed = 8/4.
  CHECK(equal_s / predicted_step_seconds(s, r) == doctest::Approx(2.0));
}

TEST_CASE("batch split: shares sum exactly for random speeds and batches") {
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> speed(0.05, 500.0);
  std::uniform_int_distribution<int> count(1, 40);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<ReplicaCapacity> r(static_cast<size_t>(count(rng)));
    for (auto& x : r) x.samples_per_s = speed(rng);
    const auto n = static_cast<int64_t>(r.size());
    const int64_t batch = std::uniform_int_distribution<int64_t>(n, 100000)(rng);
    const auto s = split_batch(batch, r);
    REQUIRE(s.size() == r.size());
    CHECK(sum(s) == batch);
    for (const auto v : s) CHECK(v >= 1);
  }
}

TEST_CASE("batch split: caps are respected and the freed samples follow speed") {
  // Uncapped 64,32,16,16; replica 0 holds 40, so 24 samples go to the others 2:1:1.
  const std::vector<ReplicaCapacity> r{{4, 40}, {2, -1}, {1, -1}, {1, -1}};
  const auto s = split_batch(128, r);
  CHECK(s == std::vector<int64_t>{40, 44, 22, 22});
  // Two caps at once, and a batch that fills every cap exactly.
  const std::vector<ReplicaCapacity> r2{{10, 5}, {1, 100}, {1, 7}};
  CHECK(split_batch(50, r2) == std::vector<int64_t>{5, 38, 7});
  CHECK(split_batch(112, r2) == std::vector<int64_t>{5, 100, 7});
  // Random capped clusters: caps hold and sums are exact.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<ReplicaCapacity> rr(static_cast<size_t>(std::uniform_int_distribution<int>(1, 12)(rng)));
    int64_t total = 0;
    for (auto& x : rr) {
      x.samples_per_s = std::uniform_real_distribution<double>(0.1, 50)(rng);
      x.max_samples = std::uniform_int_distribution<int64_t>(1, 200)(rng);
      total += x.max_samples;
    }
    const auto n = static_cast<int64_t>(rr.size());
    const int64_t batch = std::uniform_int_distribution<int64_t>(n, total)(rng);
    const auto s = split_batch(batch, rr);
    CHECK(sum(s) == batch);
    for (size_t i = 0; i < s.size(); ++i) {
      CHECK(s[i] >= 1);
      CHECK(s[i] <= rr[i].max_samples);
    }
  }
}

TEST_CASE("batch split: a fixed cost per step takes samples from its replica") {
  // Speeds 4:2:1:1 split 64/32/16/16 at 16 s; 2.5 s of fixed cost on each slow replica
  // is 2.5 of its samples, which the others take in proportion to their speed (level
  // 16.625 s: 66.5, 33.25, 14.125, 14.125; the leftover sample finishes first on the fastest).
  std::vector<ReplicaCapacity> r{{4, -1}, {2, -1}, {1, -1}, {1, -1}};
  CHECK(split_batch(128, r) == std::vector<int64_t>{64, 32, 16, 16});
  r[2].fixed_seconds = r[3].fixed_seconds = 2.5;
  const auto s = split_batch(128, r);
  CHECK(s == std::vector<int64_t>{67, 33, 14, 14});
  CHECK(predicted_step_seconds(s, r) == doctest::Approx(16.75));  // 67 / 4
  // A fixed cost beyond the step leaves its replica the one sample every replica gets.
  r[3].fixed_seconds = 100;
  CHECK(split_batch(128, r)[3] == 1);
}

TEST_CASE("batch split: min-max optimal against brute force on small cases") {
  // The case where plain largest remainder (by sample fraction) is not optimal.
  CHECK(split_batch(12, {{1, -1}, {10, -1}}) == std::vector<int64_t>{1, 11});
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> speed(0.2, 10.0);
  std::uniform_int_distribution<int64_t> cap(-1, 8);
  std::uniform_real_distribution<double> fixed(0, 3.0);
  for (int trial = 0; trial < 600; ++trial) {
    std::vector<ReplicaCapacity> r(3);
    for (auto& x : r) {
      x.samples_per_s = trial % 5 == 0 ? std::round(speed(rng)) + 1 : speed(rng);  // ties too
      x.max_samples = trial % 2 ? cap(rng) : -1;
      if (x.max_samples == 0) x.max_samples = -1;
      if (trial >= 400) x.fixed_seconds = fixed(rng);  // a fixed cost per step as well
    }
    for (int64_t batch = 3; batch <= 12; ++batch) {
      const double best = brute_force_best(batch, r);
      if (std::isinf(best)) continue;  // caps too small: covered by the error test
      const auto s = split_batch(batch, r);
      CAPTURE(batch);
      CHECK(sum(s) == batch);
      CHECK(predicted_step_seconds(s, r) == doctest::Approx(best).epsilon(1e-12));
    }
  }
}

TEST_CASE("batch split: equal-split baseline, and the capped split still sums") {
  CHECK(equal_split(10, 4) == std::vector<int64_t>{3, 3, 2, 2});
  const std::vector<ReplicaCapacity> r{{4, 64}, {1, 20}, {1, 64}};
  CHECK(sum(split_batch(100, r)) == 100);
}

TEST_CASE("batch split: error messages") {
  const std::vector<ReplicaCapacity> four(4, ReplicaCapacity{1, -1});
  CHECK(error_of([&] { split_batch(3, four); }) ==
        "split_batch: global batch 3 is smaller than the 4 replicas; expected at least one "
        "sample per replica");
  CHECK(error_of([] { split_batch(8, {}); }) == "split_batch: no replicas; expected at least one");
  CHECK(error_of([] { split_batch(8, {{1, -1}, {0, -1}}); }) ==
        "split_batch: replica 1 has speed 0 samples/s; expected a positive, finite throughput");
  CHECK(error_of([] { split_batch(8, {{-2.5, -1}}); }) ==
        "split_batch: replica 0 has speed -2.5 samples/s; expected a positive, finite throughput");
  CHECK(error_of([] { split_batch(8, {{std::numeric_limits<double>::infinity(), -1}}); }) ==
        "split_batch: replica 0 has speed inf samples/s; expected a positive, finite throughput");
  CHECK(error_of([] { split_batch(8, {{1, -1}, {1, -1}, {std::nan(""), -1}}); })
            .find("replica 2 has speed nan") != std::string::npos);
  CHECK(error_of([] { split_batch(8, {{1, -1, -0.5}}); }) ==
        "split_batch: replica 0 has fixed_seconds -0.5; expected a finite number of seconds >= 0");
  CHECK(error_of([] { split_batch(8, {{1, -1}, {1, -1, std::nan("")}}); }).find("replica 1 has fixed_seconds nan") !=
        std::string::npos);
  CHECK(error_of([] { split_batch(8, {{1, 0}}); }) ==
        "split_batch: replica 0 has max_samples 0; expected -1 (unlimited) or at least 1");
  CHECK(error_of([] { split_batch(128, {{2, 64}, {1, 32}}); }) ==
        "split_batch: replicas can hold at most 96 samples per step (caps 64, 32) but the "
        "global batch is 128; expected a global batch of at most 96: raise memory "
        "(micro-batches, recomputation) or lower train.batch_size");
  CHECK(error_of([] { predicted_step_seconds({1, 2}, {{1, -1}}); }) ==
        "predicted_step_seconds: 2 shares for 1 replicas; expected one share per replica");
  // One unlimited replica lifts the capacity bound.
  CHECK(sum(split_batch(128, {{2, 64}, {1, 32}, {1, -1}})) == 128);
}
