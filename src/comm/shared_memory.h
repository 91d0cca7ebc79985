// Memory that the ranks of one host map in common, so that one process's tensors can be
// read by the others where they lie instead of travelling as messages (the
// data-parallel hub's weights, see runtime/executor.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace ht::comm {

// Collective over `comm`: rank `owner` creates `bytes` (> 0) of shared memory, zeroed,
// and every member maps it, read and write; the mapping ends with the last reference.
// Every member gets nullptr instead, with the reason in `*why`, when any member is not
// `willing`, the members are not all on one host, a link of `comm` is emulated (the
// bytes would not cross it), or a member could not create or map the memory. The name
// the memory is opened by is removed before the call returns, so nothing is left behind
// however the job ends. Its exchanges (allgathers) each wait up to `timeout`.
std::shared_ptr<std::byte> map_shared(Communicator& comm, int owner, size_t bytes, bool willing,
                                      Timeout timeout, std::string* why = nullptr);

}  // namespace ht::comm
