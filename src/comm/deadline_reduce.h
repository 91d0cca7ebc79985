// parallel.sync: deadline. A step-tagged gradient reduction that closes when its budget
// expires instead of waiting for every member, built from point-to-point messages (a
// blocking collective cannot leave out a stalled rank).
//
// Per step, every member sends (step, samples, loss, gradient) to the step's leader. The
// leader sums its own gradient and what arrived before the budget ran out (or until every
// present member arrived) in rank order, and sends the sum, the contributors and their
// samples to the members. The caller rescales by global batch / arrived samples, so the
// step's gradient is the sample-weighted mean over the samples that arrived.
//
// Leaders and backups. The leader of term e is member e mod n. A member that has not had
// the result of its step within its patience (a few budgets) moves to the next term and
// sends its contribution to that term's leader, so a stalled leader (rank 0 included) is
// replaced by the next member in order; any message carrying a higher term moves its
// receiver to that term, and a lower-term message is answered with the current term, so a
// leader that returns from a stall learns that it was replaced.
//
// Why the replicas stay bit-identical. Every rank keeps a chain hash of the results it
// applied: h(s) = mix(h(s-1), s, term, leader, contributors). A result for step s carries
// the leader's h(s-1), and a rank applies it only when that equals its own and s is its
// step; a contribution is used only when it was computed on a state in the leader's chain.
// Two ranks with equal chains applied the same sums in the same order to the same
// starting weights with the same code, so they hold the same bytes (the assumption that
// check_replicas_identical already makes of `sync`). A rank whose chain differs from the
// leader's (it was stalled, or a leader stalled halfway through sending a result) is sent
// the leader's whole replica state, its chain hash and its step (a catch-up), so it is
// identical again before it contributes again.
//
// A late contribution (for a step already closed) is dropped, or with max_staleness > 0
// added to the leader's open step when it is at most that many steps old and was computed
// on the leader's chain. Messages for a closed step are consumed and discarded; every
// message carries its step and term, so none is mistaken for a later step's.
//
// Waits poll with a short sleep between tests (ranks share cores here), which a peer's
// message on this host ends at once (the doorbell). Every wait is bounded by
// peer_timeout_s, past which the job fails naming what it waited for. A member's waits on
// its leader count the time it was there to hear: a stop of its own (kAway or longer)
// moves its patience on and its timeout too, by at most the timeout once over.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ht::comm {

struct DeadlineOptions {
  double predicted_step_s = 0.1;  // the plan's; the first budget before any step is measured
  double slack = 0.5;             // budget = step x (1 + slack)
  int64_t max_staleness = 0;      // 0: late contributions are dropped
  double peer_timeout_s = 300;    // the bound on any wait
  // The least a member waits for its leader's answer before it suspects the leader and
  // turns to the next (otherwise twice the budget plus 20 ms). The jobs leave it 0; a
  // test of what one leader does sets it long, so that a loaded host's delays of tens
  // of milliseconds cannot hand the lead on mid-test.
  double min_patience_s = 0;
  // A test's seam: runs right after this rank's contribution to a step leaves, on the
  // rank's own thread, so that a test can stop the rank there (null: nothing).
  std::function<void()> after_contribution;
  // A test's seam: runs before each poll of a step this rank leads (null: nothing).
  std::function<void()> while_leading;
  // Re-splitting the global batch while the steps go on (parallel.rebalance_every): no
  // exchange may wait for every member, so a member's measures travel with its
  // contributions and the leader's decision with a step's record. On the leader: every
  // contribution that reaches it with measures (set_report; its own too) is passed to
  // on_report(member, step, measures); after each step s it closes (its result sent),
  // reshare(s, shares in force) returns new shares or nothing; new ones ride with the
  // record of s + 1, when this rank closes that step too, and run from s + 2.
  std::function<void(int member, int64_t step, std::span<const double> measures)> on_report;
  std::function<std::vector<int64_t>(int64_t step, const std::vector<int64_t>& shares)> reshare;
};

// Weights, optimiser state and anything else a replica must hold identically, flattened.
struct ReplicaState {
  std::vector<float> floats;
  std::vector<int64_t> ints;
};

struct Contribution {
  int rank = -1;       // in the reduction's communicator
  int64_t samples = 0;
  int64_t staleness = 0;  // steps late (0: this step's)
  // The sender's own judgement of it, opaque here (the bad-node guard's runtime::Verdict;
  // 0: kept). One left out travels with no samples and this says why, so that every rank
  // that applies the step reads every member's verdict from its record alike.
  int64_t verdict = 0;
};

// What one closed step was, as every rank that applied it (or caught up past it) sees it.
struct StepRecord {
  int64_t step = -1;
  int64_t term = 0;
  int leader = -1;
  std::vector<Contribution> contributors;  // in rank order
  int64_t samples = 0;          // summed over contributors, stale ones included
  int64_t fresh_samples = 0;    // of this step's contributions
  double loss_sum = 0;          // over the fresh contributions' samples
  // Expected (the members' shares) but not in time; a contribution that arrived with a
  // verdict leaving its samples out (the guard's) is neither dropped nor missing.
  int64_t samples_dropped = 0;
  bool closed_short = false;    // some member's share was missing
  int64_t staleness_applied = 0;  // stale contributions in the sum
  // Non-empty: the members' shares of the global batch from the next step on (the
  // leader's re-split, DeadlineOptions::reshare), which every rank applying it takes.
  std::vector<int64_t> shares;
};

struct DeadlineOutcome {
  StepRecord record;                 // the step applied
  // Steps closed by others while this rank was out of step (it caught up past them), in
  // order; empty normally.
  std::vector<StepRecord> missed;
  bool caught_up = false;            // this rank's state was replaced before the step
  // The leader had finished training when it caught this rank up: there is no step to
  // apply (record.step is -1) and step() is the end.
  bool ended = false;
  double budget_s = 0;               // the leader's budget for the step
};

class DeadlineReduce {
 public:
  using SaveState = std::function<ReplicaState()>;
  using LoadState = std::function<void(const ReplicaState&)>;

  // Every member of `comm` constructs one with the same `first_step` (the step its next
  // reduce is for) and the same share of the global batch per member (`shares`, to count
  // dropped samples). `save`/`load` give and replace this rank's replica state.
  DeadlineReduce(Communicator& comm, DeadlineOptions options, std::vector<int64_t> shares,
                 int64_t first_step, SaveState save, LoadState load);
  ~DeadlineReduce();

  // Reduces this rank's contribution to its current step: `grads` (contiguous float32 on
  // any backend, copied through host memory; the same sizes on every member) are
  // replaced by the sum of the contributions the step's leader took. `samples` and `loss_sum` are this rank's for the step;
  // `step_start` is when its step began (the leader's budget runs from its own). When
  // the outcome says caught_up, the state was replaced first (the gradients computed on
  // the old one are a stale contribution) and the record is of the step after the
  // catch-up. Either way the caller then applies the sum: after reduce, every rank's
  // step is record.step + 1. `verdict` goes into this rank's Contribution.
  DeadlineOutcome reduce(std::vector<Tensor>& grads, int64_t samples, double loss_sum,
                         Clock::time_point step_start, int64_t verdict = 0);

  // Between steps, never blocking: takes a catch-up that a leader already sent (this rank
  // was left out), so that the step about to run computes on the leader's state; the next
  // reduce reports it. One that ends the training is left for reduce.
  void take_waiting_catch_up();
  // The same poll, never blocking, leaving a catch-up that arrived to the next reduce (a
  // hybrid plan's rank: see align_to); a request held for this step is answered.
  void serve_between_steps() { poll(); }

  // Between steps, on a hybrid plan (the executor's AlignReplica): moves this rank on to
  // `target`, a later step than its own, which another stage of its replica is at. It
  // asks the leader for its state at exactly that step; the leader holds the request
  // until its own state is at `target` (it serves held requests only between steps or in
  // a step before its result is applied, where its state is that step's start), or
  // answers at once with its state at its own step when already past it. So the outcome
  // is a catch-up (caught_up; record.step -1: no step to apply), to `target` or later;
  // `ended` when the leader had finished training; `missed` the records of the steps
  // passed. A silent leader is replaced as in reduce; bounded by peer_timeout_s.
  DeadlineOutcome align_to(int64_t target);

  // Why a member finishes: the end of training; its own stop (a signal, --stop-after),
  // whose state is where the chain ends; or a stop that reached it from another member
  // (a chain ended short of the end, or on a hybrid plan its replica's other stage).
  enum class FinishReason { end, stop, propagated };
  // The end of training, on every member, after its last reduce: the members agree on one
  // chain (a rank behind catches up, possibly past steps it did not run) and drain every
  // message in flight. Returns the records of steps this rank caught up past. A stop's
  // state wins: a leader that hears a stop in its steps takes the stopped member's state
  // at once, and one finishing for a stop that reached it takes the latest stop's, so
  // that every stage of a hybrid plan ends at the step its stopped replica agreed on.
  std::vector<StepRecord> finish(FinishReason why = FinishReason::end);

  int64_t step() const { return step_; }       // the next step to reduce
  // The members' shares of the global batch for step(): the constructor's, or the last
  // re-split this rank's chain applied (or a catch-up brought).
  const std::vector<int64_t>& shares() const { return shares_; }
  // This rank's measures (opaque here: DeadlineOptions::on_report), sent with its next
  // contributions until replaced.
  void set_report(std::vector<double> measures) { report_ = std::move(measures); }
  uint64_t chain_hash() const { return hash_; }
  int64_t term() const { return term_; }
  // Messages this rank has sent to member `peer` (results, notices, catch-ups, its own
  // contributions), for tests: what a stopped member is sent must stay bounded.
  int64_t messages_sent_to(int peer) const { return sent_to_[static_cast<size_t>(peer)]; }
  int leader() const { return leader_of(term_); }

  struct Message;  // the wire form, in deadline_reduce.cpp

 private:
  int leader_of(int64_t term) const { return static_cast<int>(term % static_cast<int64_t>(size_)); }
  double budget() const;
  double patience() const;
  void post_receive(int peer);
  bool poll();  // handles every arrived message; whether any arrived
  void handle(int from, const Message& m);
  void adopt_term(int64_t term);
  void suspect_leader();
  void send(int dst, std::shared_ptr<std::vector<char>> bytes);
  // A message of a header alone: `kind` with the sender's step, term and chain hash (and
  // `samples`, which a catch-up-at request uses for the step it asks for).
  static std::shared_ptr<std::vector<char>> word(int64_t kind, int64_t step, int64_t term, uint64_t hash,
                                                 int64_t samples = 0);
  void send_notice(int dst);
  void send_catch_up(int dst, int64_t since, bool final = false);
  // Asks `member`, which ended its training ahead of this rank, for its final state: once a
  // term (a lower-term request is not served). Whether it asked now.
  bool ask_final_state(int member);
  void take_catch_up();
  void serve_held();
  void send_contribution();
  bool lead_step(std::vector<float>& sum, Clock::time_point opened, StepRecord& record);
  void apply_record(const StepRecord& r);
  void remember(const StepRecord& r);
  // A PeerTimeout naming `missing` (this communicator's ranks): what was waited for.
  [[noreturn]] void fail_wait(const std::string& what, const std::vector<int>& missing) const;

  Communicator& comm_;
  DeadlineOptions options_;
  std::vector<int64_t> shares_;
  std::vector<double> report_;  // set_report's
  // A re-split decided after closing a step, for the record of pending_step_ when this
  // rank closes it in pending_term_ under pending_base_.
  std::vector<int64_t> pending_shares_, pending_base_;
  int64_t pending_term_ = -1, pending_step_ = -1;
  SaveState save_;
  LoadState load_;
  int rank_, size_, tag_;

  int64_t step_ = 0, term_ = 0;
  uint64_t hash_ = 0;
  std::map<int64_t, uint64_t> chain_;  // recent steps' base hashes (h(s-1) by s), for staleness

  // This rank's contribution to the open step, as sent (kept to resend to a new leader).
  std::shared_ptr<std::vector<char>> contribution_;
  // Arrived and not yet used: (step, from) -> message (leader side).
  struct Pending;
  std::map<std::pair<int64_t, int>, std::unique_ptr<Pending>> arrived_;
  // Results and catch-ups that arrived for this rank (member side).
  std::deque<std::unique_ptr<Pending>> results_;  // in arrival order
  std::unique_ptr<Pending> catch_up_;
  bool catch_up_asked_ = false;
  bool caught_up_early_ = false;  // by take_waiting_catch_up, for the next reduce to report

  // Leader: members' requests for its state at a later step (align_to): member -> (its
  // step, the step asked for).
  std::map<int, std::pair<int64_t, int64_t>> held_;
  std::vector<int64_t> last_sent_;  // leader: the last step whose result went to each member
  // Leader: the term of the last notice sent to each member it no longer sends results
  // to. One a term: a notice a step to a stopped member piled up thousands of sends that
  // every poll tested, slowing the others' steps the longer the stop, and the member,
  // on its return, read them one a poll before its catch-up.
  std::vector<int64_t> noticed_term_;
  std::vector<int64_t> sent_to_;  // messages_sent_to
  std::vector<int> missed_in_row_;  // leader: steps in a row a member's share was missing
  std::deque<StepRecord> history_;  // recent closed steps, for catch-ups' records
  bool applied_before(int from, int64_t c) const;  // see deadline_reduce.cpp
  // Leader: per recent step, when it opened and the latest arrival of a contribution to
  // it after that (late ones included), the measure that the budget adapts to.
  std::map<int64_t, std::pair<Clock::time_point, double>> arrivals_;
  std::vector<StepRecord> missed_;  // from catch-ups, until the caller takes them

  // Finish: members' reported (step, hash); the leader's answer.
  std::map<int, std::pair<int64_t, uint64_t>> done_;
  std::map<int, int64_t> stop_done_;  // members that reported a stop (done with samples 1): their step
  bool done_ok_ = false;
  // In finish(): this rank's training is over, and a rank behind it may take its state.
  bool finishing_ = false;
  // A member that reported the end of its training (done) at a later step than this
  // rank's, while this rank still steps: it takes that member's state instead of stepping
  // on (-1: none), having asked at term asked_end_term_.
  int ahead_done_ = -1;
  int64_t asked_end_term_ = -1;
  std::vector<bool> fin_;

  std::vector<std::shared_ptr<std::vector<char>>> inbox_;  // one posted receive per peer
  std::vector<Request> receives_;
  struct Outgoing {
    std::shared_ptr<std::vector<char>> bytes;
    Request request;
  };
  std::vector<Outgoing> outgoing_;
  double last_budget_ = 0;
};

// The chain hash's mixing step (exposed for tests).
uint64_t mix_step_hash(uint64_t previous, int64_t step, int64_t term, int leader,
                       const std::vector<Contribution>& contributors);

}  // namespace ht::comm
