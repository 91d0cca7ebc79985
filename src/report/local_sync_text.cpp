#include "report/local_sync_text.h"

#include <cstdio>

#include "core/units.h"

namespace ht::report {

namespace {

// "41, 17, 6" as they come, a run of equal values as "8x41": a group of hundreds of
// replicas was one value each.
std::string join_counts(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[i]) ++j;
    out += (out.empty() ? "" : ", ") + (j > i ? std::to_string(j - i + 1) + "x" : std::string()) + std::to_string(v[i]);
    i = j + 1;
  }
  return out;
}

struct GroupLine {
  std::vector<int> ranks;
  std::string rest;  // everything after the ranks
};

}  // namespace

std::string local_sync_text(const plan::Plan& plan) {
  if (!plan.local) return "";
  const plan::LocalSync& l = *plan.local;
  std::string out = "sync: local (DiLoCo), " + std::to_string(l.groups.size()) +
                    (l.groups.size() == 1 ? " group" : " groups that step on their own") + ":\n";
  std::vector<GroupLine> lines;
  for (size_t g = 0; g < l.groups.size(); ++g) {
    GroupLine line;
    std::vector<int64_t> shares;
    for (int r : l.groups[g]) {
      for (int rank : plan.layout.replicas[static_cast<size_t>(r)]) line.ranks.push_back(rank);
      shares.push_back(plan.layout.samples[static_cast<size_t>(r)]);
    }
    const int64_t n = l.round_samples[g], h = l.group_steps[g];
    const std::string size = n % h == 0 ? std::to_string(n / h) : std::to_string(n / h) + "-" + std::to_string(n / h + 1);
    line.rest = std::to_string(n) + " of a round's " + std::to_string(l.inner_steps * plan.global_batch) +
                " samples in " + std::to_string(h) + " inner step" + (h > 1 ? "s" : "") + " of " + size +
                (shares.size() > 1 ? " (nominal split " + join_counts(shares) + ")" : "");
    lines.push_back(std::move(line));
  }
  // Consecutive groups of one rank each that read alike share a line ("groups 0-255:
  // ranks 256-511, one each"): at 1,024 ranks the section was 896 lines.
  for (size_t g = 0; g < lines.size();) {
    size_t e = g + 1;
    if (lines[g].ranks.size() == 1)
      while (e < lines.size() && lines[e].ranks.size() == 1 && lines[e].rest == lines[g].rest) ++e;
    if (e - g >= 2) {
      std::vector<int> groups, ranks;
      for (size_t k = g; k < e; ++k) groups.push_back(static_cast<int>(k)), ranks.push_back(lines[k].ranks[0]);
      out += "  groups " + join_ranks(groups) + ": ranks " + join_ranks(ranks) + ", one each, each " + lines[g].rest + "\n";
    } else {
      out += "  group " + std::to_string(g) + ": rank" + (lines[g].ranks.size() > 1 ? "s " : " ") +
             join_ranks(lines[g].ranks) + ", " + lines[g].rest + "\n";
    }
    g = e;
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
  if (l.round_align > 0) {
    std::snprintf(line, sizeof line,
                  "  a round ends at each of the run's evaluations and checkpoints (every %lld steps), where the groups meet "
                  "anyway: none cuts a round short\n",
                  static_cast<long long>(l.round_align));
    out += line;
  }
  std::snprintf(line, sizeof line, "  predicted step %s, %.0f samples/s: %.2fx the best synchronous plan (step %s)\n",
                format_seconds(plan.predicted.step_seconds).c_str(), plan.predicted.samples_per_s, l.gain,
                format_seconds(l.sync_step_seconds).c_str());
  out += line;
  return out;
}

}  // namespace ht::report
