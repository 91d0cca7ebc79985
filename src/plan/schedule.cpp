#include "plan/schedule.h"

#include <algorithm>
#include <cmath>
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
      "SendGrad",       "RecvGrad", "ReduceGrads", "OptimizerStep",  "Recompute"};
  static_assert(std::size(names) == static_cast<size_t>(Op::recompute) + 1);
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
  c.reduces = replicas > 1 ? 1 : 0;
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
      if (!is_send(in.op) && !is_recv(in.op)) continue;
      if (in.peer < 0 || in.peer >= n || in.peer == r)
        return problem(where(all, r, i) + ": peer " + std::to_string(in.peer) +
                       " is not another rank in [0, " + std::to_string(n) + ")");
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

// (c) and (d), per rank: micro-batch coverage and the order of compute and step ops.
std::optional<ScheduleReport> check_rank(const std::vector<Schedule>& all, int r) {
  std::map<std::pair<int, int>, size_t> forwarded, backwarded;  // (stage, mb) -> index
  const Schedule& sched = all[r];
  std::optional<size_t> last_backward, step;
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
    } else if (in.op == Op::reduce_grads && step) {
      return problem(where(all, r, i) + ": comes after the OptimizerStep at instruction " +
                     std::to_string(*step) + ", so the step used unreduced gradients");
    }
  }
  for (const auto& [key, i] : forwarded)
    if (!backwarded.count(key))
      return problem(where(all, r, i) + ": micro-batch is never backwarded");
  if (last_backward)
    for (size_t i = 0; i < *last_backward; ++i)
      if (sched[i].op == Op::reduce_grads || sched[i].op == Op::optimizer_step)
        return problem(where(all, r, i) + ": comes before the last Backward at instruction " +
                       std::to_string(*last_backward) + ", so gradients are incomplete");
  return std::nullopt;
}

// (b) Deadlock: run every rank with the strictest MPI semantics. A send completes only
// together with its receive (rendezvous), so it advances only when the peer is at the
// matching receive; pairing was checked first, so the receive at the peer's front is the
// right one. ReduceGrads of stage s completes when every rank holding one for s is there.
std::optional<ScheduleReport> check_deadlock(const std::vector<Schedule>& all) {
  const int n = static_cast<int>(all.size());
  std::vector<size_t> pos(n, 0);
  std::map<int, std::set<int>> reduce_group;  // stage -> ranks that reduce it
  for (int r = 0; r < n; ++r)
    for (const Instruction& in : all[r])
      if (in.op == Op::reduce_grads) reduce_group[in.stage].insert(r);
  auto at = [&](int r) -> const Instruction* {
    return pos[r] < all[r].size() ? &all[r][pos[r]] : nullptr;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      while (const Instruction* in = at(r)) {
        if (is_recv(in->op)) break;  // completed from the sender's side
        if (is_send(in->op)) {
          const Instruction* other = at(in->peer);
          if (!other || other->op != recv_of(in->op) || other->peer != r) break;
          ++pos[in->peer];
        } else if (in->op == Op::reduce_grads) {
          const std::set<int>& group = reduce_group[in->stage];
          bool all_there = true;
          for (int g : group) {
            const Instruction* o = at(g);
            all_there = all_there && o && o->op == Op::reduce_grads && o->stage == in->stage;
          }
          if (!all_there) break;
          for (int g : group)
            if (g != r) ++pos[g];
        }
        ++pos[r];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < n; ++r)
    if (at(r)) stuck += (stuck.empty() ? "" : "; ") + where(all, r, pos[r]);
  if (!stuck.empty()) return problem("deadlock under rendezvous sends: " + stuck);
  return std::nullopt;
}

}  // namespace

ScheduleReport check_schedules(const std::vector<Schedule>& schedules) {
  if (auto p = check_pairing(schedules)) return *p;
  for (int r = 0; r < static_cast<int>(schedules.size()); ++r)
    if (auto p = check_rank(schedules, r)) return *p;
  if (auto p = check_deadlock(schedules)) return *p;
  return {};
}

}  // namespace ht::plan
