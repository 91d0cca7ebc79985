#include "plan/stage_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "plan/plan_facts.h"

namespace ht::plan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_finite_nonneg(const std::vector<double>& v, const char* what) {
  for (size_t b = 0; b < v.size(); ++b)
    HT_CHECK(std::isfinite(v[b]) && v[b] >= 0, "stage partition: ", what, "[", b, "] = ",
             v[b], "; expected a finite value >= 0");
}

void validate(const StagePartitionInput& in) {
  const size_t S = in.devices.size(), B = in.memory_bytes.size();
  HT_CHECK(S >= 1, "stage partition: no devices; expected at least one stage");
  HT_CHECK(B >= 1, "stage partition: no blocks; expected at least one");
  HT_CHECK(S <= B, "stage partition: ", S, " stages but only ", B,
           " blocks; every stage needs at least one block");
  HT_CHECK(in.activation_bytes.size() == B, "stage partition: activation_bytes has ",
           in.activation_bytes.size(), " entries; expected ", B, " (one per block)");
  HT_CHECK(in.compute_seconds.size() == S, "stage partition: compute_seconds has ",
           in.compute_seconds.size(), " rows; expected ", S, " (one per device)");
  for (size_t s = 0; s < S; ++s) {
    HT_CHECK(in.compute_seconds[s].size() == B, "stage partition: compute_seconds[", s,
             "] has ", in.compute_seconds[s].size(), " entries; expected ", B);
    check_finite_nonneg(in.compute_seconds[s], "compute_seconds[stage]");
  }
  check_finite_nonneg(in.memory_bytes, "memory_bytes");
  check_finite_nonneg(in.activation_bytes, "activation_bytes");
  HT_CHECK(in.workspace_bytes.empty() || in.workspace_bytes.size() == B, "stage partition: workspace_bytes has ",
           in.workspace_bytes.size(), " entries; expected ", B, " (one per block) or none");
  check_finite_nonneg(in.workspace_bytes, "workspace_bytes");
  HT_CHECK(in.micro_batch_size >= 1, "stage partition: micro_batch_size = ",
           in.micro_batch_size, "; expected >= 1");
  HT_CHECK(in.micro_batches >= 1, "stage partition: micro_batches = ", in.micro_batches,
           "; expected >= 1");
  if (in.whole_model_stage < 0) return;
  HT_CHECK(in.whole_model_stage < static_cast<int>(S), "stage partition: whole_model_stage ",
           in.whole_model_stage, "; expected a stage below ", S);
  HT_CHECK(in.weight_bytes.size() == B, "stage partition: weight_bytes has ", in.weight_bytes.size(),
           " entries; expected ", B, " (one per block)");
  check_finite_nonneg(in.weight_bytes, "weight_bytes");
  HT_CHECK(std::isfinite(in.whole_model_capacity) && in.whole_model_capacity > 0,
           "stage partition: whole_model_capacity = ", in.whole_model_capacity, "; expected > 0");
}

// Prefix sums make every range's time and memory O(1), which keeps the DP at O(S*B^2).
struct Costs {
  const StagePartitionInput& in;
  int S, B;
  std::vector<std::vector<double>> time_prefix;  // [s][b]
  std::vector<double> mem_prefix, act_prefix, weight_prefix;
  // workspace_max[k][b]: the largest workspace of blocks [b, b + 2^k), so that a range's
  // is two lookups.
  std::vector<std::vector<double>> workspace_max;
  // The largest weights of blocks [0, b) and of blocks [b, B): a streaming rank 0's
  // others() in O(1).
  std::vector<double> weight_max_before, weight_max_from;

  explicit Costs(const StagePartitionInput& input)
      : in(input),
        S(static_cast<int>(input.devices.size())),
        B(static_cast<int>(input.memory_bytes.size())) {
    time_prefix.assign(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(B) + 1, 0));
    mem_prefix.assign(static_cast<size_t>(B) + 1, 0);
    act_prefix.assign(static_cast<size_t>(B) + 1, 0);
    weight_prefix.assign(static_cast<size_t>(B) + 1, 0);
    for (size_t b = 0; b < static_cast<size_t>(B); ++b) {
      for (size_t s = 0; s < static_cast<size_t>(S); ++s)
        time_prefix[s][b + 1] = time_prefix[s][b] + in.compute_seconds[s][b];
      mem_prefix[b + 1] = mem_prefix[b] + in.memory_bytes[b];
      act_prefix[b + 1] = act_prefix[b] + in.activation_bytes[b];
      if (in.whole_model_stage >= 0) weight_prefix[b + 1] = weight_prefix[b] + in.weight_bytes[b];
    }
    if (!in.workspace_bytes.empty()) {
      workspace_max.push_back(in.workspace_bytes);
      for (size_t width = 2; width <= static_cast<size_t>(B); width *= 2) {
        const std::vector<double>& half = workspace_max.back();
        std::vector<double> next(static_cast<size_t>(B) - width + 1);
        for (size_t b = 0; b < next.size(); ++b) next[b] = std::max(half[b], half[b + width / 2]);
        workspace_max.push_back(std::move(next));
      }
    }
    if (in.whole_model_stage >= 0 && in.whole_model_streamed) {
      weight_max_before.assign(static_cast<size_t>(B) + 1, 0);
      weight_max_from.assign(static_cast<size_t>(B) + 1, 0);
      for (size_t b = 0; b < static_cast<size_t>(B); ++b)
        weight_max_before[b + 1] = std::max(weight_max_before[b], in.weight_bytes[b]);
      for (size_t b = static_cast<size_t>(B); b-- > 0;)
        weight_max_from[b] = std::max(weight_max_from[b + 1], in.weight_bytes[b]);
    }
  }
  double seconds(int s, int i, int j) const {
    const auto& p = time_prefix[static_cast<size_t>(s)];
    return in.micro_batch_size * (p[static_cast<size_t>(j)] - p[static_cast<size_t>(i)]);
  }
  // The stage's own blocks.
  double own(int s, int i, int j) const {
    const double held = in_flight_micro_batches(s, S, in.micro_batches) *
                        static_cast<double>(in.micro_batch_size);
    return (mem_prefix[static_cast<size_t>(j)] - mem_prefix[static_cast<size_t>(i)]) +
           held * (act_prefix[static_cast<size_t>(j)] - act_prefix[static_cast<size_t>(i)]) +
           in.micro_batch_size * workspace(i, j);
  }
  // The largest workspace among blocks [i, j): the transients of the block that runs.
  double workspace(int i, int j) const {
    if (workspace_max.empty()) return 0;
    size_t k = 0;
    while ((size_t{2} << k) <= static_cast<size_t>(j - i)) ++k;
    return std::max(workspace_max[k][static_cast<size_t>(i)], workspace_max[k][static_cast<size_t>(j) - (size_t{1} << k)]);
  }
  // The other blocks' weights, which rank 0 holds on the whole-model stage: all of them,
  // or streaming them from host memory the largest.
  double others(int s, int i, int j) const {
    if (s != in.whole_model_stage) return 0;
    if (in.whole_model_streamed)
      return std::max(weight_max_before[static_cast<size_t>(i)], weight_max_from[static_cast<size_t>(j)]);
    return weight_prefix.back() - (weight_prefix[static_cast<size_t>(j)] - weight_prefix[static_cast<size_t>(i)]);
  }
  // Whether rank 0 with them is the stage's tightest device (else the group's smallest,
  // for its own blocks, is).
  bool rank0_tighter(int s, int i, int j) const {
    return s == in.whole_model_stage && in.whole_model_capacity - others(s, i, j) < capacity(s);
  }
  // What the tightest device holds, against its capacity. Never falls as j grows: a
  // block's state includes its weights.
  double memory(int s, int i, int j) const { return own(s, i, j) + (rank0_tighter(s, i, j) ? others(s, i, j) : 0); }
  double capacity(int s, int i, int j) const { return rank0_tighter(s, i, j) ? in.whole_model_capacity : capacity(s); }
  double capacity(int s) const { return in.devices[static_cast<size_t>(s)].memory_bytes; }
  bool fits(int s, int i, int j) const { return memory(s, i, j) <= capacity(s, i, j); }
};

StagePartition evaluate(const Costs& c, std::vector<std::pair<int, int>> ranges) {
  StagePartition p;
  p.ranges = std::move(ranges);
  for (int s = 0; s < c.S; ++s) {
    const auto [i, j] = p.ranges[static_cast<size_t>(s)];
    p.stage_seconds.push_back(c.seconds(s, i, j));
    p.stage_memory_bytes.push_back(c.memory(s, i, j));
    p.bottleneck_seconds = std::max(p.bottleneck_seconds, p.stage_seconds.back());
  }
  return p;
}

// Explains an infeasible instance. Single blocks are the smallest ranges, so the most
// useful finding is a block that no stage able to receive it can hold even alone, or a
// stage that cannot hold any block it could be given; otherwise the blocks fit one by
// one but no contiguous split does, and the totals say by how much.
[[noreturn]] void fail_infeasible(const Costs& c) {
  StageSplitFailure f;
  f.blocks = c.B;
  f.stages = c.S;
  f.whole_model_stage = c.in.whole_model_stage;
  if (f.whole_model_stage >= 0) f.all_weights = c.weight_prefix.back();
  f.whole_model_streamed = c.in.whole_model_streamed;
  auto at = [&](StageSplitProblem problem, int s, int b) {
    f.problem = problem;
    f.stage = s;
    f.block = b;
    const DeviceModel& d = c.in.devices[static_cast<size_t>(s)];
    // Where rank 0, holding the other blocks' weights too, is the stage's bound, its
    // device is named with its capacity (the group's smallest device was named with
    // rank 0's capacity).
    const bool rank0 = c.rank0_tighter(s, b, b + 1);
    f.device = rank0 ? "rank 0's " + (c.in.whole_model_device.empty() ? std::string("device") : c.in.whole_model_device)
                     : d.label();
    f.device_memory = rank0 ? c.in.whole_model_capacity : d.memory_bytes;
    f.needed = c.memory(s, b, b + 1);
    f.capacity = c.capacity(s, b, b + 1);
    throw StageSplitError(f);
  };
  // Stage s can receive block b only if s <= b and the later stages can still get one
  // block each: b <= B - S + s.
  for (int b = 0; b < c.B; ++b) {
    const int lo = std::max(0, b - (c.B - c.S)), hi = std::min(c.S - 1, b);
    int best = lo;
    bool any = false;
    for (int s = lo; s <= hi; ++s) {
      if (c.fits(s, b, b + 1)) any = true;
      const double room = c.capacity(s, b, b + 1) - c.memory(s, b, b + 1);
      if (room > c.capacity(best, b, b + 1) - c.memory(best, b, b + 1)) best = s;
    }
    if (!any) at(StageSplitProblem::block_too_large, best, b);
  }
  for (int s = 0; s < c.S; ++s) {
    int lightest = s;
    bool any = false;
    for (int b = s; b <= c.B - c.S + s; ++b) {
      if (c.fits(s, b, b + 1)) any = true;
      if (c.memory(s, b, b + 1) < c.memory(s, lightest, lightest + 1)) lightest = b;
    }
    if (!any) at(StageSplitProblem::stage_too_small, s, lightest);
  }
  f.problem = StageSplitProblem::no_contiguous_split;
  f.needed = c.mem_prefix.back();
  for (int s = 0; s < c.S; ++s) f.capacity += c.capacity(s);
  throw StageSplitError(f);
}

}  // namespace

int in_flight_micro_batches(int stage, int stages, int micro_batches) {
  return std::min(stages - stage, micro_batches);
}

StagePartition partition_stages(const StagePartitionInput& in) {
  validate(in);
  const Costs c(in);
  const int S = c.S, B = c.B;
  // best[s][i]: the least bottleneck of stages s..S-1 covering blocks i..B-1;
  // cut[s][i]: where stage s ends in that optimum.
  std::vector<std::vector<double>> best(static_cast<size_t>(S) + 1,
                                        std::vector<double>(static_cast<size_t>(B) + 1, kInf));
  std::vector<std::vector<int>> cut(static_cast<size_t>(S),
                                    std::vector<int>(static_cast<size_t>(B) + 1, -1));
  best[static_cast<size_t>(S)][static_cast<size_t>(B)] = 0;
  for (int s = S - 1; s >= 0; --s) {
    const size_t su = static_cast<size_t>(s);
    // Stage s starts at block >= s (earlier stages take one each) and leaves one block
    // for each later stage.
    for (int i = s; i <= B - (S - s); ++i) {
      for (int j = i + 1; j <= B - (S - s - 1); ++j) {
        const double rest = best[su + 1][static_cast<size_t>(j)];
        if (rest == kInf) continue;
        // Memory grows with j, so once a range does not fit no longer one will.
        if (!c.fits(s, i, j)) break;
        const double v = std::max(c.seconds(s, i, j), rest);
        // Strict < keeps the shortest first range among ties, a deterministic choice.
        if (v < best[su][static_cast<size_t>(i)]) {
          best[su][static_cast<size_t>(i)] = v;
          cut[su][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  if (best[0][0] == kInf) fail_infeasible(c);
  std::vector<std::pair<int, int>> ranges;
  for (int s = 0, i = 0; s < S; ++s) {
    const int j = cut[static_cast<size_t>(s)][static_cast<size_t>(i)];
    ranges.emplace_back(i, j);
    i = j;
  }
  return evaluate(c, std::move(ranges));
}

StagePartition uniform_partition(const StagePartitionInput& in) {
  validate(in);
  const Costs c(in);
  const int base = c.B / c.S, extra = c.B % c.S;
  std::vector<std::pair<int, int>> ranges;
  for (int s = 0, i = 0; s < c.S; ++s) {
    const int j = i + base + (s < extra ? 1 : 0);
    ranges.emplace_back(i, j);
    i = j;
  }
  StagePartition p = evaluate(c, std::move(ranges));
  for (int s = 0; s < c.S; ++s) {
    const auto [i, j] = p.ranges[static_cast<size_t>(s)];
    if (!c.fits(s, i, j)) p.unfit_stages.push_back(s);
  }
  return p;
}

}  // namespace ht::plan
