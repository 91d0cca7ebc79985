#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <new>
#include <sstream>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "backend/cuda/device_select.h"
#include "backend/registry.h"
#include "comm/communicator.h"
#include "comm/emulation.h"
#include "core/threads.h"
#include "core/wall_time.h"
#include "config/json_schema.h"
#include "runtime/atomic_file.h"
#include "runtime/run_dir.h"
#include "runtime/stage_gather.h"
#include "runtime/trainer_run.h"

namespace ht::runtime {

namespace trainer_run {

namespace {

using json = nlohmann::json;

volatile std::sig_atomic_t g_interrupted = 0;  // the signal that asked for the stop, or 0
void on_interrupt(int sig) { g_interrupted = sig; }

// Ctrl-C stops at the next step boundary with a checkpoint instead of losing the run, and
// so does SIGTERM: mpirun turns a Ctrl-C into SIGTERM to every rank, and a batch
// scheduler (Slurm's scancel, a pre-emption) sends it before SIGKILL.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = 0;
    previous_int_ = std::signal(SIGINT, on_interrupt);
    previous_term_ = std::signal(SIGTERM, on_interrupt);
  }
  ~InterruptScope() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

int64_t resolve_steps(const config::TrainConfig& t, int64_t train_size) {
  if (t.steps) return *t.steps;
  double steps = std::ceil(*t.epochs * static_cast<double>(train_size) /
                           static_cast<double>(t.batch_size));
  // At most what the checkpoint's int32 step counter holds (past int64's range the
  // conversion was undefined too: it gave 1 step for 1e17 epochs).
  if (!(steps <= static_cast<double>(config::TrainConfig::kMaxSteps))) {
    std::ostringstream what;
    what << "train.epochs: " << *t.epochs << " epochs of " << train_size << " samples in batches of " << t.batch_size
         << " are " << steps << " steps; expected at most " << config::TrainConfig::kMaxSteps
         << " (2^31 - 1: the checkpoint's step counter)";
    throw config::ConfigError(what.str());
  }
  return std::max<int64_t>(1, static_cast<int64_t>(steps));
}

// The whole model in host staging (outside an emulated device cap): a pipeline stage's
// device holds only its own blocks, and a model larger than any one device is still built
// identically, from one seed, on every rank. In a plan of several stages (not under
// local) a rank other than rank 0 releases the weights of the blocks outside its stage
// as each is made (an idle one all of them): nothing reads them there, and keeping them
// would hold the whole model in every rank's host memory (plan/memory_fit.h's
// host_memory counts what this keeps). Rank 0 keeps them all: it evaluates and
// checkpoints the whole model. A one-stage plan keeps them too: a relayout may bring an
// idle rank in (runtime/stage_gather.h).
nn::Sequential build_in_host_staging(const Task& task, uint64_t seed, const std::optional<plan::Plan>& plan,
                                     int rank) {
  Allocator::HostStaging staging;
  if (!plan || rank == 0 || plan->local || plan->stage_ranges.size() < 2 ||
      static_cast<size_t>(rank) >= plan->ranks.size())
    return task.build_model(seed);
  const plan::RankPlan& mine = plan->ranks[static_cast<size_t>(rank)];
  const int begin = mine.replica < 0 ? 0 : mine.block_begin, end = mine.replica < 0 ? 0 : mine.block_end;
  nn::Sequential::KeepOnly keep([begin, end](size_t b) {
    return static_cast<int>(b) >= begin && static_cast<int>(b) < end;
  });
  return task.build_model(seed);
}

}  // namespace

int interrupt_signal() { return g_interrupted; }

Run::Run(config::Config cfg, const TrainOptions& opts, std::optional<plan::Plan> plan)
    : cfg_(std::move(cfg)),
      opts_(opts),
      world_(comm::world()),
      root_(world_.rank() == 0),
      task_(make_task(cfg_, run_device())),
      dir_(root_ ? std::optional<RunDir>(RunDir::open(cfg_.run.dir, opts.resume)) : std::nullopt),
      model_(build_in_host_staging(*task_, cfg_.train.seed, plan, world_.rank())),
      plan_(plan ? std::move(*plan)
                 : single_process_plan(static_cast<int>(model_.size()), cfg_.train.batch_size,
                                       static_cast<int>(cfg_.train.micro_batches))),
      local_group_(plan_.local ? LocalGroup::make(plan_, world_, peer_timeout()) : nullptr),
      executor_(std::make_unique<Executor>(local_group_ ? local_group_->plan : plan_, model_, *task_,
                                           local_group_ ? *local_group_->comm : world_, cfg_.train, peer_timeout())),
      // Under deadline no exchange may wait for every rank: the steps' leaders re-split
      // instead, through the records (runtime/deadline_rebalance.h, start_deadline).
      rebalancer_(plan_.sync_policy == plan::SyncPolicy::deadline ? RebalanceFn{} : opts.rebalance, cfg_.parallel.rebalance_every,
                  world_, peer_timeout()),
      planned_step_s_(plan_.predicted.step_seconds),
      checkpoints_(cfg_.run.dir + "/checkpoints", cfg_.checkpoint.keep),
      faults_(opts.faults, world_.rank()) {
  if (!faults_.empty()) executor_->inject(&faults_);
  if (root_) checkpoints_.remove_partial_writes();  // rank 0 holds the run directory's lock (dir_)
  // Under local the outer step moves a group's weights by a whole round's progress at
  // once, so the next inner gradients' norms are no outliers of the group's own recent
  // ones: the guard keeps its non-finite check there and leaves out the norm check
  // (the MLP at quotas 0.8/0.4/0.2/0.2 had rank 0's updates skipped as outliers after
  // outer steps).
  config::GuardConfig guard = cfg_.guard;
  if (local_group_) guard.norm_ratio = 0;
  executor_->set_guard(guard);
  agree_stops_in_steps();
  // Rank 0 evaluates and checkpoints the whole model. Like every rank it holds only its
  // stage on its device (the executor moved it there), the rest in host memory: its
  // evaluation streams those blocks through the device one at a time (evaluate), so that
  // a model larger than rank 0's device can be trained (on a CPU rank both are host memory).
  // Rank 0 keeps the whole model's outer weights even when idle: it evaluates and checkpoints.
  if (local_group_) {
    local_ = std::make_unique<LocalSync>(plan_, executor_->active() ? executor_->parameters() : model_.named_parameters(),
                                         world_, cfg_.parallel);
    executor_->set_poll([this] { local_->poll(); });
  }
  total_steps_ = resolve_steps(cfg_.train, task_->train_size());
  const auto& s = cfg_.train.schedule;
  schedule_ = {s.type, cfg_.train.optimizer.lr, s.warmup_steps, s.min_lr, total_steps_};
}

TrainSummary Run::run() {
  report::Progress progress(report::Progress::detect(opts_.quiet || !root_, opts_.terminal), total_steps_);
  // On stderr, --quiet or not: a warm-up as long as the run (one of a longer config run
  // with --steps, say) trains at a fraction of train.lr throughout, which its accuracy
  // alone would not explain. Not an error: a short trial of a long config is a use.
  if (root_ && cfg_.train.schedule.type == "cosine" && cfg_.train.schedule.warmup_steps >= total_steps_)
    std::fprintf(stderr,
                 "hetrain: warning: train.schedule.warmup_steps %lld is not below the run's %lld steps: the learning "
                 "rate stays under train.optimizer.lr throughout\n",
                 static_cast<long long>(cfg_.train.schedule.warmup_steps), static_cast<long long>(total_steps_));
  progress_ = &progress;
  // Before the checkpoint is read: a changed model, seed or optimiser is then refused as
  // the config error it is, naming the setting, not as a checkpoint that does not fit.
  if (root_ && opts_.resume) check_resumed_config();
  const int64_t start = opts_.resume ? restore(progress) : 0;
  if (opts_.resume) executor_->weights_loaded();
  if (local_) local_->begin_at(start);
  if (plan_.sync_policy == plan::SyncPolicy::deadline) start_deadline(start, progress);
  share_evaluation();
  std::optional<report::MetricsLog> metrics;
  if (root_) open_run_files(start, metrics);
  announce(start, progress);

  InterruptScope interrupt_scope;
  Loop loop(progress, metrics, start, std::min(start + 5, total_steps_ - 1));
  for (; loop.step < total_steps_; ++loop.step) {
    const float lr = schedule_.at(loop.step);
    // Under local the traced step's whole round (from where this run began), so that every
    // group's inner steps are in it; one step otherwise. Every rank writes at its end.
    const int64_t h = local_ ? local_->inner_steps() : 1;
    const int64_t trace_begin = std::max(loop.start, loop.traced / h * h);
    const int64_t trace_end = std::min(total_steps_ - 1, local_ ? loop.traced / h * h + h - 1 : loop.traced);
    const bool trace = !opts_.timeline.empty() && loop.step >= trace_begin && loop.step <= trace_end;
    faults_.begin_step(loop.step + 1);
    const int64_t asked = loop.step;
    StepResult r = take_step(loop, lr, trace);  // may move loop.step on (a deadline catch-up)
    if (trace) add_spans(loop.trace, r);
    if (trace && asked == trace_end) {
      write_timeline(loop.trace);
      loop.timeline_written = true;
    }
    rebalancer_.record(r);
    add_to_window(loop, r);
    // The records and the progress line are of the step applied: past a catch-up, not the
    // one this rank ran.
    const float done_lr = loop.step == asked ? lr : schedule_.at(loop.step);
    // A step that kept no sample's loss is judged with its log window (finish_log), as
    // under several ranks: one whose whole window kept none has diverged.
    int64_t done = loop.step + 1;
    if (!multi() && r.loss_samples > 0) loop.last_loss = check_loss(r.loss_sum, r.loss_samples, done);
    const bool stop_after = opts_.stop_after && done - start >= *opts_.stop_after;
    // One process stops at once, and logs its last window as a stop agreed by many does.
    agreed_signal_ = stronger_stop(agreed_signal_, r.stop_signal);
    bool stop_all = finish_due_logs(loop, done, stop_after) || r.stop_signal != 0 || (!multi() && g_interrupted != 0);
    apply_rebalance(loop);
    // Under deadline no reduction carries an interrupt: a rank stops at its own step when it
    // was signalled (on a hybrid plan, at the step its replica agreed in AlignReplica), or
    // where another's stop ended the chain (take_deadline): an interrupt, or --stop-after
    // (every rank has it) reached by a rank ahead.
    const bool signalled = replica_agrees_stops() ? r.stop_signal != 0 : g_interrupted != 0;
    const bool deadline_stop = executor_->deadline() && (signalled || deadline_ended_early_);
    // No step follows to wait through: the exchange ends here.
    const bool final_step = done == total_steps_ || stop_after || stop_all || deadline_stop;
    stop_all = log_step(loop, asked, done, done_lr, final_step) || stop_all;
    if (!stop_all && !stop_after) rebalancer_.start_check(done, total_steps_);
    show_progress(loop, done, done_lr);
    const bool last = done == total_steps_;
    // As the checkpoint below: a catch-up past an evaluation step evaluates at the step applied.
    if (cfg_.train.eval_every > 0 && done / cfg_.train.eval_every > asked / cfg_.train.eval_every && !last)
      evaluate_at(loop, done);
    // One process stops at once; many agree in the step's reduction (agree_stops_in_steps)
    // or on the step after a log step (every rank saw the flag in rank 0's answer).
    const bool interrupted = executor_->deadline()
                                 ? signalled || (deadline_ended_early_ && !opts_.stop_after)
                                 : stop_all;  // one process's: the flag as read for stop_all, once
    const bool stop = interrupted || stop_after || deadline_stop;
    if (stop && !last && executor_->deadline()) {
      // Every member ends on one chain: the step saved is that chain's, where a catch-up
      // in it moved this rank on (a checkpoint labelled with the step before held a
      // later step's weights).
      // This rank's own stop (a signal, --stop-after); one that reached it from another
      // rank ended its chain in take_deadline already.
      finish_deadline(loop, FinishReason::stop);
      done = executor_->deadline_step();
    }
    if (last) {
      // The training's end: the final outer step under local (the checkpoint's and the
      // evaluation's flush then finds nothing left), not the checkpoint or evaluation.
      if (local_) local_->flush();
      loop.trained_s = seconds_since(loop.t0);
    }
    // A catch-up may have moved past a checkpoint step: the step applied saves it instead.
    if ((cfg_.checkpoint.every > 0 && done / cfg_.checkpoint.every > asked / cfg_.checkpoint.every) || last || stop)
      save(done, progress);
    if (stop && !last) return stopped(loop, done, interrupted);
  }
  return finish(loop);
}

// A resumed run continues the training it resumes: the settings that make it (the model,
// the data, the batch, the seed, the optimiser and its schedule, the precision) must be
// those the run directory's config.json recorded. The length, evaluation, logging,
// checkpoints, parallel settings, guard and device may change. The first difference is
// refused by name, before the recorded config is replaced (a batch size changed on
// resume trained on silently and counted the earlier steps' samples at the new size).
// A config.json that is missing is said on stderr (the checkpoint's own checks still
// apply); one that cannot be read is refused: replacing it would drop the check silently.
void Run::check_resumed_config() const {
  const std::string path = dir_->file("config.json");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    // Nothing of a run there at all (a new or mistyped directory): the restore's warning
    // that training starts at step 0 says it once.
    if (!RunDir::holds_run(cfg_.run.dir)) return;
    std::fprintf(stderr,
                 "hetrain: warning: %s is missing: the resumed config is not compared with the one the run "
                 "was trained with (the checkpoint's own checks still apply)\n",
                 path.c_str());
    return;
  }
  json before;
  try {
    before = json::parse(config::schema::read_document_file(path, "the run's resolved config"));
    if (!before.is_object()) throw std::runtime_error("it holds " + std::string(before.type_name()) + ", not an object");
  } catch (const std::exception& e) {
    throw config::ConfigError("resuming " + cfg_.run.dir + ": " + path + ", the config the run was trained with, " +
                              "cannot be read (" + e.what() + "); expected the resolved config this run wrote "
                              "(remove it to resume without comparing the configs)");
  }
  const json now = json::parse(config::to_json(cfg_));
  const auto differs = [&](const std::string& where, const json& a, const json& b) {
    if (a == b) return;
    throw config::ConfigError("resuming " + cfg_.run.dir + ": " + where + " is " + b.dump() + " but the run was "
                              "trained with " + a.dump() + "; expected the same (a resumed run continues its "
                              "training; start a new run in another directory)");
  };
  const auto section = [&](const char* name) -> json {
    return before.contains(name) ? before[name] : json();
  };
  if (before.contains("model")) differs("model", section("model"), now["model"]);
  if (before.contains("data"))
    for (const auto& [key, value] : before["data"].items())
      if (key != "dir" && now["data"].contains(key)) differs("data." + key, value, now["data"][key]);
  if (before.contains("train"))
    for (const char* key : {"batch_size", "seed", "optimizer", "schedule", "grad_clip", "precision", "loss_scale"})
      if (before["train"].contains(key) && now["train"].contains(key))
        differs(std::string("train.") + key, before["train"][key], now["train"][key]);
}

// Rank 0's: the resolved config, the plan and the metrics log, in the run directory.
void Run::open_run_files(int64_t start, std::optional<report::MetricsLog>& metrics) {
  write_file_atomically(dir_->file("config.json"), config::to_json(cfg_) + "\n", "resolved config");
  if (!opts_.plan_json.empty()) write_file_atomically(dir_->file("plan.json"), opts_.plan_json, "plan");
  metrics.emplace(dir_->file("metrics.jsonl"));
  if (opts_.resume) metrics->write(json{{"type", "resume"}, {"step", start}}.dump());
}

void Run::announce(int64_t start, report::Progress& progress) {
  if (start == 0)
    progress.note("training " + cfg_.name + ": " + std::to_string(total_steps_) + " steps of " +
                  std::to_string(cfg_.train.batch_size) + " samples, " +
                  std::to_string(model_.param_count()) + " parameters" +
                  (multi() ? ", " + std::to_string(world_.size()) + " ranks (" + plan::to_string(plan_.strategy) + ")" : "") +
                  ", run directory " + cfg_.run.dir);
  for (const Fault& f : opts_.faults) {
    progress.note("testing aid: injecting " + f.spec);
    // A resumed run's steps begin after `start`: a fault wholly before them never acts (a
    // slow factor holds from its step on; a stall at 0 is before start-up, any run's).
    bool before = false;
    if (f.kind == FaultKind::nan || f.kind == FaultKind::scale) before = f.at + f.steps - 1 <= start;
    if (f.kind == FaultKind::stall) before = f.at > 0 && f.at <= start;
    if (before && root_)
      std::fprintf(stderr, "hetrain: warning: testing aid %s acts before this run's first step (%lld): it does not act\n",
                   f.spec.c_str(), static_cast<long long>(start + 1));
  }
  // A round longer than the run (a parallel.local_steps set by hand, a short run): the
  // groups take the inner steps of its first job steps and one outer step at the end.
  if (local_ && local_->inner_steps() > total_steps_ - start)
    progress.note("local: a round is " + std::to_string(local_->inner_steps()) + " job steps, more than the " +
                  std::to_string(total_steps_ - start) + " this run takes: it trains one partial round, its outer "
                  "step at the end");
  if (executor_->shares_weights())
    progress.note("weights: the replicas compute with the hub's, in shared memory; only word of an update travels");
  else if (!executor_->why_weights_apart().empty())
    progress.note("weights: sent from the hub to the replicas each step (not shared: " +
                  executor_->why_weights_apart() + ")");
}

void Run::add_spans(StepResult& into, const StepResult& r) {
  if (r.spans.empty()) return;
  if (into.spans.empty()) into.start_s = r.start_s;
  const double shift = r.start_s - into.start_s;
  for (plan::Span s : r.spans) {
    s.start_s += shift;
    s.end_s += shift;
    into.spans.push_back(std::move(s));
  }
}

// This rank's part of job step loop.step. Under deadline the step applied may be a later
// one (after a catch-up): loop.step moves on to it.
StepResult Run::take_step(Loop& loop, float lr, bool trace) {
  StepResult r = local_group_ ? local_step(loop.step, lr, trace)
                              : executor_->step(stream_base_ + loop.step * cfg_.train.batch_size, lr, trace);
  if (r.deadline) loop.step = take_deadline(r, loop);
  if (local_) {  // the outer exchange's time is communication of this step
    const double outer_s = local_->after_step(loop.step + 1, local_group_->group >= 0 ? r.wall_s : 0);
    r.comm_s += outer_s;
    r.wall_s += outer_s;
    if (const std::optional<plan::RoundSplit> s = local_->take_resplit()) take_local_resplit(*s, loop);
  }
  return r;
}

void Run::add_to_window(Loop& loop, const StepResult& r) {
  loop.window.loss_sum += r.loss_sum;
  loop.window.loss_samples += r.loss_samples;
  last_loss_sum_ = r.loss_sum;
  for (const GuardEvent& e : r.guard_events) loop.window.guard.emplace_back(loop.step + 1, e);
  loop.window.compute_s += r.compute_s;
  loop.window.comm_s += r.comm_s;
  loop.window.wall_s += r.wall_s;
  loop.step_walls.push_back(r.wall_s);
  ++loop.window_steps;
}

// A signal's stop, agreed in the step's gradient reduction where that spans every rank
// (Executor::set_stop_request): every rank stops after the step in which some rank was
// signalled (or the next, for a signal after its last gradients left). The log exchange
// agrees only on the step after the next log step, train.log_every steps on (50 by
// default): mpirun kills its ranks 1 s after passing on a Ctrl-C, and the CNN's ranks
// took 2.5-4.7 s to reach that step. Not under local (the executor steps a group). Under
// deadline a signalled rank ends its stage's chain, which ends the others'; on a hybrid
// plan its replica's other stages must stop with it, so their AlignReplica carries it.
void Run::agree_stops_in_steps() {
  if ((multi() && !local_group_ && plan_.sync_policy == plan::SyncPolicy::synchronous) || replica_agrees_stops())
    executor_->set_stop_request([] { return interrupt_signal(); });
}

bool Run::replica_agrees_stops() const {
  return multi() && plan_.sync_policy == plan::SyncPolicy::deadline && plan_.stage_ranges.size() > 1 &&
         plan_.layout.replicas.size() > 1;
}

// The rebalancer's answer to the check of a step before, which applies from the next step.
void Run::apply_rebalance(Loop& loop) {
  auto o = rebalancer_.finish_check(plan_);
  if (!o) return;
  if (o->relayout)
    executor_ = relayout(std::move(executor_), *o->replaced, plan_, model_, *task_, world_, cfg_.train, peer_timeout());
  else if (o->changed) executor_->reshare();
  if (o->relayout && !faults_.empty()) executor_->inject(&faults_);
  if (o->relayout) executor_->set_guard(cfg_.guard);
  if (o->relayout) agree_stops_in_steps();
  if (o->relayout) plan_evaluation();
  if (o->changed) loop.step_walls.clear();  // the measured step is the current shares'
  if (root_) {
    loop.metrics->write(o->record(rebalancer_.check_step()));
    if (o->changed) loop.progress.note(o->line(rebalancer_.check_step()));
  }
}

void Run::show_progress(const Loop& loop, int64_t done, float lr) {
  const double elapsed = seconds_since(loop.t0);
  const double rate = static_cast<double>((done - loop.start) * cfg_.train.batch_size) / elapsed;
  const double eta = static_cast<double>(total_steps_ - done) * elapsed / static_cast<double>(done - loop.start);
  loop.progress.step(done, static_cast<float>(loop.last_loss), lr, rate, eta);
}

// Collective: an evaluation between steps, recorded by rank 0.
void Run::evaluate_at(Loop& loop, int64_t done) {
  std::optional<EvalResult> r = evaluate();
  if (!root_) return;
  loop.metrics->write(eval_record(done, *r));
  loop.progress.note("step " + std::to_string(done) + ": " + r->line);
  // Before this step's checkpoint, which would hold the diverged model.
  check_finite_eval(*r, "training diverged by step " + std::to_string(done), divergence_advice(local_ != nullptr));
}

// After the checkpoint of a stop before the last step: Ctrl-C fails as Interrupted, a
// stop_after ends the run.
TrainSummary Run::stopped(Loop& loop, int64_t done, bool interrupted) {
  loop.progress.finish();
  // The timeline is written at the end of its traced step (or round); a stop before that
  // leaves no file, which is said rather than left for the user to find out.
  if (root_ && !opts_.timeline.empty() && !loop.timeline_written)
    std::fprintf(stderr, "hetrain: note: no timeline written to %s: the run stopped at step %lld, before its traced step %lld ended\n",
                 opts_.timeline.c_str(), static_cast<long long>(done), static_cast<long long>(loop.traced + 1));
  if (interrupted) {
    const int sig = g_interrupted;  // 0 on a rank that stopped on rank 0's word alone
    // Rank 0 alone writes the checkpoint (under deadline of the step every member ended its
    // chain at, this one); the others may get here while it still writes, so they do not
    // say it was saved (a rank 0 stopped in the write left only a .tmp file behind them).
    // A rank that was not signalled stopped on another's word: it says so, rather than
    // that it was interrupted itself, and which signal its status is of.
    const int agreed = stronger_stop(sig, agreed_signal_);
    const std::string how = sig == SIGTERM ? "terminated"
                            : sig != 0     ? "interrupted"
                                           : std::string("stopped with the signalled rank (") +
                                                 (agreed == SIGTERM ? "SIGTERM" : "SIGINT") + ")";
    const std::string what = how + " at step " +
                             std::to_string(done) + " of " + std::to_string(total_steps_) +
                             (root_ ? "; a checkpoint was saved" : "; rank 0 writes the checkpoint of this step") +
                             resume_hint();
    // The shell's status for the signal: 130 for SIGINT, 143 for SIGTERM; on a rank that
    // stopped on another's word, that rank's (where its stop carried the signal).
    const int status = stop_status(agreed);
    // Under deadline too: every member ended its chain at this step (finish_deadline).
    if (multi()) throw InterruptedTogether(what, status);
    throw Interrupted(what, status);
  }
  loop.progress.note("stopped after " + std::to_string(done - loop.start) + " steps at step " +
                     std::to_string(done) + resume_hint());
  return {done, seconds_since(loop.t0), cfg_.run.dir};
}

// Collective, after the last step: the final evaluation and rank 0's summary.
TrainSummary Run::finish(Loop& loop) {
  if (executor_->deadline()) finish_deadline(loop);
  loop.progress.finish();
  std::optional<EvalResult> final_eval = evaluate();
  const double wall = seconds_since(loop.t0);
  if (root_) {
    loop.metrics->write(eval_record(total_steps_, *final_eval));
    loop.progress.note("final (step " + std::to_string(total_steps_) + "): " + final_eval->line);
    check_finite_eval(*final_eval, "training diverged by step " + std::to_string(total_steps_),
                      divergence_advice(local_ != nullptr));
    write_summary(loop.start, wall, loop.trained_s, loop.step_walls, *final_eval);
  }
  return {total_steps_, wall, cfg_.run.dir};
}

}  // namespace trainer_run

void apply_overrides(config::Config& cfg, const TrainOptions& opts) {
  if (opts.steps) {
    HT_CHECK(*opts.steps >= 1, "the steps override ", *opts.steps, " is out of range; expected at least 1");
    cfg.train.steps = *opts.steps;
    cfg.train.epochs.reset();
  }
  HT_CHECK(!opts.stop_after || *opts.stop_after >= 1, "stop_after ", opts.stop_after.value_or(0),
           " is out of range; expected at least 1 step");
  if (opts.seed) cfg.train.seed = *opts.seed;
  if (opts.run_dir) cfg.run.dir = *opts.run_dir;
}

std::string select_run_device(const config::Config& cfg, int world_rank, int world_size, int local_rank) {
  SelectedDevice d = select_device(config::device_of_rank(cfg, world_rank, world_size), local_rank, cfg.train.precision);
  set_run_device(*d.backend);
  return d.note;
}

size_t cap_host_memory(Allocator& a, size_t available) {
  if (a.cap() != 0 || available == 0) return 0;
  const auto cap = static_cast<size_t>(static_cast<double>(available) * (1 - kHostReserve));
  a.set_cap(cap);
  return cap;
}

TrainSummary train(config::Config cfg, const TrainOptions& opts,
                   std::optional<plan::Plan> plan) {
  apply_overrides(cfg, opts);
  // Before anything is made: the task, the model and the optimiser are made on it.
  select_run_device(cfg, comm::world().rank(), comm::world().size(), comm::world().local_rank());
  HT_CHECK(plan || comm::world().size() == 1, "train: ", comm::world().size(),
           " ranks need a plan; expected one from `hetrain plan` or the planner");
  set_thread_count(resolve_thread_count(0, comm::world().local_size()));
  // The config's emulate section and tools/hetero-local's memory cap, as the probe saw them.
  comm::apply_emulation(cfg.emulate, comm::world());
  // One process on the CPU without a plan has nothing that fits its memory: its tensors
  // are capped at what the machine has free now, so that a batch too large for it ends in
  // the out-of-memory error below, not in the kernel's OOM killer (a 100,000-sample batch
  // of the GPT grew to 22 GB and was killed, its new run directory left behind). A GPU's
  // out of memory is its own allocator's, named as such (backend/cuda).
  const size_t host_cap = comm::world().size() == 1 && !plan && run_device().kind() == DeviceKind::cpu
                              ? cap_host_memory(cpu_backend().allocator(), cpu_backend().memory_info().available)
                              : 0;
  // A new run that fails before its first step worth keeping takes its files back (rank 0
  // writes them), so the next try is not refused; a directory that held a run is left be.
  const std::string dir = cfg.run.dir;
  const bool root = comm::world().rank() == 0;
  const bool fresh = root && !opts.resume && !std::filesystem::exists(dir);
  const bool discardable = root && !opts.resume && !RunDir::holds_run(dir);
  const int64_t batch = cfg.train.batch_size, micro_batches = cfg.train.micro_batches;
  const std::string model = cfg.model.type;
  const bool planned = plan.has_value();
  try {
    trainer_run::Run run(std::move(cfg), opts, std::move(plan));
    return run.run();
  } catch (const OutOfMemory& e) {
    if (discardable) RunDir::discard_unused(dir, fresh);
    // Under an emulated cap (HETRAIN_MEMORY_CAP, the config's emulate section), one
    // process without a plan runs the config's micro-batches as they are: nothing fitted
    // them to the cap.
    if (!planned && (host_cap == 0 || cpu_backend().allocator().cap() != host_cap))
      fail("rank 0 ran out of memory training the ", model, " model in ", micro_batches, " micro-batch",
           micro_batches == 1 ? "" : "es", " of ", (batch + micro_batches - 1) / micro_batches, " samples (", e.what(),
           "); one process run without a cluster file or a plan is not fitted to a memory cap: give it a cluster "
           "file to plan with, or raise train.micro_batches");
    if (host_cap == 0 || cpu_backend().allocator().cap() != host_cap) throw;
    fail("rank 0 ran out of host memory training the ", model, " model in batches of ", batch,
         " (train.batch_size): ", e.what(), " (the cap: this machine's available memory at the start, less ",
         static_cast<int>(kHostReserve * 100), "%): lower train.batch_size or the model's size");
  } catch (const std::bad_alloc&) {
    if (discardable) RunDir::discard_unused(dir, fresh);
    // A bare "std::bad_alloc" names nothing the user can change.
    fail("rank ", comm::world().rank(), " ran out of host memory (an allocation failed) training the ", model,
         " model in batches of ", batch, " (train.batch_size); expected the model, its optimiser state and a batch "
         "to fit this machine's memory: lower train.batch_size or the model's size");
  } catch (...) {
    if (discardable) RunDir::discard_unused(dir, fresh);
    throw;
  }
}

}  // namespace ht::runtime
