#include "plan/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "core/error.h"
#include "plan/stage_memory.h"

namespace ht::plan {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

MemoryUse with_micro_batches(const Plan& p, const BlockCosts& costs, RankPlan rp, int m) {
  rp.micro_batches = m;
  rp.micro_batch_size = ceil_div(rp.samples, m);
  return rank_memory(p, costs, rp);
}

// Strategy 2: the least M above the current one that fits, up to kMaxMicroBatches; when
// none does, the M with the least memory (sharding may close the rest). Returns the
// current M when nothing helps.
int choose_micro_batches(const Plan& p, const BlockCosts& costs, const RankPlan& rp) {
  const int current = rp.micro_batches;
  const int most = static_cast<int>(std::min<int64_t>(rp.samples, kMaxMicroBatches));
  // One by one while M may be under the pipeline's depth, where M micro-batches of
  // ceil(samples / M) in flight can hold more than fewer did; past that (no pipeline is
  // kLinear stages deep) the activations, the depth's micro-batches of ceil(samples / M),
  // only fall as M grows, so the least M that fits is bisected: a share of millions of
  // samples once took a scan of millions of M.
  constexpr int kLinear = 4096;
  double best = rank_memory(p, costs, rp).total();
  int best_m = current;
  for (int m = current + 1; m <= std::min(most, kLinear); ++m) {
    const double total = with_micro_batches(p, costs, rp, m).total();
    if (total <= rp.device.memory_bytes) return m;
    if (total < best) {
      best = total;
      best_m = m;
    }
  }
  int lo = std::max(current, kLinear);  // does not fit (or is the current M)
  if (most <= lo) return best_m;
  const double at_most = with_micro_batches(p, costs, rp, most).total();
  if (at_most > rp.device.memory_bytes) return at_most < best ? most : best_m;
  int hi = most;  // fits
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (with_micro_batches(p, costs, rp, mid).total() <= rp.device.memory_bytes ? hi : lo) = mid;
  }
  return hi;
}

// Strategy 3: shard the optimiser state of rp's stage over its data-parallel group in
// proportion to each member's free memory. False when the group cannot hold it.
bool shard_optimizer(Plan& p, const BlockCosts& costs, RankPlan& rp) {
  std::vector<RankPlan*> group;
  for (const auto& replica : p.layout.replicas)
    group.push_back(&p.ranks[static_cast<size_t>(replica[static_cast<size_t>(rp.stage)])]);
  if (group.size() < 2) return false;
  std::vector<double> free;
  double total_free = 0;
  for (RankPlan* g : group) {  // a member with nothing free keeps no state
    const MemoryUse u = rank_memory(p, costs, *g);
    const double f = std::max(0.0, g->device.memory_bytes - (u.params + u.grads + u.activations));
    free.push_back(f);
    total_free += f;
  }
  const StageFootprint fp = stage_footprint(costs, rp.block_begin, rp.block_end);
  const double state = fp.params * fp.optimizer_bytes_per_param;
  if (state <= 0 || total_free < state) return false;
  for (size_t i = 0; i < group.size(); ++i) {
    group[i]->optimizer_shard = free[i] / total_free;
    MemoryStep step;
    step.kind = group[i] == &rp ? MemoryStepKind::optimizer_sharding : MemoryStepKind::shard_for_peer;
    step.state_bytes = state;
    step.group_size = static_cast<int>(group.size());
    step.kept_fraction = group[i]->optimizer_shard;
    step.stage = rp.stage;
    step.for_rank = rp.rank;
    add_strategy(*group[i], MemoryStrategy::optimizer_sharding, step);
  }
  return true;
}

// One rank that does not fit: apply the strategies in order until it does.
bool fit_rank(Plan& p, const BlockCosts& costs, RankPlan& rp, bool may_shard, bool micro_batches_first) {
  const double cap = rp.device.memory_bytes;
  MemoryUse use = rank_memory(p, costs, rp);
  rp.memory_steps.push_back(over_capacity_step(use, cap));
  const auto saving = activations_step;
  // More micro-batches first only when they alone make the rank fit: sharding costs no
  // compute, while many small micro-batches can cost several times the step (a rank
  // whose weights, not activations, overflow would otherwise run one sample at a time).
  auto more_micro_batches = [&](bool only_if_fits) {
    const int m = choose_micro_batches(p, costs, rp);
    if (m <= rp.micro_batches) return;
    if (only_if_fits && with_micro_batches(p, costs, rp, m).total() > cap) return;
    p.layout.micro_batches[static_cast<size_t>(rp.replica)] = m;
    sync_rank_shares(p);
    const MemoryUse u = rank_memory(p, costs, rp);
    MemoryStep step = saving(MemoryStepKind::micro_batches, use.activations, u.activations);
    step.micro_batches = m;
    step.micro_batch_size = rp.micro_batch_size;
    add_strategy(rp, MemoryStrategy::micro_batches, step);
    use = u;
  };
  if (micro_batches_first) more_micro_batches(true);
  if (!rp.recompute && use.total() > cap) {
    RankPlan trial = rp;
    trial.recompute = true;
    const MemoryUse u = rank_memory(p, costs, trial);
    if (u.activations < use.activations) {
      rp.recompute = true;
      add_strategy(rp, MemoryStrategy::recompute,
                   saving(MemoryStepKind::recompute, use.activations, u.activations));
      use = u;
    }
  }
  if (use.total() > cap) more_micro_batches(true);
  // Sharding splits what the group has free; a rank whose activations leave it none
  // shards after the micro-batches instead.
  auto shard = [&] {
    if (may_shard && use.total() > cap && rp.optimizer_shard == 1 && shard_optimizer(p, costs, rp))
      use = rank_memory(p, costs, rp);
  };
  shard();
  if (use.total() > cap) more_micro_batches(false);
  shard();
  return use.total() <= cap;
}

}  // namespace

MemoryStep over_capacity_step(const MemoryUse& use, double capacity) {
  MemoryStep step;
  step.kind = MemoryStepKind::over_capacity;
  step.use = use;
  step.capacity = capacity;
  return step;
}

MemoryStep activations_step(MemoryStepKind kind, double before, double after) {
  MemoryStep step;
  step.kind = kind;
  step.activations_before = before;
  step.activations_after = after;
  return step;
}

void add_strategy(RankPlan& rp, MemoryStrategy strategy, const MemoryStep& step) {
  auto& applied = rp.memory_strategies;
  if (std::find(applied.begin(), applied.end(), strategy) == applied.end()) applied.push_back(strategy);
  rp.memory_steps.push_back(step);
}

void sync_rank_shares(Plan& plan) {
  for (RankPlan& rp : plan.ranks) {
    if (rp.replica < 0) continue;
    const auto r = static_cast<size_t>(rp.replica);
    rp.samples = plan.layout.samples[r];
    rp.micro_batches = plan.layout.micro_batches[r];
    rp.micro_batch_size = ceil_div(rp.samples, rp.micro_batches);
  }
}

// The weights rank 0 holds on its device beside its stage's (blocks [begin, end); none
// when idle): it evaluates and checkpoints the whole model (runtime/trainer.cpp). A CPU
// rank holds them all (its device is host memory); a GPU rank keeps them in host memory
// and streams one block at a time through its device to evaluate, so the largest.
static double rank0_other_weights(const BlockCosts& costs, const RankPlan& rp, int begin, int end) {
  double all = 0, largest = 0;
  for (size_t b = 0; b < costs.params.size(); ++b) {
    if (static_cast<int>(b) >= begin && static_cast<int>(b) < end) continue;
    all += kWeightBytesPerParam * costs.params[b];
    largest = std::max(largest, kWeightBytesPerParam * costs.params[b]);
  }
  return rp.device.kind == DeviceKind::cpu ? all : largest;
}

MemoryUse rank_memory(const Plan& plan, const BlockCosts& costs, const RankPlan& rp) {
  if (rp.replica < 0) {  // an idle rank holds nothing but, as rank 0, the weights above
    MemoryUse idle;
    if (rp.rank == 0) idle.params = rank0_other_weights(costs, rp, 0, 0);
    return idle;
  }
  StageMemoryParams params;
  params.stage = rp.stage;
  params.stages = static_cast<int>(plan.stage_ranges.size());
  params.micro_batch_size = rp.micro_batch_size;
  params.micro_batches = rp.micro_batches;
  params.recompute = rp.recompute;
  params.optimizer_shard = rp.optimizer_shard;
  MemoryUse m = stage_memory(stage_footprint(costs, rp.block_begin, rp.block_end), params);
  if (rp.rank == 0 && params.stages > 1) m.params += rank0_other_weights(costs, rp, rp.block_begin, rp.block_end);
  return m;
}

namespace {

// What host_memory needs beside the rank, made once per plan: the blocks' weights as
// prefix sums, and which replicas are in a local group (O(ranks + blocks) for a plan).
struct HostFacts {
  std::vector<double> weights_before;  // [b]: the weights of blocks [0, b)
  double largest_block = 0;            // the most parameters of one block
  bool receives_state = false;         // rank 0 receives optimiser state at a checkpoint
  std::vector<char> grouped;           // [replica]: in a local group (empty: not local)
};

HostFacts host_facts(const Plan& plan, const BlockCosts& costs) {
  HostFacts f;
  f.weights_before.push_back(0);
  for (double p : costs.params) {
    f.weights_before.push_back(f.weights_before.back() + kWeightBytesPerParam * p);
    f.largest_block = std::max(f.largest_block, p);
  }
  // Every rank's state but rank 0's own, where rank 0 holds not all of it: another stage,
  // a shard, or all of it when idle (not under local: rank 0 writes its group's).
  bool shards = false;
  for (const RankPlan& r : plan.ranks) shards = shards || (r.replica >= 0 && r.optimizer_shard < 1);
  f.receives_state = !plan.local && plan.world_size > 1 &&
                     (plan.stage_ranges.size() > 1 || shards || plan.ranks.empty() || plan.ranks[0].replica < 0);
  if (plan.local) {
    f.grouped.assign(plan.layout.replicas.size(), 0);
    for (const std::vector<int>& g : plan.local->groups)
      for (int r : g)
        if (r >= 0 && static_cast<size_t>(r) < f.grouped.size()) f.grouped[static_cast<size_t>(r)] = 1;
  }
  return f;
}

HostUse host_use(const Plan& plan, const BlockCosts& costs, const RankPlan& rp, const HostFacts& f) {
  HostUse h;
  const double all = f.weights_before.back();
  const bool idle = rp.replica < 0;
  // In a plan of several stages (not local) a rank other than rank 0 releases the other
  // blocks' weights as each is made (runtime/trainer.cpp's build_in_host_staging): it
  // holds one of them at a time while the model is built, and none after.
  const bool releases = rp.rank != 0 && !plan.local && plan.stage_ranges.size() > 1;
  const double outside =
      releases ? 0
      : idle   ? all
               : all - (f.weights_before[static_cast<size_t>(rp.block_end)] -
                        f.weights_before[static_cast<size_t>(rp.block_begin)]);
  // Where its device is this memory, its use counts, and rank_memory already holds rank
  // 0's other weights (all of them, on a CPU rank).
  if (rp.device.device_in_host) h.device = rank_memory(plan, costs, rp).total();
  h.other_weights = rp.device.device_in_host && rp.rank == 0 ? 0 : outside;
  // A checkpoint streams the optimiser state through rank 0 a tensor at a time
  // (runtime/stage_gather.h's stream_optimizer_state): a tensor it receives from another
  // rank, or one of its own copied off a GPU, is in host memory on its way to the file, at
  // most one block's. Rank 0's own state in host memory is written where it is.
  if (rp.rank == 0 && (f.receives_state || rp.device.kind != DeviceKind::cpu))
    h.checkpoint_state = costs.optimizer_bytes_per_param * f.largest_block;
  // The outer exchange's members (outer_members): the groups' ranks and rank 0.
  const bool member = rp.rank == 0 || (!idle && static_cast<size_t>(rp.replica) < f.grouped.size() &&
                                       f.grouped[static_cast<size_t>(rp.replica)]);
  if (plan.local && member) h.outer_state = outer_state_bytes(costs);
  return h;
}

}  // namespace

double outer_state_bytes(const BlockCosts& costs) {
  return 4 * kWeightBytesPerParam * std::accumulate(costs.params.begin(), costs.params.end(), 0.0);
}

HostUse host_memory(const Plan& plan, const BlockCosts& costs, const RankPlan& rp) {
  return host_use(plan, costs, rp, host_facts(plan, costs));
}

namespace {

// Ranks by host, for the hosts the cluster gives memory for; in order of first rank. A
// rank whose host has no name is a host of its own.
std::vector<std::vector<const RankPlan*>> ranks_by_host(const Plan& plan) {
  std::vector<std::vector<const RankPlan*>> out;
  std::map<std::string, size_t> index;
  for (const RankPlan& rp : plan.ranks) {
    if (!(rp.device.host_memory_bytes > 0)) continue;
    // A rank without a host name is a host of its own: a key no host name can be.
    std::string key = rp.device.host;
    if (key.empty()) {
      key.push_back('\0');
      key += std::to_string(rp.rank);
    }
    const auto [it, fresh] = index.try_emplace(key, out.size());
    if (fresh) out.emplace_back();
    out[it->second].push_back(&rp);
  }
  return out;
}

double host_total(const std::vector<const RankPlan*>& ranks) {
  double sum = 0;
  for (const RankPlan* rp : ranks) sum += rp->host.total();
  return sum;
}

}  // namespace

std::optional<Shortfall> fit_host_memory(Plan& plan, const BlockCosts& costs) {
  const HostFacts facts = host_facts(plan, costs);
  for (RankPlan& rp : plan.ranks) rp.host = host_use(plan, costs, rp, facts);
  for (const auto& ranks : ranks_by_host(plan)) {
    const double sum = host_total(ranks), capacity = ranks.front()->device.host_memory_bytes;
    if (sum <= capacity) continue;
    const RankPlan* most = ranks.front();
    for (const RankPlan* rp : ranks)
      if (rp->host.total() > most->host.total()) most = rp;
    Shortfall s = shortfall_of(*most);
    s.host = true;
    s.host_name = most->device.host;
    s.host_need = most->host;
    s.host_others = sum - most->host.total();
    s.capacity = capacity;
    return s;
  }
  return std::nullopt;
}

void note_host_memory(Plan& plan) {
  auto& notes = plan.notes;
  notes.erase(std::remove_if(notes.begin(), notes.end(), [](const PlanNote& n) { return n.kind == NoteKind::host_memory; }),
              notes.end());
  bool beside = false;
  for (const RankPlan& rp : plan.ranks) beside = beside || rp.host.total() > rp.host.device;
  if (!beside) return;
  PlanNote n;
  n.kind = NoteKind::host_memory;
  // The fullest host, where hosts give their memory; else the rank keeping the most.
  double fullest = -1;
  for (const auto& ranks : ranks_by_host(plan)) {
    const double sum = host_total(ranks), capacity = ranks.front()->device.host_memory_bytes;
    if (sum / capacity <= fullest) continue;
    fullest = sum / capacity;
    n.ranks.clear();
    for (const RankPlan* rp : ranks) n.ranks.push_back(rp->rank);
    n.bytes = sum;
    n.other_bytes = capacity;
  }
  if (n.ranks.empty()) {
    const RankPlan* most = &plan.ranks.front();
    for (const RankPlan& rp : plan.ranks)
      if (rp.host.total() > most->host.total()) most = &rp;
    n.ranks = {most->rank};
    n.bytes = most->host.total();
  }
  notes.push_back(n);
}

Shortfall shortfall_of(const RankPlan& rp) {
  Shortfall s;
  s.rank = rp.rank;
  s.device = rp.device.label();
  s.capacity = rp.device.memory_bytes;
  s.stage = rp.stage;
  s.block_begin = rp.block_begin;
  s.block_end = rp.block_end;
  s.samples = rp.samples;
  s.need = rp.memory;
  s.micro_batches = rp.micro_batches;
  s.micro_batch_size = rp.micro_batch_size;
  s.idle = rp.replica < 0;
  s.sharded = rp.optimizer_shard < 1;
  return s;
}

std::optional<Shortfall> fit_memory(Plan& plan, const BlockCosts& costs, bool may_shard, bool micro_batches_first) {
  // A later rank's decision can only lower what others hold, except more micro-batches,
  // which can raise a deeper stage's in-flight total by rounding; so repeat until stable.
  for (int pass = 0; pass < 4; ++pass) {
    bool changed = false;
    for (RankPlan& rp : plan.ranks) {
      if (rp.replica < 0 || rank_memory(plan, costs, rp).total() <= rp.device.memory_bytes)
        continue;
      changed = true;
      if (!fit_rank(plan, costs, rp, may_shard, micro_batches_first)) {
        rp.memory = rank_memory(plan, costs, rp);
        Shortfall s = shortfall_of(rp);
        s.after_strategies = true;
        s.sharding_possible = may_shard && plan.layout.replicas.size() > 1;
        return s;
      }
    }
    if (!changed) break;
  }
  // Recomputation costs a forward each step. A rank that took it before the replica's
  // micro-batches grew (for another of its ranks, or later for itself) may fit without
  // it now: it is taken back there, and the step says so (it stayed on, a fifth of a
  // step's time on a 1.3B model's pipeline whose ranks were left at a third of memory).
  for (RankPlan& rp : plan.ranks) {
    if (rp.replica < 0 || !rp.recompute) continue;
    RankPlan trial = rp;
    trial.recompute = false;
    const MemoryUse with = rank_memory(plan, costs, rp), without = rank_memory(plan, costs, trial);
    if (without.total() > rp.device.memory_bytes) continue;
    rp.recompute = false;
    auto& s = rp.memory_strategies;
    s.erase(std::remove(s.begin(), s.end(), MemoryStrategy::recompute), s.end());
    rp.memory_steps.push_back(activations_step(MemoryStepKind::recompute_dropped, with.activations, without.activations));
  }
  auto& recompute = plan.layout.recompute;
  recompute.assign(plan.layout.replicas.size(), std::vector<bool>(plan.stage_ranges.size(), false));
  for (RankPlan& rp : plan.ranks) {
    rp.memory = rank_memory(plan, costs, rp);
    if (rp.replica >= 0) recompute[static_cast<size_t>(rp.replica)][static_cast<size_t>(rp.stage)] = rp.recompute;
  }
  for (const RankPlan& rp : plan.ranks)
    if (rp.memory.total() > rp.device.memory_bytes) return shortfall_of(rp);
  if (auto s = fit_evaluation(plan, costs)) return s;
  return fit_host_memory(plan, costs);
}

std::optional<Shortfall> fit_evaluation(const Plan& plan, const BlockCosts& costs) {
  if (costs.eval_batch <= 0 || plan.ranks.empty() || plan.ranks.front().rank != 0) return std::nullopt;
  const RankPlan& root = plan.ranks.front();
  const double per_sample =
      root.device.kind == DeviceKind::cpu ? costs.eval_bytes_per_sample : costs.eval_fused_bytes_per_sample;
  if (!(per_sample > 0)) return std::nullopt;
  const double kept = root.memory.params + root.memory.optimizer, capacity = root.device.memory_bytes;
  auto need = [&](int64_t n) { return kept + static_cast<double>(n) * per_sample + BlockCosts::kEvalFixedBytes; };
  if (need(costs.eval_batch) <= capacity) return std::nullopt;
  Shortfall s = shortfall_of(root);
  s.evaluation = true;
  s.eval_batch = costs.eval_batch;
  s.need = root.memory;
  s.need.grads = 0;
  s.need.activations = need(costs.eval_batch) - kept;  // the evaluation's, in their place
  s.eval_fits =
      std::max<int64_t>(0, static_cast<int64_t>(std::floor((capacity - kept - BlockCosts::kEvalFixedBytes) / per_sample)));
  s.eval_fits = std::min(s.eval_fits, costs.eval_batch - 1);
  return s;
}

}  // namespace ht::plan
