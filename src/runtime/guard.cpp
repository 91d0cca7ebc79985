#include "runtime/guard.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ht::runtime {

// The stage world rank `rank` runs in a guard_layout's JSON, or -1.
int stage_in(const nlohmann::json& layout, int rank) {
  const nlohmann::json& replicas = layout.at("replicas");
  for (const nlohmann::json& replica : replicas)
    for (size_t s = 0; s < replica.size(); ++s)
      if (replica.at(s).get<int>() == rank) return static_cast<int>(s);
  return -1;
}

// A guard state ({"norms", "quarantine"}) of the checkpoint's layout `before`, for world
// rank `rank` running `stage` of the layout `after` (guard_layout's JSON), where the two
// are one world split into the same stages whose replicas a new plan put in another order:
// the quarantine follows the ranks (reorder_quarantine, by the ranks of stage `column`,
// so that every stage reorders it alike); the norm histories, of the rank's own stage's
// parameter groups, stand where the rank runs the same stage, else start afresh. Empty
// where the quarantine cannot be carried over (another world, other stages, other ranks).
std::string guard_state_for(const std::string& state, const nlohmann::json& before, const nlohmann::json& after,
                            int rank, int stage, int column) {
  // Under local a guard is of its group's members (local_groups): its state carries over
  // only where the layout is the same, which the caller takes as it is.
  if (before.value("world", -1) != after.value("world", -2) ||
      before.value("stages", nlohmann::json()) != after.value("stages", nlohmann::json()) ||
      before.contains("local_groups") || after.contains("local_groups"))
    return {};
  // The checkpoint's layout names world ranks: each one is checked to be one, since
  // nlohmann's get<int> would wrap 2^32 + 1 to rank 1 and carry a quarantine to it.
  const int64_t world = before.at("world").get<int64_t>();
  for (const nlohmann::json& replica : before.at("replicas"))
    for (const nlohmann::json& r : replica)
      HT_CHECK(r.is_number_integer() && r.get<int64_t>() >= 0 && r.get<int64_t>() < world,
               "guard.layout: replica rank ", r.dump(), "; expected a world rank, 0 to ", world - 1);
  nlohmann::json j = nlohmann::json::parse(state);
  if (stage_in(before, rank) != stage) j["norms"] = nlohmann::json::array();
  if (j.contains("quarantine")) {
    const std::vector<int64_t> q = reorder_quarantine(j["quarantine"].get<std::vector<int64_t>>(),
                                                      before.at("replicas").get<std::vector<std::vector<int>>>(),
                                                      after.at("replicas").get<std::vector<std::vector<int>>>(), column);
    if (q.empty()) return {};
    j["quarantine"] = q;
  }
  return j.dump();
}

std::vector<int64_t> reorder_quarantine(const std::vector<int64_t>& state, const std::vector<std::vector<int>>& before,
                                        const std::vector<std::vector<int>>& after, int stage) {
  const size_t members = after.size();
  if (before.size() != members || state.size() < 2 + members || state[1] != static_cast<int64_t>(members) || stage < 0)
    return {};
  const auto s = static_cast<size_t>(stage);
  std::map<int, std::pair<int64_t, std::vector<int64_t>>> by_rank;  // release, offences
  size_t at = 2 + members;
  for (size_t m = 0; m < members; ++m) {
    if (before[m].size() <= s || at >= state.size() || state[at] < 0) return {};
    const auto n = static_cast<size_t>(state[at]);
    if (n > state.size() - at - 1) return {};
    const auto first = state.begin() + static_cast<std::ptrdiff_t>(at + 1);
    by_rank[before[m][s]] = {state[2 + m], std::vector<int64_t>(first, first + static_cast<std::ptrdiff_t>(n))};
    at += 1 + n;
  }
  if (at != state.size()) return {};
  std::vector<int64_t> out{state[0], state[1]}, offences;
  for (size_t m = 0; m < members; ++m) {
    const auto it = after[m].size() > s ? by_rank.find(after[m][s]) : by_rank.end();
    if (it == by_rank.end()) return {};
    out.push_back(it->second.first);
    offences.push_back(static_cast<int64_t>(it->second.second.size()));
    offences.insert(offences.end(), it->second.second.begin(), it->second.second.end());
    by_rank.erase(it);  // each rank once
  }
  out.insert(out.end(), offences.begin(), offences.end());
  return out;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kept: return "kept";
    case Verdict::non_finite: return "non-finite gradient";
    case Verdict::norm: return "gradient norm outlier";
    case Verdict::quarantined: return "quarantined";
    case Verdict::overflow: return "overflow (loss scale halved)";
  }
  return "?";
}

// The guard reads every gradient each step, so it is one pass with no temporary. On the
// MLP on 2 data-parallel ranks, ops' sum(mul(g, g)), which writes and reads a
// gradient-sized temporary, took 0.23 ms per block group (three a step: 5% of the
// 14.6 ms step); a loop in double took 0.05 ms (1%). This one squares and adds in
// float, 16 lanes, over blocks of 1,024 values (the relative error of a block's sum is
// under (1024 / 16 + 16) x 2^-24, 5e-6: nothing to a ratio test against 10 x a
// median), and adds the blocks in double. A block whose float sum is not finite is
// summed again in double: a value of 1e20 squares past float's range but is a finite
// gradient, where a NaN or an infinity stays what it is.
double sum_of_squares(const Tensor& t) {
  if (t.backend().kind() != DeviceKind::cpu || !t.is_contiguous()) {
    NoGradGuard no_grad;
    return static_cast<double>(sum(mul(t, t)).item());
  }
  const float* x = t.data();
  const int64_t n = t.numel();
  constexpr int64_t kBlock = 1024;
  constexpr int kLanes = 16;
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    float lane[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += x[i + k] * x[i + k];
    float part = 0;
    for (; i < e; ++i) part += x[i] * x[i];
    for (float l : lane) part += l;
    if (std::isfinite(part)) {
      total += static_cast<double>(part);
      continue;
    }
    double exact = 0;
    for (int64_t j = b; j < e; ++j) exact += static_cast<double>(x[j]) * static_cast<double>(x[j]);
    total += exact;
  }
  return total;
}

bool norm_outlier(double norm, const std::vector<double>& history, double ratio, int64_t window) {
  const size_t need = std::min(kMinNormHistory, static_cast<size_t>(std::max<int64_t>(window, 1)));
  if (ratio <= 0 || history.size() < need) return false;
  std::vector<double> sorted = history;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  return norm > ratio * median;
}

Verdict ContributionGuard::judge(size_t key, double sum_squares, int64_t samples, int64_t global) {
  if (sticky_ != Verdict::kept) return sticky_;
  if (!std::isfinite(sum_squares)) return sticky_ = Verdict::non_finite;
  if (samples < kMinNormSamples) return Verdict::kept;  // see kMinNormSamples (0: nothing computed)
  const double norm = std::sqrt(sum_squares) * static_cast<double>(global) / static_cast<double>(samples);
  std::deque<double>& h = history_[key];
  if (norm_outlier(norm, std::vector<double>(h.begin(), h.end()), cfg_.norm_ratio, cfg_.window))
    return sticky_ = Verdict::norm;
  h.push_back(norm);
  while (static_cast<int64_t>(h.size()) > cfg_.window) h.pop_front();
  return Verdict::kept;
}

Quarantine::Quarantine(const config::GuardConfig& cfg, int members)
    : cfg_(cfg), offences_(static_cast<size_t>(members)), release_(static_cast<size_t>(members), 0) {}

std::vector<int> Quarantine::record(const std::vector<Verdict>& verdicts) {
  HT_CHECK(verdicts.size() == offences_.size(), "Quarantine::record: ", verdicts.size(), " verdicts for ",
           offences_.size(), " members; expected one per member");
  ++step_;
  std::vector<int> now;
  for (size_t m = 0; m < verdicts.size(); ++m) {
    std::deque<int64_t>& o = offences_[m];
    while (!o.empty() && o.front() <= step_ - cfg_.window) o.pop_front();
    if (verdicts[m] != Verdict::non_finite && verdicts[m] != Verdict::norm) continue;
    o.push_back(step_);
    if (static_cast<int64_t>(o.size()) < cfg_.quarantine_after) continue;
    release_[m] = step_ + 1 + cfg_.quarantine_steps;
    o.clear();
    now.push_back(static_cast<int>(m));
  }
  // Every member quarantined: no step keeps a contribution until one is released, so the
  // job would run on, training nothing, and end as if it had trained. Every member
  // records the same verdicts, so every one of them stops here alike.
  if (!now.empty() && std::all_of(release_.begin(), release_.end(), [&](int64_t r) { return step_ + 1 < r; }))
    fail("the bad-node guard has quarantined every one of the ", release_.size(),
         " contributions to this stage by step ", step_,
         " (each non-finite or a gradient-norm outlier guard.quarantine_after times within guard.window steps): "
         "no step would keep a sample; expected at least one rank training (the model or the data is likely "
         "broken: lower train.optimizer.lr or set train.grad_clip, or raise guard.norm_ratio)");
  return now;
}

// [steps recorded, members, each member's release step, then per member its offences'
// count and steps].
std::vector<int64_t> Quarantine::state() const {
  std::vector<int64_t> out{step_, static_cast<int64_t>(release_.size())};
  out.insert(out.end(), release_.begin(), release_.end());
  for (const std::deque<int64_t>& o : offences_) {
    out.push_back(static_cast<int64_t>(o.size()));
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

void Quarantine::restore(const int64_t* ints, size_t count) {
  const size_t members = release_.size();
  HT_CHECK(count >= 2 + members && ints[1] == static_cast<int64_t>(members), "quarantine state: ", count,
           " values", count >= 2 ? " for " + std::to_string(ints[1]) + " members" : std::string(),
           "; expected at least ", 2 + members, " for this stage's ", members, " members");
  HT_CHECK(ints[0] >= 0, "quarantine state: ", ints[0], " steps recorded; expected >= 0");
  std::vector<int64_t> release(ints + 2, ints + 2 + members);
  std::vector<std::deque<int64_t>> offences(members);
  size_t at = 2 + members;
  for (size_t m = 0; m < members; ++m) {
    HT_CHECK(at < count && ints[at] >= 0 && static_cast<size_t>(ints[at]) <= count - at - 1, "quarantine state: member ",
             m, "'s offences run past the state's ", count, " values");
    const auto n = static_cast<size_t>(ints[at]);
    offences[m].assign(ints + at + 1, ints + at + 1 + n);
    at += 1 + n;
  }
  HT_CHECK(at == count, "quarantine state: ", count - at, " values left over after ", members, " members");
  step_ = ints[0];
  release_ = std::move(release);
  offences_ = std::move(offences);
}

void rescale_to_kept(const std::vector<Tensor>& sums, int64_t global, double kept) {
  if (kept <= 0 || kept == static_cast<double>(global)) return;
  const auto factor = static_cast<float>(static_cast<double>(global) / kept);
  for (const Tensor& t : sums) {
    HT_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "rescale_to_kept: expected contiguous float32; got ",
             dtype_name(t.dtype()), " of shape ", to_string(t.shape()));
    t.backend().unary(UnaryOp::mul_scalar, t.data(), t.data(), t.numel(), factor);
  }
}

}  // namespace ht::runtime
