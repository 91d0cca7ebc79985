#include "plan/rebalance_message.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan/plan_json.h"

namespace ht::plan {

using json = nlohmann::json;

std::array<std::vector<double>*, 8> measure_series(RankMeasure& m) {
  return {&m.work_s,     &m.optimizer_s,     &m.wall_s,     &m.reduce_s,
          &m.work_cpu_s, &m.optimizer_cpu_s, &m.comm_cpu_s, &m.micro_batches};
}

std::string encode_measure(const RankMeasure& m) {
  RankMeasure copy = m;
  json out = json::array();
  for (const std::vector<double>* v : measure_series(copy)) out.push_back(*v);
  return out.dump();
}

RankMeasure decode_measure(const std::string& text, const std::string& source) {
  RankMeasure m;
  try {
    const json j = json::parse(text);
    HT_CHECK(j.is_array() && j.size() == measure_series(m).size(), source, ": a measure of ",
             j.is_array() ? j.size() : 0, " series; expected ", measure_series(m).size());
    size_t i = 0;
    for (std::vector<double>* v : measure_series(m)) *v = j[i++].get<std::vector<double>>();
  } catch (const json::exception& e) {
    fail(source, ": not a measure (", e.what(), ")");
  }
  return m;
}

std::string encode_decision(const Rebalance& r) {
  json d{{"changed", r.changed},
         {"reverted", r.reverted},
         {"relayout", r.relayout},
         {"measured_step_s", r.measured_step_s},
         {"current_step_s", r.current_step_s},
         {"trial_s_per_sample", r.trial_seconds_per_sample},
         {"predicted", {r.plan.predicted.step_seconds, r.plan.predicted.samples_per_s,
                        r.plan.predicted.bubble_fraction}}};
  if (r.changed) d["plan"] = plan_to_json(r.plan);
  return d.dump();
}

Rebalance decode_decision(const std::string& text, const Plan& current, const std::string& source) {
  Rebalance r;
  try {
    const json d = json::parse(text);
    r.changed = d.at("changed").get<bool>();
    r.reverted = d.at("reverted").get<bool>();
    r.relayout = d.at("relayout").get<bool>();
    r.measured_step_s = d.at("measured_step_s").get<double>();
    r.current_step_s = d.at("current_step_s").get<double>();
    r.trial_seconds_per_sample = d.at("trial_s_per_sample").get<std::vector<double>>();
    r.plan = r.changed ? plan_from_json(d.at("plan").get<std::string>(), source) : current;
    const json& predicted = d.at("predicted");
    r.plan.predicted.step_seconds = predicted.at(0).get<double>();
    r.plan.predicted.samples_per_s = predicted.at(1).get<double>();
    r.plan.predicted.bubble_fraction = predicted.at(2).get<double>();
  } catch (const json::exception& e) {
    fail(source, ": not a rebalancing decision (", e.what(), ")");
  }
  return r;
}

}  // namespace ht::plan
