#include "report/local_sync_text.h"

#include <cstdio>

#include "core/units.h"

namespace ht::report {

std::string local_sync_text(const plan::Plan& plan) {
  if (!plan.local) return "";
  const plan::LocalSync& l = *plan.local;
  std::string out = "sync: local (DiLoCo), " + std::to_string(l.groups.size()) +
                    (l.groups.size() == 1 ? " group" : " groups that step on their own") + ":\n";
  for (size_t g = 0; g < l.groups.size(); ++g) {
    std::vector<int64_t> ranks, shares;
    for (int r : l.groups[g]) {
      for (int rank : plan.layout.replicas[static_cast<size_t>(r)]) ranks.push_back(rank);
      shares.push_back(plan.layout.samples[static_cast<size_t>(r)]);
    }
    const int64_t n = l.round_samples[g], h = l.group_steps[g];
    const std::string size = n % h == 0 ? std::to_string(n / h) : std::to_string(n / h) + "-" + std::to_string(n / h + 1);
    out += "  group " + std::to_string(g) + ": rank" + (ranks.size() > 1 ? "s " : " ") + join(ranks) + ", " +
           std::to_string(n) + " of a round's " + std::to_string(l.inner_steps * plan.global_batch) + " samples in " +
           std::to_string(h) + " inner step" + (h > 1 ? "s" : "") + " of " + size +
           (shares.size() > 1 ? " (nominal split " + join(shares, "/") + ")" : "") + "\n";
  }
  char line[400];
  const std::string lands = l.outer_delay >= l.inner_steps
                                ? std::string("at its end")
                                : std::to_string(l.outer_delay) + " step" + (l.outer_delay > 1 ? "s" : "") + " into it";
  if (l.groups.size() == 1)
    std::snprintf(line, sizeof line,
                  "  every %d steps (global batches) its delta is exchanged while the next round runs and taken as "
                  "it is %s (one group: outer_lr and outer_momentum act between groups): predicted exchange %s "
                  "against %s\n",
                  l.inner_steps, lands.c_str(), format_seconds(l.outer_exchange_seconds).c_str(),
                  format_seconds(l.outer_delay * plan.predicted.step_seconds).c_str());
  else
    std::snprintf(line, sizeof line,
                  "  every %d steps (global batches) the groups' deltas are exchanged while the next round runs, "
                  "and their outer step (Nesterov) lands %s: predicted exchange %s against %s\n",
                  l.inner_steps, lands.c_str(), format_seconds(l.outer_exchange_seconds).c_str(),
                  format_seconds(l.outer_delay * plan.predicted.step_seconds).c_str());
  out += line;
  std::snprintf(line, sizeof line, "  predicted step %s, %.0f samples/s: %.2fx the best synchronous plan (step %s)\n",
                format_seconds(plan.predicted.step_seconds).c_str(), plan.predicted.samples_per_s, l.gain,
                format_seconds(l.sync_step_seconds).c_str());
  out += line;
  return out;
}

}  // namespace ht::report
