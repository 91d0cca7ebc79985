// The log steps' exchange: every train.log_every steps each rank's window goes to rank 0
// (Communicator::consult) while the next step runs; rank 0 sends all of them back, every
// rank checks the replicas identical and the loss finite, and rank 0 writes the record
// and reports the bad-node guard's events.
#include <algorithm>
#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/cpu_time.h"
#include "core/wall_time.h"
#include "runtime/trainer_run.h"

namespace ht::runtime::trainer_run {

namespace {
using json = nlohmann::json;
}  // namespace

// What the ranks sent toward rank 0 after the step before: answered while this one ran
// (see Communicator::consult). A change applies from the next step. Under local the
// groups are apart within a round (a group with one inner step a round takes it at the
// round's start), so waiting there for every rank's log would hold the others back. Rank
// 0 answers (finishes) the logs of the round before at a round end, where every rank is
// past them, as with the outer exchange; the others take those answers one round end
// later, when rank 0 has given them, so that a group may run up to a round ahead of rank
// 0's without waiting on it here either (taking them at the same round end held every
// group to rank 0's pace at every round end: a third of a throttled rank's time). A stop
// in them applies on every rank at the round end where the others take them. Every rank
// finishes all of them where every rank meets anyway (an evaluation or checkpoint, the
// job's end). True when some rank was interrupted.
bool Run::finish_due_logs(Loop& loop, int64_t done, bool stop_after) {
  if (!local_ || local_meets(done) || stop_after) return finish_logs(loop, done, done, done);
  const int64_t h = local_->inner_steps();
  if (done % h != 0) return false;
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  const bool stop = finish_logs(loop, root_ ? done - h : done - 2 * h, done, done - 2 * h);
  local_->count_wait(seconds_since(t0), process_cpu_seconds() - cpu0);
  return stop;
}

// After job step `done` (the loop asked for `asked`): under deadline rank 0 records the
// window's loss with no exchange; otherwise a log step sends this rank's window on its way
// to rank 0, finished at once with one process or when no step follows. True when a
// finished log says some rank was interrupted.
bool Run::log_step(Loop& loop, int64_t asked, int64_t done, float lr, bool final_step) {
  // A stop before the end logs its window too: its guard records and loss are of steps that
  // the resumed run will not log again.
  if (executor_->deadline() &&
      (done / cfg_.train.log_every > asked / cfg_.train.log_every || done == total_steps_ || final_step)) {
    // A window that brought no loss leaves it out of its record (the progress line keeps
    // the last one known).
    const std::optional<double> loss = deadline_log_.take_window_loss(task_->predictions_per_sample());
    if (loss) loop.last_loss = *loss;
    log_line(loop, done, lr, seconds_since(loop.t0));
    if (loop.metrics) {
      json r{{"type", "train"}, {"step", done}, {"lr", lr}, {"sync_policy", "deadline"}, {"wall_s", seconds_since(loop.t0)}};
      if (loss) r["loss"] = *loss;
      if (const DynamicLossScale* ls = executor_->loss_scale()) r["loss_scale"] = ls->scale();
      loop.metrics->write(r.dump());
    }
    return false;
  }
  if (done % cfg_.train.log_every != 0 && done != total_steps_ && !final_step) return false;
  loop.window.stop_signal = interrupt_signal();
  if (multi() && !local_) loop.window.checksum = executor_->parameter_checksum();
  // Under local a CRC of the whole model costs a throttled rank a good part of a
  // round: the outer weights are compared where the ranks meet and every tenth log step.
  if (local_ && (local_meets(done) || final_step || done % (10 * cfg_.train.log_every) == 0))
    loop.window.checksum = local_->outer_checksum();
  if (!local_) answered_logs_.clear();  // taken a log step ago
  loop.pending_logs.push_back(PendingLog{world_.consult(loop.window.to_text()), done, loop.window_steps, lr,
                                         seconds_since(loop.t0), local_ ? local_->outer_steps() : 0,
                                         executor_->loss_scale() ? executor_->loss_scale()->scale() : 0.0});
  loop.window = Window{};
  loop.window_steps = 0;
  if (!multi() || final_step) return finish_logs(loop, done, done, done);
  return false;
}

// The progress line of log step `done` (its loss now in loop.last_loss), with the rate
// (`rate`, or where negative the run's so far) and remaining time as they stood at the
// step, `elapsed_s` into the run.
void Run::log_line(const Loop& loop, int64_t done, float lr, double elapsed_s, double rate) const {
  const auto steps = static_cast<double>(done - loop.start);
  if (rate < 0) rate = steps * static_cast<double>(cfg_.train.batch_size) / elapsed_s;
  const double eta = static_cast<double>(total_steps_ - done) * elapsed_s / steps;
  loop.progress.logged(done, static_cast<float>(loop.last_loss), lr, rate, eta);
}

// `outer_steps`: those taken by the record's step; `loss_scale`: rank 0's at that step
// (0: none).
std::string Run::with_sync_policy(const std::string& record, int64_t outer_steps, double loss_scale) const {
  if (!local_ && loss_scale <= 0) return record;
  json r = json::parse(record);
  if (local_) {
    r["sync_policy"] = "local";
    r["outer_steps"] = outer_steps;
  }
  if (loss_scale > 0) r["loss_scale"] = loss_scale;
  return r.dump();
}

// After job step `done`: finish_log of each pending log of a step up to `upto`, oldest
// first; true when some rank was interrupted in a log of a step up to `act_upto` (rank 0
// under local keeps the stops it answered until the others take them: finish_due_logs).
bool Run::finish_logs(Loop& loop, int64_t upto, int64_t done, int64_t act_upto) {
  if (local_) {
    // The outer step at the last round end finished the exchange every rank started at
    // the round end before, so every rank is past that one. A log of step d is finished
    // at the first round end from d + 2H on (or at a meeting before it).
    const int64_t h = local_->inner_steps(), passed = (done / h - 1) * h;
    while (!answered_logs_.empty() && (answered_logs_.front().first + 3 * h - 1) / h * h <= passed)
      answered_logs_.pop_front();
  }
  std::deque<PendingLog>& logs = loop.pending_logs;
  for (; !logs.empty() && logs.front().done <= upto; logs.pop_front())
    if (finish_log(loop, logs.front())) stops_.push_back(logs.front().done);
  bool interrupted = false;
  for (; !stops_.empty() && stops_.front() <= act_upto; stops_.pop_front()) interrupted = true;
  return interrupted;
}

// Rank 0 sends every rank's window back to all; each rank checks that the replicas are
// identical and the loss finite, so that all fail alike, and rank 0 writes the record.
// True when some rank was interrupted. The consultation moves to `answered_logs_`.
bool Run::finish_log(Loop& loop, PendingLog& p) {
  const std::string all = p.consult->finish([](const std::vector<std::string>& items) { return json(items).dump(); },
                                            peer_timeout(), "the log step " + std::to_string(p.done) + " consultation");
  answered_logs_.emplace_back(p.done, std::move(p.consult));
  std::vector<Window> ranks;
  std::vector<std::string> checksums;
  for (const std::string& t : json::parse(all).get<std::vector<std::string>>()) {
    ranks.push_back(Window::from_text(t));
    checksums.push_back(ranks.back().checksum);
  }
  if (local_) check_outer_identical(checksums, p.done);
  else if (multi()) check_replicas_identical(plan_, checksums, p.done);
  double loss_sum = 0;
  int64_t loss_samples = 0;
  bool interrupted = false;
  for (const Window& w : ranks) {
    loss_sum += w.loss_sum;
    loss_samples += w.loss_samples;
    interrupted = interrupted || w.stop_signal != 0;
    agreed_signal_ = stronger_stop(agreed_signal_, w.stop_signal);
  }
  bool left_out = false;
  for (const Window& w : ranks) {
    for (const auto& [step, e] : w.guard) report_guard(step, e, loop.metrics);
    left_out = left_out || !w.guard.empty();
  }
  // Under local a group's inner steps are front-loaded in its round, so a window of job
  // steps may hold none on any rank (a round's last steps; log_every 1): no sample was
  // trained, none was left out, and the record keeps the last loss. (Judged a divergence,
  // it ended such runs at their last step or a Ctrl-C with exit 1 and no checkpoint.)
  if (!(local_ && loss_samples == 0 && !left_out)) loop.last_loss = check_loss(loss_sum, loss_samples, p.done);
  // The line's rate is the record's: the window's samples over its slowest rank's steps.
  const double wall = window_wall_s(ranks);
  log_line(loop, p.done, p.lr, p.elapsed_s,
           wall > 0 ? static_cast<double>(p.steps * cfg_.train.batch_size) / wall : -1);
  if (loop.metrics)
    loop.metrics->write(with_sync_policy(
        train_record(p.done, p.lr, loop.last_loss, ranks, p.steps, cfg_.train.batch_size, p.elapsed_s), p.outer_steps,
        p.loss_scale));
  return interrupted;
}

// One line and one metrics record per contribution left out or rank quarantined
// (rank 0, as the log step brings them), counted for the summary.
void Run::report_guard(int64_t step, const GuardEvent& e, std::optional<report::MetricsLog>& metrics) {
  json record = {{"type", "guard"}, {"step", step}, {"rank", e.rank}, {"stage", e.stage}};
  std::string line = "step " + std::to_string(step) + ": rank " + std::to_string(e.rank) +
                     (plan_.stage_ranges.size() > 1 ? " (stage " + std::to_string(e.stage) + ")" : "");
  if (e.quarantine_steps > 0) {
    record["quarantined_steps"] = e.quarantine_steps;
    guard_totals_.quarantined.insert(e.rank);
    line += " quarantined for " + std::to_string(e.quarantine_steps) + " steps: left out " +
            std::to_string(cfg_.guard.quarantine_after) + " times within " + std::to_string(cfg_.guard.window) +
            " steps (guard.quarantine_after, guard.window); its contributions are left out until then";
  } else {
    record["reason"] = verdict_name(e.verdict);
    record["samples_left_out"] = e.samples;
    // Held in a quarantine decided before a resume: quarantined in this invocation too.
    if (e.verdict == Verdict::quarantined) guard_totals_.quarantined.insert(e.rank);
    guard_totals_.steps.insert(step);
    guard_totals_.samples += e.stage == 0 ? e.samples : 0;
    line += " left out of the step (" + std::string(verdict_name(e.verdict)) + ", " + std::to_string(e.samples) +
            " samples); " +
            (e.samples == cfg_.train.batch_size ? "no sample kept: the update is skipped"
                                                 : "the gradient is the mean over the samples kept");
  }
  if (metrics) metrics->write(record.dump());
  // A quarantined rank's every step would repeat the quarantine's line: the record says it.
  const bool repeat = e.verdict == Verdict::quarantined && e.quarantine_steps == 0;
  if (progress_ && !repeat) progress_->note(line);
}

// The mean loss per prediction of `samples` samples from their summed loss. None left
// (every contribution since the last check was left out with a non-finite loss) is a
// divergence too: a step that keeps no sample changes nothing, and the next one fails
// alike.
double Run::check_loss(double loss_sum, int64_t samples, int64_t done) const {
  HT_CHECK(samples > 0, "training diverged by step ", done,
           ": no sample's loss was finite since the last check (every contribution was left out); expected a "
           "finite loss (", divergence_advice(local_ != nullptr), ")");
  const double mean = loss_sum / static_cast<double>(samples * task_->predictions_per_sample());
  HT_CHECK(std::isfinite(mean), "training diverged by step ", done, ": the loss is ", mean,
           "; expected a finite value (", divergence_advice(local_ != nullptr), ")");
  return mean;
}

}  // namespace ht::runtime::trainer_run
