#include "plan/resumed_shares.h"

#include "config/json_schema.h"
#include "core/error.h"

namespace ht::plan {

namespace sc = config::schema;
using sc::Json;

namespace {

Json layout_of(const Plan& plan) {
  return Json{{"world", plan.world_size}, {"replicas", plan.layout.replicas}, {"stages", plan.stage_ranges}};
}

}  // namespace

std::string shares_metadata(const Plan& plan) {
  std::vector<int> micro = plan.layout.micro_batches;
  const std::vector<int>& before = plan.layout.alternate_micro_batches;
  for (size_t r = 0; r < before.size() && r < micro.size(); ++r)
    if (before[r] > 0) micro[r] = before[r];
  return Json{{"layout", layout_of(plan)}, {"samples", plan.layout.samples}, {"micro_batches", micro}}.dump();
}

ResumedShares shares_for_plan(const Plan& plan, const std::string& text) {
  // parse_document bounds the nesting: a layout nested 70,000 deep once crashed the
  // note that printed it.
  const Json j = sc::parse_document(text, "metadata 'shares'");
  sc::expect_object(j, "shares", "an object");
  const Json& layout = sc::require(j, "shares", "layout", "the layout the shares are of");
  sc::expect_object(layout, "shares.layout", "an object");
  const Json mine = layout_of(plan);
  const size_t n = plan.layout.replicas.size();
  HT_CHECK(sc::require(layout, "shares.layout", "world", "a world size") == mine["world"] &&
               sc::require(layout, "shares.layout", "stages", "the stages' blocks") == mine["stages"],
           "it is of another world or other stages than this plan's ", plan.world_size, " ranks in ",
           plan.stage_ranges.size(), " stages");
  const Json& replicas = sc::require(layout, "shares.layout", "replicas", "the replicas' ranks");
  const Json& samples = sc::require(j, "shares", "samples", "a share per replica");
  const Json& micro = sc::require(j, "shares", "micro_batches", "a micro-batch count per replica");
  HT_CHECK(replicas.is_array() && samples.is_array() && micro.is_array() && replicas.size() == n &&
               samples.size() == n && micro.size() == n,
           "it is not of ", n, " replicas, each with a share and a micro-batch count, as this plan is");
  ResumedShares out;
  for (size_t r = 0; r < n; ++r) {
    size_t k = 0;
    while (k < n && replicas[k] != mine["replicas"][r]) ++k;
    HT_CHECK(k < n, "its replicas are not this plan's (this plan's replica ", r, ", ranks ",
             mine["replicas"][r].dump(), ", is none of them)");
    const int64_t share =
        sc::read_int(samples[k], sc::index_path("shares.samples", k), 1, plan.global_batch);
    out.samples.push_back(share);
    out.micro_batches.push_back(
        static_cast<int>(sc::read_int(micro[k], sc::index_path("shares.micro_batches", k), 1, share)));
  }
  return out;
}

}  // namespace ht::plan
