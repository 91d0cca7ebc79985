#include "plan/plan.h"

#include <algorithm>

#include "core/enum_names.h"
#include "core/error.h"
#include "plan/deadline_plan.h"

namespace ht::plan {

namespace {
constexpr EnumName<Strategy> kStrategyNames[] = {{Strategy::data, "data"},
                                                 {Strategy::pipeline, "pipeline"},
                                                 {Strategy::hybrid, "hybrid"},
                                                 {Strategy::equal, "equal"}};
}  // namespace

const char* to_string(Strategy s) { return enum_name(s, kStrategyNames); }
std::vector<std::string> strategy_names() { return enum_names(kStrategyNames); }
std::optional<Strategy> parse_strategy(std::string_view s) { return enum_from_name(s, kStrategyNames); }

namespace {
constexpr EnumName<SyncPolicy> kSyncPolicyNames[] = {
    {SyncPolicy::synchronous, "synchronous"}, {SyncPolicy::deadline, "deadline"}, {SyncPolicy::local, "local"}};
}  // namespace

const char* to_string(SyncPolicy s) { return enum_name(s, kSyncPolicyNames); }
std::vector<std::string> sync_policy_names() { return enum_names(kSyncPolicyNames); }
std::optional<SyncPolicy> parse_sync_policy(std::string_view s) { return enum_from_name(s, kSyncPolicyNames); }

std::vector<Schedule> plan_schedules(const Plan& plan, bool trial, const std::vector<bool>& shared_weights) {
  // Every rank idle (an idle rank's own plan under parallel.sync local): nothing to run.
  if (plan.layout.replicas.empty()) return std::vector<Schedule>(static_cast<size_t>(plan.world_size));
  const PipelineLayout layout = trial ? trial_layout(plan.layout) : plan.layout;
  std::vector<Schedule> schedules = build_1f1b(layout, plan.world_size);
  std::vector<WeightSync> sync(plan.stage_ranges.size(), WeightSync::own);
  for (size_t s = 0; s < sync.size(); ++s)
    if (!optimizer_shards(plan, s).empty())
      sync[s] = s < shared_weights.size() && shared_weights[s] ? WeightSync::share : WeightSync::gather;
  add_weight_sync(schedules, layout, sync);
  if (plan.sync_policy == SyncPolicy::deadline) add_deadline_sync(schedules, layout);
  return schedules;
}

bool has_idle_ranks(const Plan& plan) {
  return std::any_of(plan.ranks.begin(), plan.ranks.end(), [](const RankPlan& r) { return r.replica < 0; });
}

std::vector<double> optimizer_shards(const Plan& plan, size_t stage) {
  std::vector<double> shards;
  bool sharded = false;
  for (const auto& replica : plan.layout.replicas) {
    const double f = plan.ranks[static_cast<size_t>(replica[stage])].optimizer_shard;
    sharded = sharded || f < 1;
    shards.push_back(f);
  }
  if (!sharded) shards.clear();
  return shards;
}

bool replicates_whole_model(const Plan& plan) {
  return plan.stage_ranges.size() == 1 && optimizer_shards(plan, 0).empty();
}

bool hub_steps_optimizer(const Plan& plan) {
  const int hub = plan.layout.reduce_owner;
  if (hub < 0) return false;
  for (size_t r = 0; r < plan.layout.replicas.size(); ++r)
    for (int rank : plan.layout.replicas[r])
      if (plan.ranks[static_cast<size_t>(rank)].optimizer_shard != (static_cast<int>(r) == hub ? 1 : 0)) return false;
  return true;
}

void set_hub_steps_optimizer(Plan& plan, bool on) {
  const int hub = plan.layout.reduce_owner;
  HT_CHECK(!on || hub >= 0, "set_hub_steps_optimizer: the plan has no hub (reduce_owner ", hub, ")");
  for (size_t r = 0; r < plan.layout.replicas.size(); ++r)
    for (int rank : plan.layout.replicas[r])
      plan.ranks[static_cast<size_t>(rank)].optimizer_shard = !on || static_cast<int>(r) == hub ? 1 : 0;
}

std::vector<double> stage_reduce_parts(const Plan& plan, const PipelineLayout& layout, size_t stage) {
  std::vector<double> shards = optimizer_shards(plan, stage);
  return shards.empty() ? reduce_parts(layout) : shards;
}

}  // namespace ht::plan
