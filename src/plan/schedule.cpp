#include "plan/schedule.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace ht::plan {

const char* op_name(Op op) {
  static constexpr const char* names[] = {  // in the order of enum Op
      "LoadMicroBatch", "Forward",  "Backward",    "SendActivation", "RecvActivation",
      "SendGrad",       "RecvGrad", "ReduceGrads", "OptimizerStep",  "Recompute",
      "ReduceStart",    "GatherWeights", "ShareWeights", "AwaitWeights", "ReduceGradsDeadline",
      "CatchUp",        "AlignReplica", "OuterSyncFinish", "OuterSyncStart"};
  static_assert(std::size(names) == static_cast<size_t>(Op::outer_sync_start) + 1);
  const auto i = static_cast<size_t>(op);
  return i < std::size(names) ? names[i] : "UnknownOp";
}

std::string to_text(const Instruction& in) {
  std::ostringstream s;
  s << op_name(in.op);
  if (in.micro_batch >= 0) s << " mb=" << in.micro_batch;
  if (in.stage >= 0) s << " stage=" << in.stage;
  if (in.peer >= 0) s << " peer=" << in.peer;
  if (in.bytes > 0) s << " bytes=" << in.bytes;
  if (in.replica >= 0) s << " replica=" << in.replica;
  return s.str();
}

std::string to_text(const Schedule& schedule) {
  std::string out;
  for (const Instruction& in : schedule) out += to_text(in) + "\n";
  return out;
}

std::vector<double> reduce_parts(const PipelineLayout& layout) {
  const size_t n = layout.samples.size();
  if (layout.reduce_owner >= 0) {
    HT_CHECK(static_cast<size_t>(layout.reduce_owner) < n, "reduce_parts: reduce_owner ", layout.reduce_owner,
             " is not one of the ", n, " replicas");
    std::vector<double> parts(n, 0);
    parts[static_cast<size_t>(layout.reduce_owner)] = 1;
    return parts;
  }
  double total = 0;
  for (int64_t samples : layout.samples) total += static_cast<double>(samples);
  std::vector<double> parts;
  for (int64_t samples : layout.samples) parts.push_back(static_cast<double>(samples) / total);
  return parts;
}

int64_t micro_batch_samples(const PipelineLayout& layout, int replica, int mb) {
  HT_CHECK(replica >= 0 && static_cast<size_t>(replica) < layout.samples.size() &&
               static_cast<size_t>(replica) < layout.micro_batches.size(),
           "micro_batch_samples: replica ", replica, " is not in the layout");
  const int64_t n = layout.samples[replica], m = layout.micro_batches[replica];
  HT_CHECK(mb >= 0 && mb < m, "micro_batch_samples: micro-batch ", mb, " of replica ", replica,
           "; expected 0 to ", m - 1);
  return n / m + (mb < n % m ? 1 : 0);
}

bool has_trial(const PipelineLayout& layout) {
  return std::any_of(layout.alternate_micro_batches.begin(), layout.alternate_micro_batches.end(),
                     [](int m) { return m > 0; });
}

PipelineLayout trial_layout(const PipelineLayout& layout) {
  PipelineLayout out = layout;
  const std::vector<int>& alternate = layout.alternate_micro_batches;
  HT_CHECK(alternate.empty() || alternate.size() == layout.micro_batches.size(), "trial_layout: ",
           alternate.size(), " alternate_micro_batches for ", layout.micro_batches.size(), " replicas");
  for (size_t r = 0; r < alternate.size(); ++r)
    if (alternate[r] > 0) out.micro_batches[r] = alternate[r];
  out.alternate_micro_batches.clear();
  return out;
}

int warmup_forwards(int stage, int stages, int micro_batches) {
  return std::min(stages - 1 - stage, micro_batches);
}

// --- Builder ---
namespace {

void validate(const PipelineLayout& layout, int world_size) {
  HT_CHECK(world_size >= 1, "build_1f1b: world_size ", world_size, "; expected >= 1");
  HT_CHECK(!layout.replicas.empty(), "build_1f1b: the layout has no replicas");
  HT_CHECK(layout.micro_batches.size() == layout.replicas.size(), "build_1f1b: micro_batches has ",
           layout.micro_batches.size(), " entries; expected ", layout.replicas.size(),
           " (one per replica)");
  HT_CHECK(layout.samples.size() == layout.replicas.size(), "build_1f1b: samples has ",
           layout.samples.size(), " entries; expected ", layout.replicas.size(),
           " (one per replica)");
  for (size_t r = 0; r < layout.micro_batches.size(); ++r)
    HT_CHECK(layout.micro_batches[r] >= 1 && layout.micro_batches[r] <= layout.samples[r],
             "build_1f1b: micro_batches[", r, "] = ", layout.micro_batches[r],
             "; expected 1 to samples[", r, "] = ", layout.samples[r],
             " (every micro-batch holds a sample)");
  const size_t stages = layout.replicas[0].size();
  HT_CHECK(stages >= 1, "build_1f1b: replica 0 has no stages");
  std::map<int, std::pair<size_t, size_t>> seen;  // rank -> (replica, stage)
  for (size_t r = 0; r < layout.replicas.size(); ++r) {
    HT_CHECK(layout.replicas[r].size() == stages, "build_1f1b: replica ", r, " has ",
             layout.replicas[r].size(), " stages but replica 0 has ", stages,
             "; every replica must have the same stages");
    for (size_t s = 0; s < stages; ++s) {
      const int rank = layout.replicas[r][s];
      HT_CHECK(rank >= 0 && rank < world_size, "build_1f1b: replicas[", r, "][", s, "] = rank ",
               rank, " is outside the world [0, ", world_size, ")");
      auto [it, fresh] = seen.emplace(rank, std::make_pair(r, s));
      HT_CHECK(fresh, "build_1f1b: rank ", rank, " appears twice, at replicas[", it->second.first,
               "][", it->second.second, "] and replicas[", r, "][", s,
               "]; a rank runs at most one stage");
    }
  }
  HT_CHECK(layout.activation_bytes.size() == stages - 1, "build_1f1b: activation_bytes has ",
           layout.activation_bytes.size(), " entries; expected ", stages - 1,
           " (one per stage boundary)");
  for (size_t b = 0; b < layout.activation_bytes.size(); ++b)
    HT_CHECK(layout.activation_bytes[b] >= 0, "build_1f1b: activation_bytes[", b,
             "] = ", layout.activation_bytes[b], "; expected >= 0");
  auto check_shape = [&](const auto& per_stage, const char* what) {
    HT_CHECK(per_stage.empty() || per_stage.size() == layout.replicas.size(), "build_1f1b: ",
             what, " has ", per_stage.size(), " rows; expected ", layout.replicas.size(),
             " (one per replica) or none");
    for (size_t r = 0; r < per_stage.size(); ++r)
      HT_CHECK(per_stage[r].size() == stages, "build_1f1b: ", what, "[", r, "] has ",
               per_stage[r].size(), " entries; expected ", stages, " (one per stage)");
  };
  check_shape(layout.recompute, "recompute");
  check_shape(layout.forward_seconds, "forward_seconds");
  check_shape(layout.backward_seconds, "backward_seconds");
  HT_CHECK(layout.forward_seconds.empty() == layout.backward_seconds.empty(),
           "build_1f1b: forward_seconds and backward_seconds must be given together");
  for (size_t r = 0; r < layout.forward_seconds.size(); ++r)
    for (size_t s = 0; s < stages; ++s)
      HT_CHECK(layout.forward_seconds[r][s] >= 0 && layout.backward_seconds[r][s] >= 0,
               "build_1f1b: negative cost estimate at replica ", r, " stage ", s);
}

struct ComputeStep {
  bool forward;
  int micro_batch;
};

// 1F1B order of one stage: warm-up forwards, then one forward and one backward in turn,
// then the cool-down backwards. At most min(S-s, M) micro-batches are in flight, which is
// the point of 1F1B: activation memory bounded by the depth, not by M.
std::vector<ComputeStep> one_f_one_b(int stage, int stages, int m) {
  const int warmup = warmup_forwards(stage, stages, m);
  std::vector<ComputeStep> steps;
  for (int i = 0; i < warmup; ++i) steps.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    steps.push_back({true, warmup + i});
    steps.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) steps.push_back({false, i});
  return steps;
}

// Where each instruction of one stage goes. Communication is ordered by a key shared by
// both ends of a pair, and every rank issues its pairs in increasing key order: then the
// pairs can complete one after another in key order, so no cycle of blocked ranks exists
// even when every send is rendezvous. (A local rule such as "send, then receive" does not
// suffice: in 1F1B's warm-up, neighbours reach their sends and receives in different
// combinations, and a rendezvous send would block both.)
struct Slot {
  double time;      // of a nominal run (see build_1f1b): used for ordering only
  int phase;        // 0 = pair, 1 = compute: a pair at time t may feed compute at t
  int a, b, c;      // pair: (sending stage, kind, micro-batch); compute: sequence number
  Instruction in;
  bool operator<(const Slot& o) const {
    return std::tie(time, phase, a, b, c) < std::tie(o.time, o.phase, o.a, o.b, o.c);
  }
};

// The schedules of one replica's stages. A nominal timing places each compute step as
// early as its 1F1B order and its input allow; each transfer happens when its producer
// finishes, so a receive may be posted before earlier compute of the receiver (it still
// precedes the Forward or Backward that consumes it).
std::vector<Schedule> build_replica(const PipelineLayout& layout, size_t replica) {
  const auto& ranks = layout.replicas[replica];
  const int stages = static_cast<int>(ranks.size());
  const int m = layout.micro_batches[replica];
  const bool timed = !layout.forward_seconds.empty();
  auto recomputes = [&](int s) { return !layout.recompute.empty() && layout.recompute[replica][s]; };
  auto cost = [&](int s, bool forward) {
    if (!timed) return forward ? 1.0 : 2.0;
    const double f = layout.forward_seconds[replica][s];
    return forward ? f : layout.backward_seconds[replica][s] + (recomputes(s) ? f : 0.0);
  };
  std::vector<std::vector<ComputeStep>> order(stages);
  for (int s = 0; s < stages; ++s) order[s] = one_f_one_b(s, stages, m);

  // done_f[s][mb], done_b[s][mb]: nominal finish times; -1 while not yet placed.
  std::vector<std::vector<double>> done_f(stages, std::vector<double>(m, -1)), done_b = done_f;
  std::vector<std::vector<Slot>> slots(stages);
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0);
  int counter = 0;
  for (bool progress = true; progress;) {  // 1F1B's dataflow is acyclic: this terminates
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < order[s].size()) {
        const ComputeStep step = order[s][next[s]];
        const int mb = step.micro_batch;
        const double ready = step.forward ? (s > 0 ? done_f[s - 1][mb] : 0)
                                           : (s < stages - 1 ? done_b[s + 1][mb] : 0);
        if (ready < 0) break;  // input not produced yet
        const double start = std::max(ready, free_at[s]);
        // A result is sent strictly after the compute that makes it starts, even at zero cost.
        const double end = std::max(start + cost(s, step.forward),
                                    std::nextafter(start, std::numeric_limits<double>::infinity()));
        (step.forward ? done_f : done_b)[s][mb] = end;
        free_at[s] = end;
        auto compute = [&](Op op) { slots[s].push_back({start, 1, counter++, 0, 0, {op, mb, s}}); };
        if (step.forward) {
          if (s == 0 || s == stages - 1) compute(Op::load_micro_batch);
          compute(Op::forward);
        } else {
          // The last Backward completes every block's gradients as it goes, so the
          // reduction can take them block by block from there on.
          if (layout.replicas.size() > 1 && next[s] + 1 == order[s].size()) compute(Op::reduce_start);
          // Recompute right before the Backward: the rebuilt activations then live only as
          // long as the Backward that needs them.
          if (recomputes(s)) compute(Op::recompute);
          compute(Op::backward);
        }
        // Each SendActivation must be paired with a RecvActivation on the next stage (and
        // each SendGrad with a RecvGrad on the previous one), or both ranks deadlock.
        const int to = step.forward ? s + 1 : s - 1;
        if (to >= 0 && to < stages) {
          const int64_t bytes = layout.activation_bytes[std::min(s, to)] *  // boundary
                                micro_batch_samples(layout, static_cast<int>(replica), mb);
          const Op send = step.forward ? Op::send_activation : Op::send_grad;
          const Op recv = step.forward ? Op::recv_activation : Op::recv_grad;
          const int kind = static_cast<int>(send);  // same key on both ends of the pair
          slots[s].push_back({end, 0, s, kind, mb, {send, mb, s, ranks[to], bytes}});
          slots[to].push_back({end, 0, s, kind, mb, {recv, mb, to, ranks[s], bytes}});
        }
        ++next[s];
        progress = true;
      }
    }
  }

  std::vector<Schedule> out(stages);
  for (int s = 0; s < stages; ++s) {
    HT_CHECK(next[s] == order[s].size(), "build_1f1b: stage ", s, " of replica ", replica,
             " could not place step ", next[s], " (internal error: 1F1B order is cyclic)");
    std::stable_sort(slots[s].begin(), slots[s].end());
    for (const Slot& slot : slots[s]) out[s].push_back(slot.in);
    // Gradients are complete only after the last Backward; the reduction spans the ranks
    // that run this stage in every replica, so it exists only with more than one replica.
    if (layout.replicas.size() > 1) out[s].push_back({Op::reduce_grads, -1, s});
    out[s].push_back({Op::optimizer_step, -1, s});
  }
  return out;
}

}  // namespace

std::vector<Schedule> build_1f1b(const PipelineLayout& layout, int world_size) {
  validate(layout, world_size);
  std::vector<Schedule> schedules(world_size);  // idle ranks keep an empty schedule
  for (size_t r = 0; r < layout.replicas.size(); ++r) {
    std::vector<Schedule> stages = build_replica(layout, r);
    for (size_t s = 0; s < stages.size(); ++s)
      schedules[layout.replicas[r][s]] = std::move(stages[s]);
  }
  return schedules;
}

void add_weight_sync(std::vector<Schedule>& schedules, const PipelineLayout& layout,
                     const std::vector<WeightSync>& sync) {
  if (sync.empty()) return;
  const size_t stages = layout.replicas.at(0).size();
  HT_CHECK(sync.size() == stages, "add_weight_sync: ", sync.size(), " entries for ", stages, " stages");
  for (size_t s = 0; s < stages; ++s) {
    if (sync[s] == WeightSync::own) continue;
    const int hub = layout.reduce_owner;
    HT_CHECK(sync[s] != WeightSync::share || (hub >= 0 && static_cast<size_t>(hub) < layout.replicas.size()),
             "add_weight_sync: stage ", s, " shares its hub's weights but the layout has no hub (reduce_owner ",
             hub, ")");
    for (size_t r = 0; r < layout.replicas.size(); ++r) {
      const int rank = layout.replicas[r][s];
      Schedule& sched = schedules.at(static_cast<size_t>(rank));
      auto it = std::find_if(sched.begin(), sched.end(), [](const Instruction& in) { return in.op == Op::optimizer_step; });
      HT_CHECK(it != sched.end(), "add_weight_sync: rank ", rank, " has no OptimizerStep");
      Instruction in{Op::gather_weights, -1, static_cast<int>(s)};
      if (sync[s] == WeightSync::share) {
        const bool is_hub = static_cast<int>(r) == hub;
        in.op = is_hub ? Op::share_weights : Op::await_weights;
        if (!is_hub) in.peer = layout.replicas[static_cast<size_t>(hub)][s];
      }
      sched.insert(it + 1, in);
    }
  }
}

InstructionCounts expected_1f1b_counts(int stage, int stages, int micro_batches, int replicas,
                                       bool recompute) {
  HT_CHECK(stages >= 1 && stage >= 0 && stage < stages, "expected_1f1b_counts: stage ", stage,
           " of ", stages, "; expected 0 <= stage < stages");
  HT_CHECK(micro_batches >= 1 && replicas >= 1, "expected_1f1b_counts: micro_batches ",
           micro_batches, ", replicas ", replicas, "; expected both >= 1");
  const int m = micro_batches;
  const bool first = stage == 0, last = stage == stages - 1;
  InstructionCounts c;
  c.loads = (first || last) ? m : 0;  // one load per micro-batch even when first == last
  c.forwards = c.backwards = m;
  c.send_activations = c.recv_grads = last ? 0 : m;
  c.recv_activations = c.send_grads = first ? 0 : m;
  c.recomputes = recompute ? m : 0;
  c.reduces = c.reduce_starts = replicas > 1 ? 1 : 0;
  c.steps = 1;
  return c;
}

InstructionCounts count(const Schedule& schedule) {
  InstructionCounts c;
  for (const Instruction& in : schedule)
    switch (in.op) {
      case Op::load_micro_batch: ++c.loads; break;
      case Op::forward: ++c.forwards; break;
      case Op::backward: ++c.backwards; break;
      case Op::send_activation: ++c.send_activations; break;
      case Op::recv_activation: ++c.recv_activations; break;
      case Op::send_grad: ++c.send_grads; break;
      case Op::recv_grad: ++c.recv_grads; break;
      case Op::reduce_grads: ++c.reduces; break;
      case Op::optimizer_step: ++c.steps; break;
      case Op::recompute: ++c.recomputes; break;
      case Op::reduce_start: ++c.reduce_starts; break;
      case Op::gather_weights: ++c.gathers; break;
      case Op::share_weights: ++c.shares; break;
      case Op::await_weights: ++c.awaits; break;
      case Op::reduce_grads_deadline: ++c.reduces; break;
      case Op::catch_up: break;
      case Op::align_replica: ++c.aligns; break;
      case Op::outer_sync_finish: break;
      case Op::outer_sync_start: break;
    }
  return c;
}

// --- Checker ---
namespace {

std::string where(const std::vector<Schedule>& all, int rank, size_t index) {
  return "rank " + std::to_string(rank) + " instruction " + std::to_string(index) + " (" +
         to_text(all[rank][index]) + ")";
}
ScheduleReport problem(const std::string& text) { return {false, text}; }

// (a) Pairing: the k-th send from src to dst of a kind meets the k-th matching receive on
// dst, so both must agree on micro-batch and bytes, or the executor would hand one
// micro-batch's activations to another's Forward.
std::optional<ScheduleReport> check_pairing(const std::vector<Schedule>& all) {
  const int n = static_cast<int>(all.size());
  using Key = std::tuple<int, int, Op>;  // (src, dst, send kind)
  std::map<Key, std::vector<size_t>> sends, recvs;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < all[r].size(); ++i) {
      const Instruction& in = all[r][i];
      if (!is_send(in.op) && !is_recv(in.op) && in.op != Op::await_weights) continue;
      if (in.peer < 0 || in.peer >= n || in.peer == r)
        return problem(where(all, r, i) + ": peer " + std::to_string(in.peer) +
                       " is not another rank in [0, " + std::to_string(n) + ")");
      if (in.op == Op::await_weights) continue;  // see check_weight_word
      if (is_send(in.op)) sends[{r, in.peer, in.op}].push_back(i);
      else recvs[{in.peer, r, send_of(in.op)}].push_back(i);
    }
  }
  for (const auto& [key, sent] : sends) {
    const auto [src, dst, kind] = key;
    const auto it = recvs.find(key);
    const size_t received = it == recvs.end() ? 0 : it->second.size();
    for (size_t k = 0; k < sent.size(); ++k) {
      if (k >= received)
        return problem(where(all, src, sent[k]) + " has no matching " + op_name(recv_of(kind)) +
                       " on rank " + std::to_string(dst) + " (it posts " +
                       std::to_string(received) + " from rank " + std::to_string(src) + ")");
      const Instruction& a = all[src][sent[k]];
      const Instruction& b = all[dst][it->second[k]];
      if (a.micro_batch != b.micro_batch || a.bytes != b.bytes)
        return problem(where(all, src, sent[k]) + " is send #" + std::to_string(k) +
                       " to rank " + std::to_string(dst) + " but receive #" + std::to_string(k) +
                       " there is " + where(all, dst, it->second[k]) +
                       ": micro-batch or bytes differ (pairs must be issued in the same order)");
    }
  }
  for (const auto& [key, received] : recvs) {
    const auto [src, dst, kind] = key;
    const auto it = sends.find(key);
    const size_t sent = it == sends.end() ? 0 : it->second.size();
    if (received.size() > sent)
      return problem(where(all, dst, received[sent]) + " has no matching " + op_name(kind) +
                     " on rank " + std::to_string(src) + " (it sends " + std::to_string(sent) +
                     ")");
  }
  return std::nullopt;
}

// Where each rank holds `op`, per stage: (stage, op) -> rank -> instruction indices.
using Holders = std::map<std::pair<int, Op>, std::map<int, std::vector<size_t>>>;
Holders holders(const std::vector<Schedule>& all) {
  Holders h;
  for (int r = 0; r < static_cast<int>(all.size()); ++r)
    for (size_t i = 0; i < all[r].size(); ++i) h[{all[r][i].stage, all[r][i].op}][r].push_back(i);
  return h;
}

// (e) The executor runs these over the stage's whole group (every replica's rank of the
// stage), so a rank of the group without one would leave the others waiting, and one
// outside it would wait alone.
std::optional<ScheduleReport> check_stage_groups(const std::vector<Schedule>& all) {
  const Holders h = holders(all);
  // The ranks holding any of `ops` for stage s, each with its first such instruction.
  auto held = [&](int s, std::initializer_list<Op> ops) {
    std::map<int, size_t> out;
    for (Op op : ops)
      if (auto it = h.find({s, op}); it != h.end())
        for (const auto& [r, at] : it->second) out.try_emplace(r, at.front());
    return out;
  };
  auto text = [](const std::map<int, size_t>& ranks) {
    std::string t;
    for (const auto& [r, i] : ranks) t += (t.empty() ? "" : ", ") + std::to_string(r);
    return t.empty() ? std::string("none") : t;
  };
  std::set<int> stages;
  for (const auto& [key, at] : h) stages.insert(key.first);
  for (int s : stages) {
    const std::map<int, size_t> group = held(s, {Op::reduce_grads, Op::reduce_grads_deadline});
    const std::pair<const char*, std::map<int, size_t>> kinds[] = {
        {"ReduceStart", held(s, {Op::reduce_start})},
        {"GatherWeights", held(s, {Op::gather_weights})},
        {"ShareWeights/AwaitWeights", held(s, {Op::share_weights, Op::await_weights})}};
    for (const auto& [what, ranks] : kinds) {
      if (ranks.empty()) continue;
      for (const auto& [r, i] : ranks)
        if (!group.count(r))
          return problem(where(all, r, i) + ": rank " + std::to_string(r) + " holds no ReduceGrads of stage " +
                         std::to_string(s) + "; its " + what + " runs over that group (ranks " + text(group) + ")");
      for (const auto& [r, i] : group)
        if (!ranks.count(r))
          return problem(where(all, r, i) + ": stage " + std::to_string(s) + "'s " + what + " is held by ranks " +
                         text(ranks) + " but not by rank " + std::to_string(r) +
                         ", which reduces the stage; expected every rank of the group");
    }
  }
  return std::nullopt;
}

// (a) for the hub's word: the k-th AwaitWeights of a stage on rank r waiting for rank h
// is told by h's k-th ShareWeights of that stage, and every other rank of the stage's
// group waits for each one.
std::optional<ScheduleReport> check_weight_word(const std::vector<Schedule>& all) {
  const Holders h = holders(all);
  auto indices = [&](int s, Op op, int r) {
    const auto it = h.find({s, op});
    if (it == h.end() || !it->second.count(r)) return std::vector<size_t>{};
    return it->second.at(r);
  };
  for (const auto& [key, by_rank] : h) {
    const int s = key.first;
    if (key.second == Op::await_weights) {
      for (const auto& [r, at] : by_rank) {
        std::map<int, size_t> waits;  // hub -> this rank's AwaitWeights of it so far
        for (size_t i : at) {
          const int hub = all[r][i].peer;
          if (waits[hub]++ >= indices(s, Op::share_weights, hub).size())
            return problem(where(all, r, i) + " has no matching ShareWeights of stage " + std::to_string(s) +
                           " on rank " + std::to_string(hub));
        }
      }
    } else if (key.second == Op::share_weights) {
      const auto group = h.find({s, Op::reduce_grads});
      if (group == h.end()) continue;  // check_stage_groups names it
      for (const auto& [hub, at] : by_rank)
        for (const auto& [r, unused] : group->second) {
          if (r == hub) continue;
          size_t n = 0;
          for (size_t i : indices(s, Op::await_weights, r)) n += all[r][i].peer == hub ? 1 : 0;
          if (n != at.size())
            return problem(where(all, hub, at.front()) + ": rank " + std::to_string(r) + " of stage " +
                           std::to_string(s) + "'s group waits for it " + std::to_string(n) + " times; expected " +
                           std::to_string(at.size()));
        }
    }
  }
  return std::nullopt;
}

// (c) and (d), per rank: micro-batch coverage and the order of compute and step ops.
std::optional<ScheduleReport> check_rank(const std::vector<Schedule>& all, int r) {
  std::map<std::pair<int, int>, size_t> forwarded, backwarded;  // (stage, mb) -> index
  const Schedule& sched = all[r];
  std::optional<size_t> last_backward, step;
  std::map<int, size_t> reduce_start;   // stage -> its ReduceStart
  std::set<int> reduced;                // stages with a ReduceGrads so far
  for (size_t i = 0; i < sched.size(); ++i) {
    const Instruction& in = sched[i];
    const std::pair<int, int> key{in.stage, in.micro_batch};
    const bool compute = in.op == Op::forward || in.op == Op::backward || in.op == Op::recompute;
    if (compute && in.micro_batch < 0)
      return problem(where(all, r, i) + ": a compute instruction needs a micro-batch");
    if (in.op == Op::forward) {
      if (auto f = forwarded.find(key); f != forwarded.end())
        return problem(where(all, r, i) + ": micro-batch forwarded a second time on this stage " +
                       "(first at instruction " + std::to_string(f->second) + ")");
      forwarded[key] = i;
    } else if (in.op == Op::backward || in.op == Op::recompute) {
      if (!forwarded.count(key))
        return problem(where(all, r, i) + ": comes before the micro-batch's Forward");
      if (auto b = backwarded.find(key); b != backwarded.end())
        return problem(where(all, r, i) + ": micro-batch already backwarded at instruction " +
                       std::to_string(b->second));
      if (in.op == Op::backward) {
        backwarded[key] = i;
        last_backward = i;
      }
    } else if (in.op == Op::optimizer_step && !step) {
      step = i;
    } else if (is_reduction(in.op) && step) {
      return problem(where(all, r, i) + ": comes after the OptimizerStep at instruction " +
                     std::to_string(*step) + ", so the step used unreduced gradients");
    } else if (in.op == Op::reduce_start) {
      if (auto it = reduce_start.find(in.stage); it != reduce_start.end())
        return problem(where(all, r, i) + ": the stage's reduction was already started at instruction " +
                       std::to_string(it->second));
      reduce_start[in.stage] = i;
    } else if (in.op == Op::align_replica) {
      if (!step)
        return problem(where(all, r, i) + ": comes before the OptimizerStep; the replica agrees on the step it applied");
      if (in.replica < 0) return problem(where(all, r, i) + ": names no replica");
    } else if (in.op == Op::gather_weights || in.op == Op::share_weights || in.op == Op::await_weights) {
      if (!step)
        return problem(where(all, r, i) + ": comes before the OptimizerStep, so the weights are not yet updated");
      if (!reduced.count(in.stage))
        return problem(where(all, r, i) + ": the rank holds no ReduceGrads of stage " + std::to_string(in.stage));
    }
    if (is_reduction(in.op)) reduced.insert(in.stage);
  }
  for (const auto& [key, i] : forwarded)
    if (!backwarded.count(key))
      return problem(where(all, r, i) + ": micro-batch is never backwarded");
  if (last_backward)
    for (size_t i = 0; i < *last_backward; ++i)
      if (is_reduction(sched[i].op) || sched[i].op == Op::optimizer_step)
        return problem(where(all, r, i) + ": comes before the last Backward at instruction " +
                       std::to_string(*last_backward) + ", so gradients are incomplete");
  // A ReduceStart hands the reduction the gradients that the Backward after it completes:
  // only the rank's last Backward completes them, and only a ReduceGrads then finishes it.
  for (const auto& [stage, i] : reduce_start) {
    const int mb = sched[i].micro_batch;
    if (!last_backward || *last_backward < i || sched[*last_backward].micro_batch != mb)
      return problem(where(all, r, i) + ": the rank's last Backward " +
                     (last_backward ? "is " + where(all, r, *last_backward) : std::string("is missing")) +
                     "; expected the Backward of micro-batch " + std::to_string(mb) + " after it, and no other");
    for (size_t k = i + 1; k < *last_backward; ++k)
      if (sched[k].op == Op::backward)
        return problem(where(all, r, i) + ": " + where(all, r, k) +
                       " comes between it and the last Backward; gradients are final only in the last");
    bool finished = false;
    for (size_t k = i + 1; k < sched.size(); ++k)
      finished = finished || (sched[k].op == Op::reduce_grads && sched[k].stage == stage);
    if (!finished) return problem(where(all, r, i) + ": no ReduceGrads of its stage follows to finish it");
  }
  return std::nullopt;
}

// (b) Deadlock: the lock-step sweep under the strictest MPI semantics (rendezvous sends);
// pairing was checked first, so the receive at a sender's peer's front is the right one.
std::optional<ScheduleReport> check_deadlock(const std::vector<Schedule>& all) {
  const std::vector<size_t> pos = sweep(all, [](const SweepEvent&) {});
  std::string stuck;
  for (size_t r = 0; r < all.size(); ++r)
    if (pos[r] < all[r].size()) stuck += (stuck.empty() ? "" : "; ") + where(all, static_cast<int>(r), pos[r]);
  if (!stuck.empty()) return problem("deadlock under rendezvous sends: " + stuck);
  return std::nullopt;
}

}  // namespace

std::vector<size_t> sweep(const std::vector<Schedule>& all,
                          const std::function<void(const SweepEvent&)>& fire) {
  const int n = static_cast<int>(all.size());
  std::map<std::pair<Op, int>, std::vector<int>> group;   // (op, its group) -> holders, rank order
  std::map<std::pair<int, int>, std::vector<size_t>> told;  // (hub, stage) -> its ShareWeights
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < all[r].size(); ++i) {
      const Instruction& in = all[r][i];
      if (is_send(in.op) || is_recv(in.op) || in.op == Op::await_weights)
        HT_CHECK(in.peer >= 0 && in.peer < n && in.peer != r, "sweep: rank ", r, " instruction ", i, " (",
                 to_text(in), "): peer is not another rank in [0, ", n, ")");
      if (is_collective(in.op)) {
        std::vector<int>& g = group[{in.op, collective_group(in)}];
        if (g.empty() || g.back() != r) g.push_back(r);
      }
      if (in.op == Op::share_weights) told[{r, in.stage}].push_back(i);
    }
  // Each AwaitWeights' ShareWeights: the k-th of its (peer, stage) for the k-th wait.
  std::map<std::pair<int, size_t>, size_t> word;  // (rank, index) -> the peer's index
  for (int r = 0; r < n; ++r) {
    std::map<std::pair<int, int>, size_t> seen;
    for (size_t i = 0; i < all[r].size(); ++i) {
      const Instruction& in = all[r][i];
      if (in.op != Op::await_weights) continue;
      const size_t k = seen[{in.peer, in.stage}]++;
      const auto it = told.find({in.peer, in.stage});
      if (it != told.end() && k < it->second.size()) word[{r, i}] = it->second[k];
    }
  }

  std::vector<size_t> pos(n, 0);
  auto at = [&](int r) -> const Instruction* { return pos[r] < all[r].size() ? &all[r][pos[r]] : nullptr; };
  // Per collective, how many of its holders (in rank order) were found waiting at it: a
  // rank at a collective stays there until it fires, so none is looked at twice (looking
  // at every holder for every arrival was quadratic, seconds at 4,096 replicas).
  std::map<std::pair<Op, int>, size_t> waiting;
  SweepEvent e;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      while (const Instruction* in = at(r)) {
        if (is_recv(in->op)) break;  // fired from the sender's side
        e.at.clear();
        if (is_send(in->op)) {
          const Instruction* other = at(in->peer);
          if (!other || other->op != recv_of(in->op) || other->peer != r) break;
          e.kind = SweepEvent::Kind::pair;
          e.at = {{r, pos[r]}, {in->peer, pos[in->peer]}};
        } else if (is_collective(in->op)) {
          const std::pair<Op, int> key{in->op, collective_group(*in)};
          const std::vector<int>& g = group.at(key);
          size_t& there = waiting[key];
          for (const Instruction* o = nullptr; there < g.size(); ++there) {
            o = at(g[there]);
            if (!o || o->op != in->op || collective_group(*o) != key.second) break;
          }
          if (there < g.size()) break;
          there = 0;  // fired: the next of this kind starts again
          e.kind = SweepEvent::Kind::collective;
          for (int m : g) e.at.emplace_back(m, pos[m]);
        } else if (in->op == Op::await_weights) {
          const auto it = word.find({r, pos[r]});
          if (it == word.end() || pos[in->peer] <= it->second) break;
          e.kind = SweepEvent::Kind::await;
          e.at = {{r, pos[r]}, {in->peer, it->second}};
        } else {
          e.kind = SweepEvent::Kind::local;
          e.at = {{r, pos[r]}};
        }
        fire(e);
        if (e.kind == SweepEvent::Kind::await) e.at.pop_back();  // the peer's is behind it
        for (const auto& [m, i] : e.at) ++pos[m];
        progress = true;
      }
    }
  }
  return pos;
}

ScheduleReport check_schedules(const std::vector<Schedule>& schedules) {
  if (auto p = check_pairing(schedules)) return *p;
  if (auto p = check_weight_word(schedules)) return *p;
  if (auto p = check_stage_groups(schedules)) return *p;
  for (int r = 0; r < static_cast<int>(schedules.size()); ++r)
    if (auto p = check_rank(schedules, r)) return *p;
  if (auto p = check_deadlock(schedules)) return *p;
  return {};
}

}  // namespace ht::plan
