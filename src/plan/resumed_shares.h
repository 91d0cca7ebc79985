// The shares a running job steps by, carried in its checkpoints so that a resumed job
// starts from them (runtime/trainer_checkpoints.cpp writes them, the train command reads
// them): rebalancing moves a job's shares off its plan's as it measures, and a resume
// from the plan's would have the checks find them again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace ht::plan {

// JSON text: {"layout": {"world", "replicas", "stages"}, "samples": [...],
// "micro_batches": [...]}, one share and micro-batch count per replica as `plan` steps
// by them; a replica in a micro-batch trial at the count it had before the trial (the
// tried one is not judged yet).
std::string shares_metadata(const Plan& plan);

struct ResumedShares {
  std::vector<int64_t> samples;  // per replica of the plan read for
  std::vector<int> micro_batches;
};

// `text` (shares_metadata's) for `plan`: where its world and stages are the plan's and
// each of its replicas is one of the plan's, the shares and counts in the plan's replica
// order (a new probe may order equal ranks otherwise: the shares follow the ranks).
// Errors (ht::Error, naming why): malformed text; another world, stages or replicas; a
// share outside 1 to the global batch or a count outside 1 to its share. Whether they
// fit is with_resumed_shares' (plan/rebalance.h).
ResumedShares shares_for_plan(const Plan& plan, const std::string& text);

}  // namespace ht::plan
