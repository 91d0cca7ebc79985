// What a plan tells people besides its layout: ranks whose links are far slower than
// the rest (a note in the table; no sync policy acts on it), and who does how much of
// the work.
#pragma once

#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan.h"

namespace ht::plan {

// A rank is marked slow_link when its typical (median) transfer of a 1 MiB message
// takes this many times the cluster's typical one.
inline constexpr double kSlowLinkFactor = 4;
inline constexpr double kSlowLinkProbeBytes = 1 << 20;

// Sets slow_link and the two typical transfer times on such ranks (clusters of 3 ranks
// or more: with two, there is no majority to compare against).
void mark_slow_links(Plan& plan, const ClusterModel& cluster);

// Each device's share of the step's forward FLOPs (samples x FLOPs of its blocks), as a
// work_by_device note.
PlanNote work_note(const Plan& plan, const BlockCosts& costs);

}  // namespace ht::plan
