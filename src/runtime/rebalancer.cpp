#include "runtime/rebalancer.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>

#include "core/stats.h"
#include "core/units.h"
#include "plan/rebalance_message.h"

namespace ht::runtime {

using json = nlohmann::json;

Rebalancer::Rebalancer(RebalanceFn decide, int64_t every, comm::Communicator& world, comm::Timeout peer_timeout)
    : decide_(std::move(decide)), every_(decide_ ? every : 0), world_(world), peer_timeout_(peer_timeout) {}

void Rebalancer::record(const StepResult& r) {
  if (skip_next_) {
    skip_next_ = false;
    return;
  }
  window_.work_s.push_back(r.compute_s - r.optimizer_s);
  window_.optimizer_s.push_back(r.optimizer_s);
  window_.wall_s.push_back(r.wall_s);
  window_.reduce_s.push_back(r.reduce_s);
  window_.work_cpu_s.push_back(r.work_cpu_s);
  window_.optimizer_cpu_s.push_back(r.optimizer_cpu_s);
  window_.comm_cpu_s.push_back(r.comm_cpu_s);
  window_.micro_batches.push_back(r.micro_batches);
}

namespace {
std::vector<int64_t> first_ranks(const plan::Plan& p) {
  std::vector<int64_t> ranks;
  for (const auto& replica : p.layout.replicas) ranks.push_back(replica[0]);
  return ranks;
}
}  // namespace

void Rebalancer::start_check(int64_t done, int64_t total) {
  if (every_ <= 0 || done % every_ != 0 || done + 1 >= total) return;
  // Nothing measured since the last change (every 1 or 2: the steps between were the
  // old plan's, and the one after it is not recorded): no check. Judged on nothing, the
  // planner's costs alone re-split the batch back to the probe's split "from measured
  // speeds", and a trial was judged against a step of 0 s. Every rank records the same
  // steps, so all skip alike.
  if (window_.wall_s.empty()) return;
  plan::drop_steps_before_speed_change(window_, static_cast<size_t>(every_));  // the steps since the last check
  HT_CHECK(!pending_, "rebalancer: the check of step ", check_step_, " was not finished before the next");
  answered_.reset();  // taken a check ago
  pending_ = world_.consult(plan::encode_measure(window_));
  check_step_ = done;
}

std::optional<Rebalancer::Outcome> Rebalancer::finish_check(plan::Plan& plan) {
  if (!pending_) return std::nullopt;
  // Rank 0 decides; every rank takes its decision (plan::encode_decision).
  std::vector<plan::RankMeasure> measured;  // rank 0's only
  const std::string decision = pending_->finish([&](const std::vector<std::string>& items) {
    for (size_t k = 0; k < items.size(); ++k)
      measured.push_back(plan::decode_measure(items[k], "the measures of rank " + std::to_string(k)));
    return plan::encode_decision(decide_(plan, measured));
  }, peer_timeout_, "the rebalancing check of step " + std::to_string(check_step_));
  plan::Rebalance d = plan::decode_decision(decision, plan, "the rebalancing decision from rank 0");
  answered_ = std::move(pending_);
  Outcome out;
  out.changed = d.changed;
  out.reverted = d.reverted;
  out.relayout = d.relayout;
  out.measured_step_s = d.measured_step_s;
  out.before_predicted_step_s = d.current_step_s;
  out.trial_s_per_sample = std::move(d.trial_seconds_per_sample);
  out.before = plan.layout.samples;
  out.micro_before = plan.layout.micro_batches;
  out.ranks_before = first_ranks(plan);
  for (size_t k = 0; k < measured.size(); ++k) {
    const plan::RankPlan& rp = plan.ranks[k];
    out.seconds_per_sample.push_back(
        rp.replica < 0 || measured[k].work_s.empty()
            ? 0.0
            : median(measured[k].work_s) / static_cast<double>(out.before[static_cast<size_t>(rp.replica)]));
    out.comm_cpu_s.push_back(measured[k].comm_cpu_s.empty() ? 0.0 : median(measured[k].comm_cpu_s));
  }
  if (out.relayout) out.replaced = plan;
  plan = std::move(d.plan);
  out.after = plan.layout.samples;
  out.micro_after = plan.layout.micro_batches;
  out.ranks_after = first_ranks(plan);
  out.predicted_step_s = plan.predicted.step_seconds;
  out.trial_started = out.changed && !plan.layout.alternate_micro_batches.empty();
  if (out.changed) {  // the step since the check ran the plan before
    skip_next_ = true;
    window_ = {};
  } else {  // the same plan: the next check's medians take in this window's steps too
    const auto keep = static_cast<size_t>(kWindowChecks * every_);
    for (std::vector<double>* v : plan::measure_series(window_))
      if (v->size() > keep) v->erase(v->begin(), v->end() - static_cast<std::ptrdiff_t>(keep));
  }
  return out;
}

std::string Rebalancer::Outcome::record(int64_t step) const {
  json j{{"type", "rebalance"},
              {"step", step},
              {"changed", changed},
              {"reverted", reverted},
              {"relayout", relayout},
              {"shares_before", before},
              {"shares", after},
              {"micro_batches_before", micro_before},
              {"micro_batches", micro_after},
              {"ranks_before", ranks_before},
              {"ranks", ranks_after},
              {"measured_step_s", measured_step_s},
              {"calibrated_step_s", before_predicted_step_s},
              {"predicted_step_s", predicted_step_s},
              {"measured_s_per_sample", seconds_per_sample},
              {"comm_cpu_s", comm_cpu_s}};
  if (!trial_s_per_sample.empty()) {
    j["trial"] = reverted ? "undone" : "kept";
    j["trial_s_per_sample"] = trial_s_per_sample;  // the count before, the count tried
  }
  if (trial_started) j["trial_started"] = true;  // the next one, at the same check as a verdict
  return j.dump();
}

std::string Rebalancer::Outcome::line(int64_t step) const {
  const std::string at = "step " + std::to_string(step) + ": ";
  auto counts = [](const std::vector<int>& m) { return join(std::vector<int64_t>(m.begin(), m.end()), "/"); };
  std::string judged;
  if (trial_s_per_sample.size() == 2) {
    auto per = [](double s) {
      char b[48];
      std::snprintf(b, sizeof b, "%.3f ms a sample", s * 1e3);
      return s > 0 ? std::string(b) : std::string("too few steps");
    };
    judged = (reverted ? "back to micro-batches " + counts(micro_after) : "keeping micro-batches " + counts(micro_before)) +
             " (" + per(trial_s_per_sample[1]) + " in the steps of the count tried against " +
             per(trial_s_per_sample[0]) + " in the others)";
    if (before == after && !trial_started) return at + judged + ", shares " + join(after, "/");
    judged += "; ";
  }
  if (trial_started)
    return at + judged + "trying micro-batches " + counts(micro_after) + " in every other step against " +
           counts(micro_before) + " (a call's size changes the time per sample), shares " + join(after, "/");
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.2f ms", predicted_step_s * 1e3);
  const std::string what =
      relayout ? (reverted ? "back to ranks " + join(ranks_after) + " (the measured step got slower on ranks " +
                                 join(ranks_before) + "): shares "
                           : "trying the ranks left idle, training on ranks " + join(ranks_after) + ": shares ")
               : (reverted ? "undid the last rebalancing (the measured step got slower): shares "
                           : "rebalanced the replicas' shares from measured speeds: ");
  return at + judged + what + join(before, "/") + " -> " + join(after, "/") + ", predicted step " + ms;
}

}  // namespace ht::runtime
