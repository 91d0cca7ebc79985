// The lines `hetrain plan` shows for a plan under parallel.sync local: the groups, their
// shares, H and the predicted gain over the best synchronous plan.
#pragma once

#include <string>

#include "plan/plan.h"

namespace ht::report {

// Empty for a plan that is not local.
std::string local_sync_text(const plan::Plan& plan);

}  // namespace ht::report
