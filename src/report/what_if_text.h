// The what-if table `hetrain plan` prints (plan/what_if.h): one row per sync policy, then
// each policy's notes (restarts, joins, refusals).
#pragma once

#include <string>
#include <vector>

#include "plan/what_if.h"

namespace ht::report {

std::string what_if_text(const plan::WhatIfResult& result, const std::vector<plan::WhatIfEvent>& events);

}  // namespace ht::report
