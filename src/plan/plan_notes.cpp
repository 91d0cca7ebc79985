#include "plan/plan_notes.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "core/stats.h"

namespace ht::plan {

void mark_slow_links(Plan& p, const ClusterModel& c) {
  const size_t n = c.ranks.size();
  if (n < 3 || c.links.size() != n) return;
  std::vector<double> typical(n);
  // Ranks of one site see the same links to every other rank: one median per site.
  std::vector<int> done(c.links.site_count(), -1);  // [site] a rank whose median is known
  for (size_t i = 0; i < n; ++i) {
    int& known = done[c.links.sites()[i]];
    if (known >= 0) {
      typical[i] = typical[static_cast<size_t>(known)];
      continue;
    }
    std::vector<double> t;
    for (size_t j = 0; j < n; ++j)
      if (j != i && c.links.bandwidth(i, j) > 0)
        t.push_back(c.links.latency(i, j) + kSlowLinkProbeBytes / c.links.bandwidth(i, j));
    if (t.empty()) return;
    typical[i] = median(std::move(t));
    known = static_cast<int>(i);
  }
  const double cluster_typical = median(typical);
  if (!(cluster_typical > 0)) return;  // free links: nothing is slower than free by a factor
  for (size_t i = 0; i < n; ++i)
    if (typical[i] > kSlowLinkFactor * cluster_typical) {
      p.ranks[i].slow_link = true;
      p.ranks[i].link_seconds = typical[i];
      p.ranks[i].cluster_link_seconds = cluster_typical;
    }
}

// Who does how much of the step's FLOPs, by device.
PlanNote work_note(const Plan& p, const BlockCosts& costs) {
  std::map<std::string, std::pair<int, double>> by_device;  // label -> (ranks, FLOPs)
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
  PlanNote note;
  note.kind = NoteKind::work_by_device;
  for (const auto& [label, v] : by_device)
    note.work.push_back({label, v.first, total > 0 ? v.second / total : 0});
  // Largest share first; the map's label order breaks ties.
  std::stable_sort(note.work.begin(), note.work.end(),
                   [](const DeviceWork& a, const DeviceWork& b) { return a.fraction > b.fraction; });
  return note;
}

}  // namespace ht::plan
