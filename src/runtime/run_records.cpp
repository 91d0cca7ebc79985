#include "runtime/run_records.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ht::runtime {

using json = nlohmann::json;

std::string Window::to_text() const {
  json events = json::array();
  for (const auto& [step, e] : guard)
    events.push_back({step, e.rank, e.stage, static_cast<int>(e.verdict), e.samples, e.quarantine_steps});
  return json{{"loss_sum", loss_sum}, {"loss_samples", loss_samples}, {"compute_s", compute_s}, {"comm_s", comm_s},
              {"wall_s", wall_s},     {"stop_signal", stop_signal}, {"checksum", checksum},
              {"guard", events}}
      .dump();
}

Window Window::from_text(const std::string& text) {
  const json j = json::parse(text);
  Window w{j["loss_sum"], j["compute_s"], j["comm_s"], j["wall_s"], j["loss_samples"], j["stop_signal"], j["checksum"], {}};
  for (const json& e : j.value("guard", json::array()))
    w.guard.emplace_back(e[0].get<int64_t>(), GuardEvent{e[1], e[2], static_cast<Verdict>(e[3].get<int>()), e[4], e[5]});
  return w;
}

double window_wall_s(const std::vector<Window>& ranks) {
  double wall = 0;
  for (const Window& w : ranks) wall = std::max(wall, w.wall_s);
  return wall;
}

std::string train_record(int64_t step, float lr, double loss, const std::vector<Window>& ranks,
                         int64_t steps, int64_t batch_size, double elapsed_s) {
  const double wall = window_wall_s(ranks);
  json j{{"type", "train"},
         {"step", step},
         {"loss", loss},
         {"lr", lr},
         {"samples_per_s", static_cast<double>(steps * batch_size) / wall},
         {"wall_s", elapsed_s}};
  if (ranks.size() > 1) {
    json per_rank = json::array();
    for (const Window& w : ranks)
      per_rank.push_back({{"compute_s", w.compute_s},
                          {"comm_s", w.comm_s},
                          {"idle_s", std::max(0.0, wall - w.compute_s - w.comm_s)}});
    j["ranks"] = per_rank;
  }
  return j.dump();
}

std::string eval_record(int64_t step, const EvalResult& r) {
  json j = {{"type", "eval"}, {"step", step}};
  for (const auto& [k, v] : r.metrics) j[k] = v;
  return j.dump();
}

std::string divergence_advice(bool local) {
  return local ? "lower train.optimizer.lr or parallel.outer_lr, or set train.grad_clip"
               : "lower train.optimizer.lr or set train.grad_clip";
}

void check_finite_eval(const EvalResult& r, const std::string& what, const std::string& advice) {
  for (const auto& [k, v] : r.metrics)
    HT_CHECK(std::isfinite(v), what, ": the model's ", k, " on the held-out data is ", v,
             "; expected a finite value (the model diverged: ", advice, ")");
}

}  // namespace ht::runtime
