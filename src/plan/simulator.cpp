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
      : all_(all), costs_(costs), n_(static_cast<int>(all.size())), pos_(n_, 0),
        clock_(n_, 0.0), held_(n_), recomputed_(n_), current_(n_, 0) {
    res_.busy_seconds.assign(n_, 0.0);
    res_.comm_seconds.assign(n_, 0.0);
    res_.idle_seconds.assign(n_, 0.0);
    res_.utilisation.assign(n_, 0.0);
    res_.peak_activation_bytes.assign(n_, 0);
    for (int r = 0; r < n_; ++r)
      for (size_t i = 0; i < all_[r].size(); ++i) {
        const Instruction& in = all_[r][i];
        // A bad peer would index outside the world below, so it is a hard error up front.
        if (is_send(in.op) || is_recv(in.op))
          HT_CHECK(in.peer >= 0 && in.peer < n_ && in.peer != r, "simulate: ", where(r, i),
                   ": peer is not another rank in [0, ", n_, ")");
        if (in.op == Op::reduce_grads) group_[in.stage].insert(r);
        if (in.op == Op::recompute) recomputed_[r].insert({in.stage, in.micro_batch});
      }
  }

  SimResult run() {
    // The sweep of check_schedules' deadlock check, with clocks: each rank runs until it
    // blocks on a peer; a pair or a collective fires once all its participants are there.
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < n_; ++r)
        while (const Instruction* in = at(r)) {
          if (is_recv(in->op)) break;  // fired from the sender's side
          if (is_send(in->op) ? !transfer(r, *in)
                              : in->op == Op::reduce_grads ? !reduce(*in) : !compute(r, *in))
            break;
          progress = true;
        }
    }
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

  void span(int r, const Instruction& in, const char* category, double start, double end) {
    res_.timeline.push_back({r, op_name(in.op), category, start, end, in.micro_batch, in.stage});
  }
  // Rank r blocks at `in` until `until`: idle time, shown under the op it waits at.
  void wait(int r, const Instruction& in, double until) {
    if (until > clock_[r]) span(r, in, "idle", clock_[r], until);
    clock_[r] = std::max(clock_[r], until);
  }
  // Communication ends for one participant: busy in comm from start to end, next op.
  void communicate(int r, double start, double end) {
    const Instruction& in = *at(r);
    wait(r, in, start);
    span(r, in, "comm", start, end);
    res_.comm_seconds[r] += end - start;
    clock_[r] = end;
    ++pos_[r];
  }

  bool transfer(int r, const Instruction& in) {
    const int p = in.peer;
    const Instruction* other = at(p);
    if (!other || other->op != recv_of(in.op) || other->peer != r) return false;
    // The pair that meets is the one the executor would match, so a disagreement here means
    // one micro-batch's data would feed another's compute.
    HT_CHECK(other->micro_batch == in.micro_batch && other->bytes == in.bytes,
             "simulate: ", where(r, pos_[r]), " meets ", where(p, pos_[p]),
             ": micro-batch or bytes differ");
    const double start = std::max(clock_[r], clock_[p]);  // rendezvous: both are there
    const double end = start + cost(costs_.message_seconds, "message_seconds", r, p, in.bytes);
    communicate(p, start, end);
    communicate(r, start, end);
    return true;
  }

  bool reduce(const Instruction& in) {
    const std::set<int>& group = group_.at(in.stage);
    double start = 0, length = 0;
    for (int g : group) {
      const Instruction* o = at(g);
      if (!o || o->op != Op::reduce_grads || o->stage != in.stage) return false;
    }
    for (int g : group) {
      start = std::max(start, clock_[g]);  // the collective waits for its last member
      length = std::max(length, cost(costs_.reduce_seconds, "reduce_seconds", g, in.stage));
    }
    for (int g : group) communicate(g, start, start + length);
    return true;
  }

  bool compute(int r, const Instruction& in) {
    const double start = clock_[r];
    const double end = start + cost(costs_.compute_seconds, "compute_seconds", r, in);
    span(r, in, "compute", start, end);
    res_.busy_seconds[r] += end - start;
    clock_[r] = end;
    track_memory(r, in);
    ++pos_[r];
    return true;
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
      res_.peak_activation_bytes[r] = std::max(res_.peak_activation_bytes[r], current_[r]);
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
      if (in->op == Op::reduce_grads) {
        text << " the ReduceGrads of stage " << in->stage << " on";
        for (int g : group_.at(in->stage))
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
    int working = 0;
    double busy = 0;
    for (int r = 0; r < n_; ++r)
      if (!all_[r].empty()) res_.step_seconds = std::max(res_.step_seconds, clock_[r]);
    for (int r = 0; r < n_; ++r) {
      if (all_[r].empty()) continue;
      ++working;
      busy += res_.busy_seconds[r];
      // Clamped: busy + comm is a sum of the same intervals as clock, up to rounding.
      res_.idle_seconds[r] =
          std::max(0.0, res_.step_seconds - res_.busy_seconds[r] - res_.comm_seconds[r]);
      if (res_.step_seconds > 0) res_.utilisation[r] = res_.busy_seconds[r] / res_.step_seconds;
    }
    if (working > 0 && res_.step_seconds > 0)
      res_.bubble_fraction = 1.0 - busy / (working * res_.step_seconds);
    return std::move(res_);
  }

  const std::vector<Schedule>& all_;
  const CostModel& costs_;
  const int n_;
  std::vector<size_t> pos_;    // next instruction of each rank
  std::vector<double> clock_;  // when each rank reaches pos_ (finished what came before)
  std::map<int, std::set<int>> group_;  // stage -> ranks holding a ReduceGrads for it
  std::vector<std::map<std::pair<int, int>, int64_t>> held_;  // (stage, mb) -> stashed bytes
  std::vector<std::set<std::pair<int, int>>> recomputed_;     // (stage, mb) recomputed here
  std::vector<int64_t> current_;  // activation bytes held now, per rank
  SimResult res_;
};

}  // namespace

SimResult simulate(const std::vector<Schedule>& schedules, const CostModel& costs) {
  return Simulator(schedules, costs).run();
}

}  // namespace ht::plan
