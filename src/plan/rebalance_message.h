// The messages of a rebalancing check (runtime/rebalancer.h): each rank's measures go to
// rank 0, and rank 0's decision comes back to every rank. The plan layer owns their
// encoding, as it owns the plan file's, so the runtime only carries bytes.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/rebalance.h"

namespace ht::plan {

// Every per-step series of a measure, in the order they travel.
std::array<std::vector<double>*, 8> measure_series(RankMeasure& m);

std::string encode_measure(const RankMeasure& m);
// Throws ht::Error naming `source` when the text is not a measure.
RankMeasure decode_measure(const std::string& text, const std::string& source);

// A changed plan travels whole, so that every rank orders its communication by the same
// estimates; otherwise only the calibrated prediction.
std::string encode_decision(const Rebalance& r);
// The decision with `plan` set to the plan to run next: the one sent when changed, else
// `current` with the sent prediction.
Rebalance decode_decision(const std::string& text, const Plan& current, const std::string& source);

}  // namespace ht::plan
