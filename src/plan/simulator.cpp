#include "plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace ht::plan {

namespace {

// An empty cost function means "free"; a negative or non-finite cost would move a clock
// backwards and silently corrupt every later event, so it is refused where it appears.
template <class R, class... Args>
R cost(const std::function<R(Args...)>& f, const char* what, std::type_identity_t<Args>... args) {
  if (!f) return R{};
  const R v = f(args...);
  HT_CHECK(v >= 0 && std::isfinite(static_cast<double>(v)), "simulate: cost model ", what,
           " returned ", v, "; expected a finite value >= 0");
  return v;
}

class Simulator {
 public:
  Simulator(const std::vector<Schedule>& all, const CostModel& costs)
      : all_(all), costs_(costs), n_(static_cast<int>(all.size())), clock_(n_, 0.0), held_(n_),
        recomputed_(n_), current_(n_, 0) {
    res_ = SimResult::zeroed(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r)
      for (size_t i = 0; i < all_[r].size(); ++i) {
        const Instruction& in = all_[r][i];
        // A bad peer would index outside the world below, so it is a hard error up front.
        if (is_send(in.op) || is_recv(in.op) || in.op == Op::await_weights)
          HT_CHECK(in.peer >= 0 && in.peer < n_ && in.peer != r, "simulate: ", where(r, i),
                   ": peer is not another rank in [0, ", n_, ")");
        if (is_collective(in.op)) group_[{in.op, collective_group(in)}].insert(r);
        if (in.op == Op::recompute) recomputed_[r].insert({in.stage, in.micro_batch});
      }
  }

  SimResult run() {
    // check_schedules' sweep, with clocks: each event starts when its last participant
    // arrives, so the visiting order does not matter.
    pos_ = sweep(all_, [this](const SweepEvent& e) { fire(e); });
    report_stuck();
    return summarise();
  }

 private:
  const Instruction* at(int r) const {
    return pos_[r] < all_[r].size() ? &all_[r][pos_[r]] : nullptr;
  }
  std::string where(int r, size_t i) const {
    return "rank " + std::to_string(r) + " instruction " + std::to_string(i) + " (" +
           to_text(all_[r][i]) + ")";
  }

  void fire(const SweepEvent& e) {
    const auto [r, i] = e.at.front();
    const Instruction& in = all_[r][i];
    switch (e.kind) {
      case SweepEvent::Kind::pair: transfer(r, i, e.at[1].first, e.at[1].second); break;
      case SweepEvent::Kind::collective: collective(e); break;
      case SweepEvent::Kind::await: await(r, in, e.at[1].first, e.at[1].second); break;
      case SweepEvent::Kind::local:
        // Posting the block-by-block reduction or the hub's word takes no time: what they
        // cost shows in the ReduceGrads and AwaitWeights that wait for them.
        // A CatchUp costs nothing in the steady state, which is what a plan predicts: it
        // moves a state only to a rank that was left out.
        if (in.op == Op::reduce_start || in.op == Op::share_weights || in.op == Op::catch_up) {
          communicate(r, in, clock_[r], clock_[r]);
          if (in.op == Op::share_weights) told_at_[{r, i}] = clock_[r];
        } else {
          compute(r, in);
        }
        break;
    }
  }

  void span(int r, const Instruction& in, const char* category, double start, double end) {
    res_.timeline.push_back({r, op_name(in.op), category, start, end, in.micro_batch, in.stage});
  }
  // Rank r blocks at `in` until `until`: idle time, shown under the op it waits at.
  void wait(int r, const Instruction& in, double until) {
    if (until > clock_[r]) span(r, in, "idle", clock_[r], until);
    clock_[r] = std::max(clock_[r], until);
  }
  // Communication ends for one participant: busy in comm from start to end.
  void communicate(int r, const Instruction& in, double start, double end) {
    wait(r, in, start);
    span(r, in, "comm", start, end);
    res_.comm_seconds[r] += end - start;
    clock_[r] = end;
  }

  void transfer(int r, size_t i, int p, size_t j) {
    const Instruction& in = all_[r][i];
    const Instruction& other = all_[p][j];
    // The pair that meets is the one the executor would match, so a disagreement here means
    // one micro-batch's data would feed another's compute.
    HT_CHECK(other.micro_batch == in.micro_batch && other.bytes == in.bytes,
             "simulate: ", where(r, i), " meets ", where(p, j), ": micro-batch or bytes differ");
    const double start = std::max(clock_[r], clock_[p]);  // rendezvous: both are there
    const double end = start + cost(costs_.message_seconds, "message_seconds", r, p, in.bytes);
    communicate(p, other, start, end);
    communicate(r, in, start, end);
  }

  void collective(const SweepEvent& e) {
    const Instruction& in = all_[e.at.front().first][e.at.front().second];
    double start = 0, length = 0;
    for (const auto& [g, i] : e.at) {
      start = std::max(start, clock_[g]);  // the collective waits for its last member
      if (in.op == Op::align_replica) {
        // Every member's word to every other, at once (Communicator::allgather sends point
        // to point): the slowest of those messages.
        for (const auto& [h, j] : e.at)
          if (h != g) length = std::max(length, cost(costs_.message_seconds, "message_seconds", g, h, kAlignBytes));
        continue;
      }
      length = std::max(length, in.op == Op::gather_weights
                                    ? cost(costs_.gather_seconds, "gather_seconds", g, in.stage)
                                    : cost(costs_.reduce_seconds, "reduce_seconds", g, in.stage));
    }
    for (const auto& [g, i] : e.at) communicate(g, all_[g][i], start, start + length);
  }

  // The hub's word leaves when it posted it and takes one message's time.
  void await(int r, const Instruction& in, int hub, size_t told) {
    const double sent = told_at_.at({hub, told});
    const double arrives = sent + cost(costs_.message_seconds, "message_seconds", hub, r, int64_t{1});
    const double start = std::max(clock_[r], sent);
    communicate(r, in, start, std::max(start, arrives));
  }

  void compute(int r, const Instruction& in) {
    const double start = clock_[r];
    const double end = start + cost(costs_.compute_seconds, "compute_seconds", r, in);
    span(r, in, "compute", start, end);
    res_.busy_seconds[r] += end - start;
    clock_[r] = end;
    track_memory(r, in);
  }

  void track_memory(int r, const Instruction& in) {
    const std::pair<int, int> key{in.stage, in.micro_batch};
    int64_t added = 0;
    if (in.op == Op::forward)
      added = recomputed_[r].count(key)
                  ? cost(costs_.checkpoint_bytes, "checkpoint_bytes", r, in.stage)
                  : cost(costs_.activation_bytes, "activation_bytes", r, in.stage);
    else if (in.op == Op::recompute)
      added = cost(costs_.activation_bytes, "activation_bytes", r, in.stage);
    if (added > 0) {
      held_[r][key] += added;
      current_[r] += added;
    }
    if (in.op == Op::forward || in.op == Op::recompute || in.op == Op::backward) {
      const int64_t transient = cost(costs_.workspace_bytes, "workspace_bytes", r, in.stage);
      res_.peak_activation_bytes[r] = std::max(res_.peak_activation_bytes[r], current_[r] + transient);
    }
    if (in.op == Op::backward) {
      if (auto it = held_[r].find(key); it != held_[r].end()) {
        current_[r] -= it->second;
        held_[r].erase(it);
      }
    }
  }

  // No rank can move: name every stuck rank and what it waits for. If a peer has already
  // finished, the communication is unmatched (a missing instruction), otherwise the ranks
  // wait on each other in a cycle (instructions in the wrong order).
  void report_stuck() const {
    // An ostringstream rather than string `+`: GCC 12 flags `const char* + std::string`
    // with a false -Wrestrict positive.
    std::ostringstream text;
    bool stuck = false, unmatched = false;
    for (int r = 0; r < n_; ++r) {
      const Instruction* in = at(r);
      if (!in) continue;
      text << (stuck ? "; " : "") << where(r, pos_[r]) << " waits for";
      stuck = true;
      std::vector<int> peers;
      if (is_collective(in->op)) {
        if (in->op == Op::align_replica) text << " the " << op_name(in->op) << " of replica " << in->replica << " on";
        else text << " the " << op_name(in->op) << " of stage " << in->stage << " on";
        for (int g : group_.at({in->op, collective_group(*in)}))
          if (g != r) peers.push_back(g);
      } else {
        peers.push_back(in->peer);
      }
      for (int p : peers) {
        if (at(p)) {
          text << " " << where(p, pos_[p]);
        } else {
          text << " rank " << p << ", which has finished its schedule";
          unmatched = true;
        }
      }
    }
    if (stuck)
      fail("simulate: ", unmatched ? "unmatched communication: " : "deadlock: ", text.str());
  }

  SimResult summarise() {
    std::vector<char> working(static_cast<size_t>(n_), 0);
    for (int r = 0; r < n_; ++r)
      if (!all_[r].empty()) {
        working[static_cast<size_t>(r)] = 1;
        res_.step_seconds = std::max(res_.step_seconds, clock_[r]);
      }
    summarise_ranks(res_, working);
    return std::move(res_);
  }

  const std::vector<Schedule>& all_;
  const CostModel& costs_;
  const int n_;
  std::vector<size_t> pos_;    // where each rank stopped (after the sweep)
  std::vector<double> clock_;  // when each rank finished what it ran so far
  std::map<std::pair<Op, int>, std::set<int>> group_;  // (collective, its group) -> its holders
  std::map<std::pair<int, size_t>, double> told_at_;   // (hub, ShareWeights index) -> posted
  std::vector<std::map<std::pair<int, int>, int64_t>> held_;  // (stage, mb) -> stashed bytes
  std::vector<std::set<std::pair<int, int>>> recomputed_;     // (stage, mb) recomputed here
  std::vector<int64_t> current_;  // activation bytes held now, per rank
  SimResult res_;
};

}  // namespace

SimResult SimResult::zeroed(size_t ranks) {
  SimResult r;
  r.busy_seconds.assign(ranks, 0.0);
  r.comm_seconds.assign(ranks, 0.0);
  r.idle_seconds.assign(ranks, 0.0);
  r.utilisation.assign(ranks, 0.0);
  r.peak_activation_bytes.assign(ranks, 0);
  return r;
}

void summarise_ranks(SimResult& result, const std::vector<char>& working) {
  int count = 0;
  double busy = 0;
  for (size_t r = 0; r < working.size(); ++r) {
    if (!working[r]) continue;
    ++count;
    busy += result.busy_seconds[r];
    result.idle_seconds[r] = std::max(0.0, result.step_seconds - result.busy_seconds[r] - result.comm_seconds[r]);
    if (result.step_seconds > 0) result.utilisation[r] = result.busy_seconds[r] / result.step_seconds;
  }
  if (count > 0 && result.step_seconds > 0) result.bubble_fraction = 1.0 - busy / (count * result.step_seconds);
}

SimResult simulate(const std::vector<Schedule>& schedules, const CostModel& costs) {
  return Simulator(schedules, costs).run();
}

}  // namespace ht::plan
