// Turns the config's `emulate` section, and the per-rank memory cap that
// tools/hetero-local exports as HETRAIN_MEMORY_CAP, into link delays on a communicator
// and a cap on the engine's allocator.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"

namespace ht::comm {

// Applies to this process; returns what is emulated for this rank, in words (empty when
// nothing is). A rank outside the job is a config::ConfigError naming the entry.
std::vector<std::string> apply_emulation(const config::EmulateConfig& e, Communicator& comm);

}  // namespace ht::comm
