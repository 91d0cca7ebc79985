#include "plan/plan_notes.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "core/stats.h"
#include "core/units.h"

namespace ht::plan {

void mark_slow_links(Plan& p, const ClusterModel& c) {
  const size_t n = c.ranks.size();
  if (n < 3 || c.latency_s.size() != n) return;
  std::vector<double> typical(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> t;
    for (size_t j = 0; j < n; ++j)
      if (j != i && c.bandwidth_bytes_per_s[i][j] > 0)
        t.push_back(c.latency_s[i][j] + kSlowLinkProbeBytes / c.bandwidth_bytes_per_s[i][j]);
    if (t.empty()) return;
    typical[i] = median(std::move(t));
  }
  const double cluster_typical = median(typical);
  if (!(cluster_typical > 0)) return;  // free links: nothing is slower than free by a factor
  for (size_t i = 0; i < n; ++i)
    if (typical[i] > kSlowLinkFactor * cluster_typical) {
      p.ranks[i].slow_link = true;
      p.ranks[i].link_note = "a 1 MiB message to its typical peer takes " + format_seconds(typical[i]) +
                             ", " + std::to_string(static_cast<int>(typical[i] / cluster_typical)) +
                             "x the cluster's typical " + format_seconds(cluster_typical);
    }
}

// Who does how much of the step's FLOPs, by device.
std::string work_note(const Plan& p, const BlockCosts& costs) {
  std::map<std::string, std::pair<int, double>> by_device;  // id -> (ranks, FLOPs)
  double total = 0;
  for (const RankPlan& rp : p.ranks) {
    if (rp.replica < 0) continue;
    const double flops = static_cast<double>(rp.samples) *
                         std::accumulate(costs.flops.begin() + rp.block_begin,
                                         costs.flops.begin() + rp.block_end, 0.0);
    auto& [ranks, work] = by_device[rp.device.label()];
    ++ranks;
    work += flops;
    total += flops;
  }
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [id, v] : by_device) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s (%d rank%s) %.1f%%", id.c_str(), v.first,
                  v.first == 1 ? "" : "s", total > 0 ? 100 * v.second / total : 0);
    rows.emplace_back(-v.second, buf);
  }
  std::sort(rows.begin(), rows.end());
  std::string out = "work per step by device:";
  for (size_t i = 0; i < rows.size(); ++i) out += (i ? ", " : " ") + rows[i].second;
  return out;
}

}  // namespace ht::plan
