// The run's glue to parallel.sync local (a group's inner steps, the meetings of every
// rank) and deadline (its start, the steps a catch-up applied, the end on one chain).
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/units.h"
#include "core/wall_time.h"
#include "plan/local_plan.h"
#include "runtime/trainer_run.h"

namespace ht::runtime::trainer_run {

// Under local, job step `step`: this rank's group takes the inner steps of its round
// that fall in this step (plan::local_batches: over a round the groups' steps are
// disjoint runs of the stream that cover it), its sub-plan sized for each
// (plan::size_group_step: a group's steps differ by a sample at most, but the groups'
// sizes differ by speed).
StepResult Run::local_step(int64_t step, float lr, bool trace) {
  LocalGroup& g = *local_group_;
  if (g.group < 0) return executor_->step(stream_base_ + step * cfg_.train.batch_size, lr, trace);  // idle
  const auto t0 = Clock::now();
  StepResult r, traced;  // traced: every inner step's spans of this job step, not the last's alone
  for (const plan::LocalBatch& b : plan::local_batches(plan_, g.group, step)) {
    if (b.count != g.plan.global_batch) {
      plan::size_group_step(g.plan, plan_, g.group, b.count);
      executor_->reshare();
    }
    r = executor_->step(stream_base_ + b.first, lr, trace);
    if (trace) add_spans(traced, r);
  }
  if (trace) {
    r.spans = std::move(traced.spans);
    r.start_s = traced.start_s;
  }
  r.wall_s = seconds_since(t0);
  return r;
}

// Under local, collective: the outer weights in the model, and the inner optimiser
// state of rank 0's group (every group's starts from it on resume).
std::vector<nn::NamedTensor> Run::local_inner_state() {
  local_->flush();
  return executor_->active() ? executor_->optimizer()->state() : std::vector<nn::NamedTensor>{};
}

// Under local: whether every rank meets after job step `done` (an evaluation, a
// checkpoint, the last step: each flushes, collectively).
bool Run::local_meets(int64_t done) const {
  return (cfg_.train.eval_every > 0 && done % cfg_.train.eval_every == 0) ||
         (cfg_.checkpoint.every > 0 && done % cfg_.checkpoint.every == 0) || done == total_steps_;
}

// Under local, after the round end where every rank moved to `split` (LocalSync's
// re-split from measured rounds): the plan steps by it from the next job step, and rank
// 0 records it.
void Run::take_local_resplit(const plan::RoundSplit& split, Loop& loop) {
  const std::vector<int64_t> before = plan_.local->round_samples;
  plan_.local->group_steps = split.steps;
  plan_.local->round_samples = split.samples;
  plan::check_local_plan(plan_);
  if (!root_) return;
  const nlohmann::json record{{"type", "local_resplit"},
                              {"step", loop.step + 1},
                              {"round_samples_before", before},
                              {"round_samples", split.samples},
                              {"group_steps", split.steps},
                              {"predicted_round_s", split.seconds}};
  loop.metrics->write(record.dump());
  std::string line = "local: the groups' rounds re-split from their measured speed at step " +
                     std::to_string(loop.step + 1) + ": samples a round";
  for (size_t g = 0; g < before.size(); ++g)
    line += (g ? ", " : " ") + std::to_string(before[g]) + " -> " + std::to_string(split.samples[g]);
  loop.progress.note(line);
}

// parallel.sync deadline: the stage's reduction closes at its budget (runtime/deadline_sync.h).
void Run::start_deadline(int64_t start, report::Progress& progress) {
  // The plan's shares move with the leaders' re-splits (the executor's plan is plan_).
  executor_->use_deadline(cfg_.parallel, start, [this](int64_t s) { return schedule_.at(s); },
                          {opts_.rebalance, [this](plan::Plan p) { plan_ = std::move(p); }, total_steps_});
  deadline_shares_ = plan_.layout.samples;
  if (executor_->deadline())
    progress.note("parallel.sync deadline: a step closes at " + std::to_string(1 + cfg_.parallel.deadline_slack) +
                  " x the step's measured median (the plan's " + std::to_string(plan_.predicted.step_seconds) +
                  " s at first); late contributions are " +
                  (cfg_.parallel.max_staleness > 0
                       ? "applied up to " + std::to_string(cfg_.parallel.max_staleness) + " steps late"
                       : std::string("dropped")));
  else if (plan_.stage_ranges.size() > 1 && plan_.layout.replicas.size() == 1)
    progress.note("parallel.sync deadline on a pure pipeline: a stalled stage has no stand-in, so the job waits "
                  "for it, up to parallel.peer_timeout_s = " + std::to_string(cfg_.parallel.peer_timeout_s) + " s");
}
// The step a deadline step applied (after a catch-up, a later one than asked): its
// records, and those of the steps caught up past, go to rank 0's metrics.
int64_t Run::take_deadline(StepResult& r, Loop& loop) {
  const DeadlineStep& d = *r.deadline;
  if (!d.passed.empty()) deadline_log_.aligned();
  if (d.caught_up) deadline_log_.caught_up();
  std::vector<comm::StepRecord> records = d.missed;
  if (d.record.step >= 0) records.push_back(d.record);
  records.insert(records.end(), d.passed.begin(), d.passed.end());
  for (const comm::StepRecord& rec : records) write_deadline_record(rec, loop.metrics, loop.progress);
  // The quarantines this step decided (rank 0's events): no log exchange brings them
  // under deadline, so they are reported here, once.
  if (root_ && d.record.step >= 0)
    for (const GuardEvent& e : r.guard_events) report_guard(d.record.step + 1, e, loop.metrics);
  r.guard_events.clear();
  // Ended with its replica's other stage, not by a catch-up to the end: its own stage
  // ends on one chain now (the leader that ended the other stage is at the end too), so
  // that the last step's checkpoint holds the end's weights.
  if (d.ended && executor_->deadline_step() < total_steps_) end_deadline_chain(loop, FinishReason::propagated);
  // Still short of the last step on that chain: the member that ended it stopped there (an
  // interrupt, --stop-after), not at the end of training, and the job stops at that step.
  // (Taken as the end, it once wrote the step-200 weights as the checkpoint of step 2000.)
  // On a hybrid plan the stopping replica's ranks agreed on the step (AlignReplica), so
  // every stage's chain ends there.
  if (d.ended && executor_->deadline_step() < total_steps_) deadline_ended_early_ = true;
  const int64_t applied = d.ended && !deadline_ended_early_ ? total_steps_ : executor_->deadline_step();
  // Weights after that many steps: the end's where the chain ended, else those the step
  // just applied started from.
  if (d.caught_up)
    loop.progress.note("caught up: this rank was left out and took the current weights at step " +
                       std::to_string(d.ended ? applied : executor_->deadline_step() - 1) +
                       (deadline_ended_early_ ? " (another rank stopped the job there)" : ""));
  r.loss_sum = deadline_log_.last_loss_sum();
  r.loss_samples = deadline_log_.last_loss_samples();
  // The step before the one this rank runs next (AlignReplica may have moved it on).
  return applied - 1;
}

void Run::end_deadline_chain(Loop& loop, FinishReason why) {
  if (deadline_agreed_) return;
  for (const comm::StepRecord& rec : executor_->finish_deadline(why))
    write_deadline_record(rec, loop.metrics, loop.progress);
  deadline_agreed_ = true;
}

// Rank 0 writes each step's record once and reports the contributions the bad-node guard
// left out of it, from the verdicts the record carries (the steps it caught up past too).
void Run::write_deadline_record(const comm::StepRecord& rec, std::optional<report::MetricsLog>& metrics,
                                report::Progress& progress) {
  if (const std::string line = deadline_log_.short_line(rec); !line.empty()) progress.note(line);
  const std::string record = deadline_log_.add(rec);
  if (!metrics || record.empty()) return;
  metrics->write(record);
  for (const comm::Contribution& c : rec.contributors) {
    if (c.staleness != 0 || c.verdict == static_cast<int64_t>(Verdict::kept) || c.rank < 0 ||
        c.rank >= static_cast<int>(plan_.ranks.size()))
      continue;
    // The share in force in that step: the executor has taken a re-split the record
    // carries for the next step already.
    const int replica = plan_.ranks[static_cast<size_t>(c.rank)].replica;
    const int64_t share = replica >= 0 ? deadline_shares_[static_cast<size_t>(replica)] : 0;
    report_guard(rec.step + 1, GuardEvent{c.rank, 0, static_cast<Verdict>(c.verdict), share, 0}, metrics);
  }
  // A leader's re-split: it runs from the step after this record's, the one whose
  // `contributions` record says rec.step + 2 (records count steps from 1).
  if (!rec.shares.empty()) {
    std::vector<int> ranks;  // each replica's first rank, as sync's records name them
    for (const auto& replica : plan_.layout.replicas) ranks.push_back(replica.front());
    metrics->write(nlohmann::json{{"type", "rebalance"},
                                  {"step", rec.step + 2},
                                  {"sync_policy", "deadline"},
                                  {"changed", true},
                                  {"leader", rec.leader},
                                  {"ranks", ranks},
                                  {"shares_before", deadline_shares_},
                                  {"shares", rec.shares}}
                       .dump());
    progress.note("step " + std::to_string(rec.step + 2) + ": rebalanced the replicas' shares from measured speeds "
                  "(rank " + std::to_string(rec.leader) + " leading): " + join(deadline_shares_, "/") + " -> " +
                  join(rec.shares, "/"));
    deadline_shares_ = rec.shares;
  }
}

// Every member ends on one chain (a rank behind catches up), then the replicas are
// checked bit-identical. The step every rank ended at goes with its checksum: on a plan
// of several stages each stage's chain ends on its own, and a checkpoint of stages at
// different steps would join weights of different steps under one step's name. Refused
// before it is written (the newest checkpoint stays the last good one).
// Each rank's signal goes with them, so that a rank whose chain another's stop ended
// exits with that rank's status.
void Run::finish_deadline(Loop& loop, FinishReason why) {
  end_deadline_chain(loop, why);
  const std::vector<std::string> items = world_.allgather(
      std::to_string(interrupt_signal()) + " " + std::to_string(executor_->deadline_step()) + " " +
          executor_->parameter_checksum(),
      peer_timeout(), "the replicas' checksums after the last step");
  std::vector<std::string> checksums, steps;
  for (size_t r = 0; r < items.size(); ++r) {
    const std::string& item = items[r];
    const size_t first = item.find(' '), second = first == std::string::npos ? first : item.find(' ', first + 1);
    const std::string sig = item.substr(0, first);
    HT_CHECK(second != std::string::npos && (sig == "0" || sig == std::to_string(SIGINT) || sig == std::to_string(SIGTERM)),
             "rank ", r, " sent '", item, "' at the end of its deadline chain; expected its signal (0, ", SIGINT,
             " or ", SIGTERM, "), its step and its checksum");
    agreed_signal_ = stronger_stop(agreed_signal_, std::stoi(sig));
    steps.push_back(item.substr(first + 1, second - first - 1));
    checksums.push_back(item.substr(second + 1));
  }
  const bool equal = std::all_of(steps.begin(), steps.end(), [&](const std::string& s) { return s == steps[0]; });
  std::string where;
  for (size_t r = 0; r < steps.size(); ++r) where += (r ? ", rank " : "rank ") + std::to_string(r) + " at " + steps[r];
  HT_CHECK(equal, "the deadline chains ended at different steps (", where, "); expected every rank at one step "
           "(a stop that reached the stages apart): no checkpoint of this stop is written, the newest one stands");
  check_replicas_identical(plan_, checksums, executor_->deadline_step());
}

}  // namespace ht::runtime::trainer_run
