// The trainer's run (runtime/trainer.h): one object whose parts live in files by what each
// owns:
//   trainer.cpp              construction, the step loop and the dispatch of each step
//   trainer_sync.cpp         the glue to parallel.sync local and deadline
//   trainer_logs.cpp         the log steps' exchange with rank 0 and the guard's reports
//   trainer_evaluation.cpp   evaluation and the check that it fits rank 0's memory
//   trainer_checkpoints.cpp  checkpoint metadata, save and resume, evaluate_checkpoint
//   trainer_summary.cpp      the run summary and the measured timeline
// Internal to src/runtime: only those files include it.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/stop_signal.h"
#include "optim/lr_schedule.h"
#include "plan/plan.h"
#include "report/metrics_log.h"
#include "report/progress.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/deadline_sync.h"
#include "runtime/executor.h"
#include "runtime/fault_injection.h"
#include "runtime/local_sync.h"
#include "runtime/rebalancer.h"
#include "runtime/run_dir.h"
#include "runtime/run_records.h"
#include "runtime/task.h"
#include "runtime/trainer.h"

namespace ht::runtime::trainer_run {

using Clock = std::chrono::steady_clock;

// The signal that asked this rank to stop since the run started (SIGINT, SIGTERM; 0:
// none; trainer.cpp's handler sets it).
int interrupt_signal();

class Run {
 public:
  Run(config::Config cfg, const TrainOptions& opts, std::optional<plan::Plan> plan);
  TrainSummary run();

 private:
  // A log step's windows on their way to rank 0 (Communicator::consult).
  struct PendingLog {
    std::unique_ptr<comm::Consultation> consult;
    int64_t done = 0, steps = 0;
    float lr = 0;
    double elapsed_s = 0;  // at the log step
    int64_t outer_steps = 0;  // under local, at the log step (its record may be written later)
    double loss_scale = 0;    // rank 0's dynamic loss scale at the log step (0: none)
  };

  // run()'s state over the steps. Destroyed in reverse order, the pending consultations
  // first: on rank 0 destroying one waits for the others to take its answer.
  struct Loop {
    Loop(report::Progress& progress, std::optional<report::MetricsLog>& metrics, int64_t start, int64_t traced)
        : progress(progress), metrics(metrics), start(start), step(start), traced(traced) {}
    report::Progress& progress;
    std::optional<report::MetricsLog>& metrics;  // rank 0's
    const int64_t start;                         // the first step of this invocation
    Clock::time_point t0 = Clock::now();
    Window window;  // this rank's, since the last log step
    int64_t window_steps = 0;
    int64_t step;                     // the step being taken (0-based)
    double last_loss = std::nan("");  // many ranks know it only at log steps
    std::vector<double> step_walls;   // since the shares last changed
    std::deque<PendingLog> pending_logs;
    const int64_t traced;  // the step whose timeline is written: past the warm-up
    // Under local the traced step's whole round (a group takes its inner steps spread over
    // it, none in most job steps): its steps' spans, on the first's clock.
    StepResult trace;
    bool timeline_written = false;
    // Since t0, when the last step was done (under local with its final outer step),
    // before the final checkpoint and evaluation; 0 until then.
    double trained_s = 0;
  };

  // trainer.cpp: the loop's parts, in the order it runs them.
  void open_run_files(int64_t start, std::optional<report::MetricsLog>& metrics);
  void announce(int64_t start, report::Progress& progress);
  StepResult take_step(Loop& loop, float lr, bool trace);
  // Adds `r`'s spans to `into`, shifted onto `into`'s clock (its first spans' start).
  static void add_spans(StepResult& into, const StepResult& r);
  void add_to_window(Loop& loop, const StepResult& r);
  void apply_rebalance(Loop& loop);
  void agree_stops_in_steps();  // see trainer.cpp
  void show_progress(const Loop& loop, int64_t done, float lr);
  void log_line(const Loop& loop, int64_t done, float lr, double elapsed_s, double rate = -1) const;
  void check_resumed_config() const;
  void evaluate_at(Loop& loop, int64_t done);
  TrainSummary stopped(Loop& loop, int64_t done, bool interrupted);
  TrainSummary finish(Loop& loop);
  bool multi() const { return world_.size() > 1; }
  // The bound on every wait on another rank: past it the job ends naming who and what.
  comm::Timeout peer_timeout() const { return comm::Timeout(cfg_.parallel.peer_timeout_s); }
  std::string resume_hint() const { return opts_.resume_hint.empty() ? "" : "; " + opts_.resume_hint; }

  // trainer_sync.cpp: parallel.sync local and deadline.
  StepResult local_step(int64_t step, float lr, bool trace);
  std::vector<nn::NamedTensor> local_inner_state();
  bool local_meets(int64_t done) const;
  void take_local_resplit(const plan::RoundSplit& split, Loop& loop);
  void start_deadline(int64_t start, report::Progress& progress);
  int64_t take_deadline(StepResult& r, Loop& loop);
  void resume_local_split(const Checkpoint& loaded, const std::string& text);
  // A hybrid plan under deadline: a signal's stop is agreed per replica (AlignReplica).
  bool replica_agrees_stops() const;
  void write_deadline_record(const comm::StepRecord& rec, std::optional<report::MetricsLog>& metrics,
                             report::Progress& progress);
  using FinishReason = comm::DeadlineReduce::FinishReason;
  void finish_deadline(Loop& loop, FinishReason why = FinishReason::end);
  void end_deadline_chain(Loop& loop, FinishReason why);  // the deadline reduction's finish, once

  // trainer_logs.cpp: the log steps' exchange.
  bool finish_due_logs(Loop& loop, int64_t done, bool stop_after);
  bool log_step(Loop& loop, int64_t asked, int64_t done, float lr, bool final_step);
  bool finish_logs(Loop& loop, int64_t upto, int64_t done, int64_t act_upto);
  bool finish_log(Loop& loop, PendingLog& p);
  std::string with_sync_policy(const std::string& record, int64_t outer_steps, double loss_scale) const;
  void report_guard(int64_t step, const GuardEvent& e, std::optional<report::MetricsLog>& metrics);
  double check_loss(double loss_sum, int64_t samples, int64_t done) const;

  // trainer_evaluation.cpp
  std::string evaluation_misfit();
  void share_evaluation();
  std::vector<double> eval_weights() const;
  void plan_evaluation();
  std::optional<EvalResult> evaluate();

  // trainer_checkpoints.cpp
  std::map<std::string, std::string> metadata(int64_t step);
  std::string guard_layout() const;
  void save(int64_t step, report::Progress& progress);
  int64_t restore(report::Progress& progress);

  // trainer_summary.cpp
  void write_timeline(const StepResult& step);
  void write_summary(int64_t start, double wall, double trained, const std::vector<double>& step_walls,
                     const EvalResult& final_eval);

  config::Config cfg_;
  TrainOptions opts_;
  comm::Communicator& world_;
  bool root_;
  std::unique_ptr<Task> task_;  // loads the data first: a missing dataset creates no run dir
  std::optional<RunDir> dir_;   // rank 0's
  nn::Sequential model_;        // every block on every rank, each trains its stage's, which
                                // alone sit on its device; in a pipeline the other blocks'
                                // weights are released (Tensor::release) except on rank 0
  plan::Plan plan_;
  std::unique_ptr<LocalGroup> local_group_;  // under parallel.sync local: this rank's group
  std::unique_ptr<Executor> executor_;  // owns this rank's optimiser
  std::unique_ptr<LocalSync> local_;    // under local: the outer weights and their exchange
  Rebalancer rebalancer_;       // moves plan_'s shares while training
  double planned_step_s_;       // the plan's prediction before any measurement
  CheckpointDir checkpoints_;
  // Finished consultations, by their log step, kept until every rank has taken the
  // answer (see Consultation): without local until the next log step; under local until
  // an outer step proves every rank past the round end where they were finished.
  std::deque<std::pair<int64_t, std::unique_ptr<comm::Consultation>>> answered_logs_;
  std::deque<int64_t> stops_;  // log steps whose answer said stop, not yet acted on (finish_logs)
  int64_t total_steps_ = 0;
  int64_t stream_base_ = 0;  // stream position of step 0's first sample
  optim::LrSchedule schedule_;
  FaultInjector faults_;  // --inject's, for this rank
  DeadlineLog deadline_log_;  // under parallel.sync deadline
  std::vector<int64_t> deadline_shares_;  // the replicas' shares as rank 0's records last set them
  bool deadline_agreed_ = false;  // this rank's deadline reduction has ended on one chain
  // Under deadline: a member ended the chain before the last step (it was interrupted:
  // its finish caught this rank up to where it ended), so the job stops there.
  bool deadline_ended_early_ = false;
  // The signal of a stop agreed with the other ranks (core/stop_signal.h): a rank that
  // stops on another's word exits with that rank's status.
  int agreed_signal_ = 0;
  // The held-out set's chunks each world rank evaluates: [eval_parts_[r], eval_parts_[r +
  // 1]); empty where rank 0 evaluates alone (share_evaluation).
  std::vector<int64_t> eval_parts_;
  std::vector<bool> eval_able_;  // per world rank: could evaluate a part when the job started
  // Those ranks' and rank 0's communicator (in world-rank order), on them alone: a rank
  // left out (behind a slow link, say) takes no part in an evaluation's exchange.
  std::unique_ptr<comm::Communicator> eval_comm_;
  double last_loss_sum_ = 0;  // this rank's, of the last step
  report::Progress* progress_ = nullptr;  // run()'s, for the guard's lines
  struct {
    std::set<int64_t> steps;  // with a contribution left out
    int64_t samples = 0;      // left out, summed over steps (stage 0's count)
    std::set<int> quarantined;
  } guard_totals_;
};

}  // namespace ht::runtime::trainer_run
