#include "runtime/run_records.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ht::runtime {

using json = nlohmann::json;

std::string Window::to_text() const {
  return json{{"loss_sum", loss_sum}, {"compute_s", compute_s}, {"comm_s", comm_s},
              {"wall_s", wall_s},     {"interrupted", interrupted}, {"checksum", checksum}}
      .dump();
}

Window Window::from_text(const std::string& text) {
  const json j = json::parse(text);
  return {j["loss_sum"], j["compute_s"], j["comm_s"], j["wall_s"], j["interrupted"], j["checksum"]};
}

std::string train_record(int64_t step, float lr, double loss, const std::vector<Window>& ranks,
                         int64_t steps, int64_t batch_size, double elapsed_s) {
  double wall = 0;
  for (const Window& w : ranks) wall = std::max(wall, w.wall_s);
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

}  // namespace ht::runtime
