// parallel.sync local at run time (DiLoCo, the outer step landing D job steps into the
// next round).
//
// Every rank runs its group's synchronous sub-plan (plan/local_plan.h) with the ordinary
// executor on the group's communicator, AdamW as configured being the inner optimiser.
// This class keeps what the groups share: the outer parameters theta and the outer
// momentum m, identical on every rank, and the exchange between rounds.
//
// Round k is H job steps (H global batches); in it this rank's group takes its H_g inner
// steps (plan/local_plan.h). It ends with this rank's weights y; a is where the round
// started. This rank's outer list (plan::outer_sync_schedules) runs OuterSyncStart after
// the round's last job step:
//   delta = a - y                                      (this group's progress, negated)
//   a = y = theta - delta                              (the outer weights + own progress)
//   start the exchange of w_this delta                 (non-blocking, over every rank)
// and OuterSyncFinish after job step D of the next round (plan::LocalSync::outer_delay:
// H, the round's end, unless parallel.outer_delay asks for it sooner):
//   finish the exchange: S = sum_r w_r delta_r with w_r = rank r's part of the round's
//     samples (plan::round_weight: its share of its group's batch x H_g / H; they sum to
//     1), so S is the sample-weighted mean of the groups' deltas, and take the outer step:
//     m = mu m + S; theta = theta - lr (S + mu m)  (Nesterov)
//     The mean, not the sum: each group's delta is a run of steps from the same start,
//     and summed they overshoot (on the MLP at 0.8/0.4/0.2/0.2, the step at the round's
//     end, the sum at outer_lr 1 stood at 49-54% after 100 steps, the mean at 74-76%).
//   y = theta + (y - a), a = theta                     (this round's progress so far onto it)
// At D = H both run at the round's end, Finish first, and the outer step is part of the
// same pass as the delta. So a group never waits on another beyond D steps: its own
// progress of the last round stands until the average of everyone's replaces it, D
// steps into the next round. The sums are made by one owner per part and sent to all
// (comm/weighted_allreduce.h), so every member of the exchange holds bit-identical theta
// and m (plan::outer_members: the groups' ranks and rank 0; another idle rank takes no
// part and holds no outer weights). Where every member is on one host (and no link is
// emulated) the exchange runs through shared memory instead (comm/shared_allreduce.h):
// the pass writes this rank's delta where the owners read it and reads the sums where
// they wrote them, the same sums bit for bit, with none of the messages' copies.
//
// Re-splitting from measurement (plan::resplit_from_measured). Each rank's exchange also
// carries, in its own two slots of a stats vector, the seconds it spent in the round's
// inner steps and in its outer work (the pass, and moving the exchange along between
// steps, which on a throttled rank costs more than the pass; not the wait for the sums); the sums (exact: every other slot is 0) reach
// every rank bit-identical with the deltas', so every rank takes the same decision from
// them: the median of kResplitRounds rounds per group (its slowest rank's), and a split of
// the round that ends the groups together at the measured speeds where it pays. The new
// split applies from the next round on every rank at once (take_resplit hands it to the
// trainer, which steps by it); rounds measured under the old split, and partial rounds
// after a flush, are not counted. Only with parallel.rebalance_every above 0 (the
// setting that lets a synchronous job rebalance; 0 keeps the plan's split, and a run's
// trajectory with it).
//
// flush() (collective) closes everything at once: it finishes the exchange in flight and
// steps, exchanges the current partial round's deltas (weighed by the samples each group
// took in it since the round began or the last flush: plan::segment_weight; the round's
// rest is weighed by its own samples at its end) and steps again, and sets the
// weights to theta. Evaluation and checkpoints flush first, so they see one consistent
// model; a checkpoint holds theta as the model and m as "outer.momentum.<name>".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/module.h"
#include "plan/local_plan.h"
#include "plan/plan.h"

namespace ht::comm {
class OverlappedAllreduce;
class SharedAllreduce;
}

namespace ht::runtime {

struct Checkpoint;

// This rank's group under a local plan: its synchronous sub-plan and communicator. An
// idle rank gets a one-rank plan in which it is idle, and no group (-1).
struct LocalGroup {
  int group = -1;
  plan::Plan plan;      // plan::group_plan, ranks renumbered in the group
  std::unique_ptr<comm::Communicator> comm;
  // Collective over `world`.
  static std::unique_ptr<LocalGroup> make(const plan::Plan& plan, comm::Communicator& world, comm::Timeout timeout);
};

class LocalSync {
 public:
  // Collective over `world` (it splits the outer communicator). `params` are this rank's
  // weights (the whole model), trained in place by the group's executor.
  // `shared_memory` false keeps the exchange on messages even on one host (the tests
  // compare the two).
  LocalSync(const plan::Plan& plan, std::vector<nn::NamedTensor> params, comm::Communicator& world,
            const config::ParallelConfig& cfg, bool shared_memory = true);
  ~LocalSync();

  // After every job step (`done` of them in the job, whether this group took an inner
  // step in it or not): moves the exchange in flight along and runs the outer list's
  // instructions due after this job step of its round (above). OuterSyncFinish is
  // collective (bounded by parallel.peer_timeout_s).
  // Returns the seconds it took (waiting included).
  // `inner_seconds`: what this rank spent in its group's inner steps in the job step.
  double after_step(int64_t done, double inner_seconds = 0);
  // The split the rounds moved to at the last round's end, once (see above); the caller
  // steps by it from the next job step.
  std::optional<plan::RoundSplit> take_resplit();
  // Moves the exchange in flight along, between the blocks of an inner step
  // (Executor::set_poll): a throttled rank takes a couple of inner steps a round, and
  // with the exchange moved only between them its peers waited on its part of the sums
  // at their round's end. Its time is outer work, not the inner step's.
  void poll();
  void flush();  // collective; see above
  // Time this rank waited on its peers outside the exchange (a log step's answer): left
  // out of the round's measured work, as the wait for the sums is.
  void count_wait(double wall_s, double cpu_s);

  // Takes the weights as they are now (loaded from a checkpoint) as theta and a.
  void reset_to_weights();
  // Before the first job step of this run (step `start`, 0 or where it resumed): a run
  // resumed inside a round exchanges that round's rest, weighed by the samples taken in
  // it, and does not count it as a measured round; the measuring starts now.
  void begin_at(int64_t start);
  // On resume: the round split the checkpoint's run stepped by (checked by the caller
  // against this plan's groups and H), from the first round on.
  void resume_split(const plan::RoundSplit& split);
  std::vector<nn::NamedTensor> outer_state() const;    // "outer.momentum.<name>"
  void load_outer_state(const Checkpoint& c);           // the momentum, where it has one

  int inner_steps() const { return inner_steps_; }
  int64_t outer_steps() const { return outer_steps_; }
  // On resume: the count of the checkpoint's run.
  void set_outer_steps(int64_t n) { outer_steps_ = n; }
  // Whether the exchange runs through shared memory (see above), not messages.
  bool shared_exchange() const { return board_ != nullptr; }
  const std::string& outer_checksum();  // CRC-32 of theta's bytes (kept until theta changes)

  // The outer step on plain arrays, as after_inner_step applies it: m = mu m + d;
  // theta = theta - lr (d + mu m). Shared with the tests' reference.
  static void outer_update(float* theta, float* m, const float* d, int64_t n, float lr, float mu);

 private:
  void start_round();      // OuterSyncStart: the outer step, the deltas, the new anchor, the exchange
  void start_exchange(bool with_stats);  // the contributions (and stats_) into the exchange
  void finish_exchange();  // OuterSyncFinish: waits for the sums
  // A PeerTimeout naming the members `x` still waits on (world ranks) and `what`.
  [[noreturn]] void fail_exchange(const comm::OverlappedAllreduce& x, const std::string& what) const;
  bool in_flight() const;  // an exchange is started and not finished
  void advance();          // moves the exchange in flight along; never waits
  // Tensor i's sums of the last exchange finished, and where this rank writes its
  // contribution to the next: delta_[i] both, over messages (the sums arrive in place).
  const float* sums_of(size_t i) const;
  float* contribution_of(size_t i) const;
  void take_outer_step();  // the outer step with the sums, where finish_exchange took any
  // After an outer step outside the round's pass: the weights onto the new outer weights
  // plus this round's progress so far, and the anchor onto the outer weights.
  void rebase_on_outer();
  void take_stats();       // the round's measured seconds from the exchange's stats sums
  void apply_split(const plan::RoundSplit& split);
  void start_measuring_round();  // the stats' counters from now
  comm::Timeout timeout() const { return comm::Timeout(timeout_s_); }

  plan::Plan plan_;
  std::vector<nn::NamedTensor> params_;
  std::vector<Tensor> theta_, momentum_, anchor_, delta_;  // host memory (local_sync.cpp)
  std::vector<float> scratch_;  // a device parameter's values during a host pass
  std::unique_ptr<comm::Communicator> outer_;
  std::vector<double> weights_;  // every rank's part of a round's samples (the exchange's parts)
  float lr_ = 0, mu_ = 0;
  double timeout_s_ = 0;
  int inner_steps_ = 1;
  int outer_delay_ = 1;  // D (plan::LocalSync::outer_delay): the job step of a round where the last one's step lands
  int steps_in_round_ = 0;  // job steps since the round began or the last flush
  // The job step of the round (0..H-1) where the progress not yet exchanged began: 0, or
  // where a flush or a resume left off. Its delta is weighed by the samples the groups
  // take from there (plan::segment_weight), not by a whole round's.
  int round_from_ = 0;
  int64_t outer_steps_ = 0;
  bool sums_ready_ = false;  // delta_ holds sums the outer step has not taken yet
  std::string checksum_;     // of theta_; empty: not computed since theta_ last changed
  int world_rank_ = 0;
  bool member_ = true;  // of the outer exchange (plan::outer_members): holds the outer weights
  plan::Schedule outer_list_;  // plan::outer_sync_schedules: Finish after job step D, Start after step H
  std::unique_ptr<comm::OverlappedAllreduce> exchange_;  // in flight
  std::unique_ptr<comm::OverlappedAllreduce> draining_;  // finished; its sums still going out
  std::unique_ptr<comm::SharedAllreduce> board_;  // the exchange through shared memory, where it runs so
  int64_t exchanges_ = 0;           // started so far: the board's exchange numbers
  int64_t exchanges_finished_ = 0;  // of them, finished (the board's)
  // Measured rounds (see above).
  bool resplit_ = false;          // parallel.rebalance_every > 0: the exchange carries stats_
  Tensor stats_;                  // (2 x world): inner seconds, pass seconds, per rank
  bool stats_in_flight_ = false;  // the exchange in flight carries stats_
  double inner_s_ = 0;            // this rank's inner steps in the round so far
  double outer_work_s_ = 0;       // its outer work in the round so far (see after_step)
  double polled_s_ = 0;           // poll()'s part of it inside the job step in progress
  // A CPU rank's stats are its round's wall clock split by CPU time (plan::cpu_round_seconds).
  bool cpu_rank_ = true;
  double outer_cpu_s_ = 0;        // CPU seconds of the outer work in the round so far
  double waited_s_ = 0;           // wall seconds waiting on peers: the exchange's sums, the last one's sends taken
  // Where the round's measuring began (start_measuring_round): wall clock and CPU.
  std::chrono::steady_clock::time_point stats_at_ = std::chrono::steady_clock::now();
  double stats_cpu_at_ = 0;
  bool partial_ = false;          // the round in progress began at a flush
  int skip_rounds_ = 0;           // stats to come that were measured under an old split
  std::vector<std::vector<double>> window_inner_, window_pass_;  // per round of the window, per group
  std::optional<plan::RoundSplit> pending_, taken_;  // decided; applied, not yet handed over
};

// Throws when two ranks report different outer checksums (one per world rank; empty
// for a rank that holds no outer weights), naming both ranks and the step: under local
// every member of the outer exchange must hold bit-identical outer weights.
void check_outer_identical(const std::vector<std::string>& checksums, int64_t step);

}  // namespace ht::runtime
