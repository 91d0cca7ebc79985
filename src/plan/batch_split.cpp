#include "plan/batch_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace ht::plan {
namespace {

constexpr int64_t kUnlimited = -1;

void check_replicas(const char* op, const std::vector<ReplicaCapacity>& replicas) {
  HT_CHECK(!replicas.empty(), op, ": no replicas; expected at least one");
  for (size_t i = 0; i < replicas.size(); ++i) {
    const double s = replicas[i].samples_per_s;
    HT_CHECK(std::isfinite(s) && s > 0, op, ": replica ", i, " has speed ", s,
             " samples/s; expected a positive, finite throughput");
    const double f = replicas[i].fixed_seconds;
    HT_CHECK(std::isfinite(f) && f >= 0, op, ": replica ", i, " has fixed_seconds ", f,
             "; expected a finite number of seconds >= 0");
    const int64_t c = replicas[i].max_samples;
    HT_CHECK(c == kUnlimited || c >= 1, op, ": replica ", i, " has max_samples ", c,
             "; expected -1 (unlimited) or at least 1");
  }
}

int64_t saturating_add(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max()
                                                     : a + b;
}

}  // namespace

std::vector<int64_t> split_batch(int64_t global_batch,
                                 const std::vector<ReplicaCapacity>& replicas) {
  check_replicas("split_batch", replicas);
  const auto n = static_cast<int64_t>(replicas.size());
  HT_CHECK(global_batch >= n, "split_batch: global batch ", global_batch,
           " is smaller than the ", n, " replicas; expected at least one sample per replica");

  // Capacity: only meaningful when every replica is capped.
  const bool all_capped =
      std::all_of(replicas.begin(), replicas.end(),
                  [](const ReplicaCapacity& r) { return r.max_samples != kUnlimited; });
  if (all_capped) {
    int64_t total = 0;
    std::ostringstream caps;
    for (size_t i = 0; i < replicas.size(); ++i) {
      total = saturating_add(total, replicas[i].max_samples);
      caps << (i ? ", " : "") << replicas[i].max_samples;
    }
    HT_CHECK(total >= global_batch, "split_batch: replicas can hold at most ", total,
             " samples per step (caps ", caps.str(), ") but the global batch is ",
             global_batch, "; expected a global batch of at most ", total,
             ": raise memory (micro-batches, recomputation) or lower train.batch_size");
  }

  // A replica never needs more than what is left after one sample for each other one;
  // this also gives unlimited replicas a finite bound for the search below.
  std::vector<double> cap(replicas.size());
  for (size_t i = 0; i < replicas.size(); ++i) {
    const int64_t c = global_batch - (n - 1);
    cap[i] = static_cast<double>(replicas[i].max_samples == kUnlimited
                                     ? c
                                     : std::min(c, replicas[i].max_samples));
  }
  auto filled = [&](double level) {
    double sum = 0;
    for (size_t i = 0; i < replicas.size(); ++i)
      sum += std::clamp((level - replicas[i].fixed_seconds) * replicas[i].samples_per_s, 1.0, cap[i]);
    return sum;
  };

  // Water level by bisection: `lo` always fills at most the batch, so the floors below
  // never overshoot and each floor f_i satisfies f_i/speed_i <= the optimal step time,
  // which is what makes the greedy completion optimal.
  double lo = 0, hi = 0;
  for (size_t i = 0; i < replicas.size(); ++i)
    hi = std::max(hi, replicas[i].fixed_seconds + cap[i] / replicas[i].samples_per_s);
  const auto target = static_cast<double>(global_batch);
  for (int it = 0; it < 200 && lo < hi; ++it) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;  // converged to adjacent doubles
    (filled(mid) <= target ? lo : hi) = mid;
  }

  std::vector<int64_t> shares(replicas.size());
  int64_t assigned = 0;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const double x = std::clamp((lo - replicas[i].fixed_seconds) * replicas[i].samples_per_s, 1.0, cap[i]);
    shares[i] = static_cast<int64_t>(std::floor(x));
    assigned += shares[i];
  }

  // Leftover samples (about one per replica) one at a time to whoever would finish its
  // share+1 soonest; ties to the lower index so the split is deterministic.
  using Item = std::pair<double, size_t>;  // (time with one more sample, replica)
  std::priority_queue<Item, std::vector<Item>, std::greater<>> next;
  auto push = [&](size_t i) {
    if (static_cast<double>(shares[i]) < cap[i])
      next.emplace(replicas[i].fixed_seconds + static_cast<double>(shares[i] + 1) / replicas[i].samples_per_s, i);
  };
  for (size_t i = 0; i < replicas.size(); ++i) push(i);
  for (; assigned < global_batch; ++assigned) {
    HT_CHECK(!next.empty(), "split_batch: internal error: ", global_batch - assigned,
             " samples left with every replica at its cap");
    const size_t i = next.top().second;
    next.pop();
    ++shares[i];
    push(i);
  }
  return shares;
}

double predicted_step_seconds(const std::vector<int64_t>& shares,
                              const std::vector<ReplicaCapacity>& replicas) {
  check_replicas("predicted_step_seconds", replicas);
  HT_CHECK(shares.size() == replicas.size(), "predicted_step_seconds: ", shares.size(),
           " shares for ", replicas.size(), " replicas; expected one share per replica");
  double worst = 0;
  for (size_t i = 0; i < shares.size(); ++i)
    worst = std::max(worst, replicas[i].fixed_seconds + static_cast<double>(shares[i]) / replicas[i].samples_per_s);
  return worst;
}

std::vector<int64_t> equal_split(int64_t global_batch, size_t replicas) {
  HT_CHECK(replicas > 0, "equal_split: no replicas; expected at least one");
  HT_CHECK(global_batch >= 0, "equal_split: global batch ", global_batch,
           "; expected a non-negative batch");
  const auto n = static_cast<int64_t>(replicas);
  std::vector<int64_t> shares(replicas, global_batch / n);
  for (int64_t i = 0; i < global_batch % n; ++i) ++shares[static_cast<size_t>(i)];
  return shares;
}

}  // namespace ht::plan
