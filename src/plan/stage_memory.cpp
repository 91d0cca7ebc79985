#include "plan/stage_memory.h"

#include <algorithm>

#include "core/error.h"
#include "plan/stage_partition.h"

namespace ht::plan {

StageFootprint stage_footprint(const BlockCosts& costs, int begin, int end) {
  HT_CHECK(begin >= 0 && begin < end && static_cast<size_t>(end) <= costs.params.size(),
           "stage_footprint: blocks [", begin, ", ", end, ") outside the model's ",
           costs.params.size(), " blocks");
  StageFootprint f;
  f.optimizer_bytes_per_param = costs.optimizer_bytes_per_param;
  for (auto b = static_cast<size_t>(begin); b < static_cast<size_t>(end); ++b) {
    f.params += costs.params[b];
    f.largest_block_params = std::max(f.largest_block_params, costs.params[b]);
    f.activation_bytes += costs.activation_bytes[b];
    if (b < costs.workspace_bytes.size()) f.workspace_bytes = std::max(f.workspace_bytes, costs.workspace_bytes[b]);
  }
  f.checkpoint_bytes = costs.input_bytes[static_cast<size_t>(begin)];
  return f;
}

MemoryUse stage_memory(const StageFootprint& f, const StageMemoryParams& p) {
  HT_CHECK(p.micro_batch_size >= 1 && p.micro_batches >= 1 && p.optimizer_shard >= 0 &&
               p.optimizer_shard <= 1,
           "stage_memory: micro_batch_size ", p.micro_batch_size, ", micro_batches ",
           p.micro_batches, ", optimizer_shard ", p.optimizer_shard,
           "; expected sizes >= 1 and a shard in [0, 1]");
  MemoryUse m;
  m.params = f.params * kWeightBytesPerParam;
  m.grads = (f.params + (p.micro_batches > 1 ? f.largest_block_params : 0)) * kGradBytesPerParam;
  m.optimizer = f.params * f.optimizer_bytes_per_param * p.optimizer_shard;
  const auto k = static_cast<double>(in_flight_micro_batches(p.stage, p.stages, p.micro_batches));
  const auto mb = static_cast<double>(p.micro_batch_size);
  m.activations = (p.recompute ? k * mb * f.checkpoint_bytes + mb * f.activation_bytes
                               : k * mb * f.activation_bytes) +
                  mb * f.workspace_bytes;
  return m;
}

}  // namespace ht::plan
