// Rank 0's record of the run as a whole: summary.json after the last step, and the one
// step's measured timeline (Chrome trace) that --timeline asks for.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/clock_sync.h"
#include "core/stats.h"
#include "report/trace.h"
#include "runtime/atomic_file.h"
#include "runtime/trainer_run.h"

namespace ht::runtime::trainer_run {

namespace {
using json = nlohmann::json;
}  // namespace

// Collective. Every rank's spans of the traced step on rank 0's clock, from the step's
// earliest start on any rank: the ranks start a step at different moments (in data
// parallelism rank 0 first, the others when its weights reach them), which the trace
// shows. The title gives how closely the clocks are aligned.
void Run::write_timeline(const StepResult& step) {
  constexpr int kClockRounds = 8;
  const std::vector<comm::ClockOffset> clocks = comm::clock_offsets(world_, kClockRounds, peer_timeout());
  json spans = json::array();
  for (const report::Span& s : step.spans)
    spans.push_back({s.name, s.category, s.start_s, s.end_s, s.micro_batch, s.stage});
  const std::vector<std::string> all = world_.allgather(json{step.start_s, spans}.dump(), peer_timeout(), "the timeline's spans");
  if (!root_) return;
  std::vector<json> ranks;
  double first = std::numeric_limits<double>::infinity(), error = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    ranks.push_back(json::parse(all[r]));
    if (ranks[r][1].empty()) continue;  // an idle rank
    first = std::min(first, ranks[r][0].get<double>() + clocks[r].offset_s);
    error = std::max(error, clocks[r].error_s);
  }
  std::vector<report::Span> merged;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const double shift = ranks[r][0].get<double>() + clocks[r].offset_s - first;
    for (const json& e : ranks[r][1])
      merged.push_back({static_cast<int>(r), e[0], e[1], e[2].get<double>() + shift, e[3].get<double>() + shift,
                        e[4], e[5]});
  }
  char aligned[64];
  std::snprintf(aligned, sizeof aligned, "ranks' clocks aligned within %.1f us", error * 1e6);
  write_file_atomically(
      opts_.timeline,
      report::to_chrome_trace(merged, "hetrain train " + cfg_.name + " (measured; " + aligned + ")"), "timeline");
}


void Run::write_summary(int64_t start, double wall, double trained, const std::vector<double>& step_walls,
                        const EvalResult& final_eval) {
  // Samples/s counts the samples that entered a gradient: a deadline step's dropped shares
  // and the guard's exclusions were drawn from the stream but trained nothing.
  int64_t trained_samples = (total_steps_ - start) * cfg_.train.batch_size - guard_totals_.samples;
  if (executor_->deadline()) trained_samples += deadline_log_.stale_samples() - deadline_log_.samples_dropped();
  json summary = {{"config", cfg_.name},
                  {"steps", total_steps_},
                  {"samples", total_steps_ * cfg_.train.batch_size},
                  {"steps_this_run", total_steps_ - start},
                  {"resumed_from_step", opts_.resume ? json(start) : json(nullptr)},
                  {"wall_s", wall},
                  {"train_s", trained},
                  {"samples_trained_this_run", trained_samples},
                  {"mean_samples_per_s", static_cast<double>(trained_samples) / wall},
                  {"final", json::object()}};
  for (const auto& [k, v] : final_eval.metrics) summary["final"][k] = v;
  summary["guard"] = {{"steps_with_exclusions", guard_totals_.steps.size()},
                      {"samples_excluded", guard_totals_.samples},
                      {"quarantined_ranks", guard_totals_.quarantined}};
  if (const DynamicLossScale* ls = executor_->loss_scale())  // rank 0's (under local, its group's)
    summary["loss_scale"] = {{"final", ls->scale()}, {"overflow_steps", ls->overflow_steps()}};
  if (multi()) {
    summary["ranks"] = world_.size();
    summary["strategy"] = plan::to_string(plan_.strategy);
    summary["planned_step_s"] = planned_step_s_;
    summary["predicted_step_s"] = plan_.predicted.step_seconds;
    summary["shares"] = plan_.layout.samples;
    std::vector<int64_t> rank_shares;  // the final plan's, per rank (0: idle)
    for (const plan::RankPlan& rp : plan_.ranks)
      rank_shares.push_back(rp.replica >= 0 ? plan_.layout.samples[static_cast<size_t>(rp.replica)] : 0);
    summary["rank_shares"] = rank_shares;
    summary["shared_weights"] = executor_->shares_weights();  // rank 0's stage
    std::vector<int64_t> eval_chunks(static_cast<size_t>(world_.size()), 0);  // each evaluation's, per rank
    if (eval_parts_.empty()) eval_chunks[0] = task_->eval_chunks();
    for (size_t r = 0; r + 1 < eval_parts_.size(); ++r) eval_chunks[r] = eval_parts_[r + 1] - eval_parts_[r];
    summary["eval_chunks"] = eval_chunks;
    // Over windows of 10 steps: under a CPU quota one step runs in a burst and the next
    // waits out the period, so single steps scatter in two groups and their median (7.0
    // ms for the MLP's 0.8 rank) missed its mean (6.4 ms). Under local, whole rounds
    // (step_window).
    summary["measured_step_s"] =
        median_window_mean(step_walls, step_window(local_ ? static_cast<size_t>(local_->inner_steps()) : 1));
    if (executor_->deadline()) {
      summary["sync_policy"] = "deadline";
      summary["deadline"] = json::parse(deadline_log_.summary());
    }
    if (local_) {
      summary["sync_policy"] = "local";
      summary["groups"] = plan_.local->groups;
      summary["inner_steps"] = local_->inner_steps();
      summary["group_steps"] = plan_.local->group_steps;
      summary["round_samples"] = plan_.local->round_samples;
      summary["outer_steps"] = local_->outer_steps();
      // Rank 0 is a member of the exchange, and every member took the same path.
      summary["outer_exchange"] = local_->shared_exchange() ? "shared memory" : "messages";
    }
  }
  write_file_atomically(dir_->file("summary.json"), summary.dump(2) + "\n", "summary");
}

}  // namespace ht::runtime::trainer_run
