#include "plan/plan_json.h"

#include <cmath>

#include "config/json_schema.h"
#include "core/error.h"
#include "plan/local_plan.h"
#include "plan/plan_facts_json.h"
#include "plan/plan_json_fields.h"

namespace ht::plan {

using namespace config::schema;
using namespace json_fields;

namespace {

// Rows of non-negative ints (groups of replicas, replicas of ranks), each bounded to an int.
std::vector<std::vector<int>> int_rows(const Json& v, const std::string& path) {
  return list<std::vector<int>>(v, path, [](const Json& row, const std::string& q) { return int_list(row, q, 0); });
}

Json local_json(const LocalSync& l) {
  return {{"groups", l.groups},
          {"inner_steps", l.inner_steps},
          {"group_steps", l.group_steps},
          {"round_samples", l.round_samples},
          {"outer_delay", l.outer_delay},
          {"round_align", l.round_align},
          {"outer_exchange_seconds", l.outer_exchange_seconds},
          {"sync_step_seconds", l.sync_step_seconds},
          {"gain", l.gain}};
}

LocalSync read_local(const Json& j, const std::string& p) {
  LocalSync l;
  l.groups = int_rows(array(j, p, "groups"), key_path(p, "groups"));
  l.inner_steps = read_int32(at(j, p, "inner_steps"), key_path(p, "inner_steps"), 1);
  l.group_steps = int_list(array(j, p, "group_steps"), key_path(p, "group_steps"), 1);
  // A file without it (written before groups took samples by speed) means whole global
  // batches: H_g of them (plan_from_json fills that in, knowing the batch).
  if (j.contains("round_samples"))
    l.round_samples = list<int64_t>(array(j, p, "round_samples"), key_path(p, "round_samples"),
                                    [](const Json& x, const std::string& q) { return read_int(x, q, 1); });
  // Without it the outer step lands at the next round's end.
  l.outer_delay = j.contains("outer_delay")
                      ? read_int32(at(j, p, "outer_delay"), key_path(p, "outer_delay"), 1)
                      : l.inner_steps;
  // Without it no round was aligned (what it says to people alone).
  if (j.contains("round_align")) {
    l.round_align = read_int(at(j, p, "round_align"), key_path(p, "round_align"), 0);
    if (l.round_align % l.inner_steps != 0)
      fail_at(key_path(p, "round_align"), std::to_string(l.round_align) + " is not a multiple of inner_steps " +
                                              std::to_string(l.inner_steps) +
                                              "; expected 0 or the steps between evaluations that H divides");
  }
  l.outer_exchange_seconds = nonneg(j, p, "outer_exchange_seconds");
  l.sync_step_seconds = nonneg(j, p, "sync_step_seconds");
  l.gain = nonneg(j, p, "gain");
  return l;
}

Json prediction_json(const Prediction& p) {
  return {{"step_seconds", p.step_seconds},
          {"samples_per_s", p.samples_per_s},
          {"bubble_fraction", p.bubble_fraction}};
}

Json layout_json(const PipelineLayout& l) {
  Json j{{"replicas", l.replicas},
          {"samples", l.samples},
          {"micro_batches", l.micro_batches},
          {"activation_bytes", l.activation_bytes},
          {"recompute", l.recompute},
          {"forward_seconds", l.forward_seconds},
          {"backward_seconds", l.backward_seconds},
          {"reduce_owner", l.reduce_owner}};
  if (!l.alternate_micro_batches.empty()) j["alternate_micro_batches"] = l.alternate_micro_batches;
  return j;
}

Json device_json(const DeviceModel& d) {
  Json j{{"id", d.id},       {"name", d.name},
         {"kind", to_string(d.kind)},   {"flops", d.flops},
         {"memory_bytes", d.memory_bytes},
         {"memory_bandwidth", d.memory_bandwidth},
         {"measured", d.measured}};
  if (d.host_memory_bytes > 0) {
    j["host"] = d.host;
    j["host_memory_bytes"] = d.host_memory_bytes;
  }
  if (d.device_in_host) j["device_in_host"] = true;
  if (d.gradient_bandwidth > 0) j["gradient_bandwidth"] = d.gradient_bandwidth;
  return j;
}

Json rank_json(const RankPlan& r) {
  return {{"rank", r.rank},
          {"device", device_json(r.device)},
          {"replica", r.replica},
          {"stage", r.stage},
          {"blocks", {r.block_begin, r.block_end}},
          {"samples", r.samples},
          {"micro_batches", r.micro_batches},
          {"micro_batch_size", r.micro_batch_size},
          {"recompute", r.recompute},
          {"optimizer_shard", r.optimizer_shard},
          {"memory_strategies", memory_strategies_json(r.memory_strategies)},
          {"memory_steps", memory_steps_json(r.memory_steps)},
          {"memory", {{"params", r.memory.params},
                      {"grads", r.memory.grads},
                      {"optimizer", r.memory.optimizer},
                      {"activations", r.memory.activations}}},
          {"host_memory", host_use_json(r.host)},
          {"busy_fraction", r.busy_fraction},
          {"slow_link", r.slow_link},
          {"link_seconds", r.link_seconds},
          {"cluster_link_seconds", r.cluster_link_seconds}};
}

// --- reading: every field through the schema helpers, so errors carry the JSON path ---

std::vector<std::vector<double>> matrix(const Json& obj, const std::string& path, const char* key) {
  return list<std::vector<double>>(array(obj, path, key), key_path(path, key),
                                   [](const Json& row, const std::string& p) {
                                     return list<double>(row, p, [](const Json& x, const std::string& q) {
                                       return read_double(x, q, Range::at_least(0));
                                     });
                                   });
}

PipelineLayout read_layout(const Json& j, const std::string& p) {
  PipelineLayout l;
  l.replicas = int_rows(array(j, p, "replicas"), key_path(p, "replicas"));
  l.samples = read_int_array(array(j, p, "samples"), key_path(p, "samples"), 1);
  // The schedules are built from these counts before anything else is cross-checked, so
  // they are bounded here: at most one micro-batch per sample, and no more than
  // kMaxMicroBatches (a plan file asking for 10^9 would otherwise allocate schedules
  // until memory runs out).
  l.micro_batches = list<int>(array(j, p, "micro_batches"), key_path(p, "micro_batches"),
                              [](const Json& x, const std::string& q) {
                                const int64_t n = read_int(x, q, 1);
                                if (n > kMaxMicroBatches)
                                  fail_at(q, std::to_string(n) + " micro-batches; expected at most " +
                                                 std::to_string(kMaxMicroBatches));
                                return static_cast<int>(n);
                              });
  for (size_t r = 0; r < l.micro_batches.size() && r < l.samples.size(); ++r)
    if (l.micro_batches[r] > l.samples[r])
      fail_at(index_path(key_path(p, "micro_batches"), r),
              std::to_string(l.micro_batches[r]) + " micro-batches for " + std::to_string(l.samples[r]) +
                  " samples; expected at most one micro-batch per sample");
  l.activation_bytes = read_int_array(array(j, p, "activation_bytes"), key_path(p, "activation_bytes"), 0);
  l.recompute = list<std::vector<bool>>(array(j, p, "recompute"), key_path(p, "recompute"),
                                        [](const Json& row, const std::string& q) {
                                          return list<bool>(row, q, [](const Json& x, const std::string& r) { return read_bool(x, r); });
                                        });
  l.forward_seconds = matrix(j, p, "forward_seconds");
  l.backward_seconds = matrix(j, p, "backward_seconds");
  if (j.contains("reduce_owner")) {  // absent in plans from before it existed
    const int64_t owner = read_int(j.at("reduce_owner"), key_path(p, "reduce_owner"), -1);
    HT_CHECK(owner < static_cast<int64_t>(l.replicas.size()), key_path(p, "reduce_owner"), " is ", owner,
             "; expected -1 (parts in proportion to the shares) or a replica, 0 to ", l.replicas.size() - 1);
    l.reduce_owner = static_cast<int>(owner);
  }
  if (j.contains("alternate_micro_batches"))  // only while a micro-batch trial runs
    l.alternate_micro_batches =
        int_list(array(j, p, "alternate_micro_batches"), key_path(p, "alternate_micro_batches"), 0);
  return l;
}

Prediction read_prediction(const Json& j, const std::string& p) {
  return {nonneg(j, p, "step_seconds"), nonneg(j, p, "samples_per_s"), nonneg(j, p, "bubble_fraction")};
}

std::vector<std::pair<int, int>> read_ranges(const Json& j, const std::string& p) {
  return list<std::pair<int, int>>(j, p, [](const Json& r, const std::string& q) {
    const std::vector<int> v = int_list(r, q, 0);
    if (v.size() != 2) fail_at(q, show(r) + " is not a [begin, end) pair; expected two block indices");
    return std::pair<int, int>(v[0], v[1]);
  });
}

RankPlan read_rank(const Json& j, const std::string& p) {
  RankPlan r;
  r.rank = integer(j, p, "rank", 0);
  const std::string dp = key_path(p, "device");
  const Json& d = at(j, p, "device");
  r.device.id = text(d, dp, "id");
  r.device.name = text(d, dp, "name");
  r.device.kind =
      *parse_device_kind(read_enum(at(d, dp, "kind"), key_path(dp, "kind"), device_kind_names()));
  r.device.flops = nonneg(d, dp, "flops");
  r.device.memory_bytes = nonneg(d, dp, "memory_bytes");
  r.device.memory_bandwidth = nonneg(d, dp, "memory_bandwidth");
  r.device.measured = read_bool(at(d, dp, "measured"), key_path(dp, "measured"));
  // Optional: plan files from before the host check have neither.
  if (d.contains("host_memory_bytes")) {
    r.device.host = text(d, dp, "host");
    r.device.host_memory_bytes = nonneg(d, dp, "host_memory_bytes");
  }
  r.device.device_in_host = d.contains("device_in_host") && read_bool(d.at("device_in_host"), key_path(dp, "device_in_host"));
  if (d.contains("gradient_bandwidth")) r.device.gradient_bandwidth = nonneg(d, dp, "gradient_bandwidth");  // optional
  r.replica = integer(j, p, "replica", -1);
  r.stage = integer(j, p, "stage", -1);
  const auto blocks = read_ranges(Json::array({at(j, p, "blocks")}), key_path(p, "blocks"));
  std::tie(r.block_begin, r.block_end) = blocks[0];
  r.samples = read_int(at(j, p, "samples"), key_path(p, "samples"), 0);
  r.micro_batches = integer(j, p, "micro_batches", 1);
  // At least one sample a micro-batch where the rank has samples (a rank left idle has none).
  r.micro_batch_size = read_int(at(j, p, "micro_batch_size"), key_path(p, "micro_batch_size"), r.samples > 0 ? 1 : 0);
  r.recompute = read_bool(at(j, p, "recompute"), key_path(p, "recompute"));
  r.optimizer_shard = read_double(at(j, p, "optimizer_shard"), key_path(p, "optimizer_shard"), Range{0, 1});
  r.memory_strategies = read_memory_strategies(array(j, p, "memory_strategies"), key_path(p, "memory_strategies"));
  r.memory_steps = read_memory_steps(array(j, p, "memory_steps"), key_path(p, "memory_steps"));
  const std::string mp = key_path(p, "memory");
  const Json& m = at(j, p, "memory");
  r.memory = {nonneg(m, mp, "params"), nonneg(m, mp, "grads"), nonneg(m, mp, "optimizer"),
              nonneg(m, mp, "activations")};
  if (j.contains("host_memory")) r.host = read_host_use(j.at("host_memory"), key_path(p, "host_memory"));
  r.busy_fraction = read_double(at(j, p, "busy_fraction"), key_path(p, "busy_fraction"), Range{0, 1});
  r.slow_link = read_bool(at(j, p, "slow_link"), key_path(p, "slow_link"));
  r.link_seconds = nonneg(j, p, "link_seconds");
  r.cluster_link_seconds = nonneg(j, p, "cluster_link_seconds");
  return r;
}

}  // namespace

std::string plan_to_json(const Plan& p) {
  Json ranks = Json::array();
  for (const RankPlan& r : p.ranks) ranks.push_back(rank_json(r));
  Json doc{{"format", kPlanFormat},
           {"config", {{"name", p.config_name}, {"hash", p.config_hash}}},
           {"cluster", p.cluster_source},
           {"world_size", p.world_size},
           {"blocks", p.blocks},
           {"global_batch", p.global_batch},
           {"strategy", to_string(p.strategy)},
           {"sync_policy", to_string(p.sync_policy)},
           {"stage_ranges", p.stage_ranges},
           {"layout", layout_json(p.layout)},
           {"ranks", ranks},
           {"predicted", prediction_json(p.predicted)},
           {"baseline", {{"fits", p.baseline.fits},
                         {"shortfalls", shortfalls_json(p.baseline.shortfalls)},
                         {"predicted", prediction_json(p.baseline.predicted)},
                         {"stage_ranges", p.baseline.stage_ranges},
                         {"layout", layout_json(p.baseline.layout)}}},
           {"speedup", p.speedup},
           {"notes", notes_json(p.notes)},
           {"candidates", p.candidates}};
  if (p.local) doc["local"] = local_json(*p.local);
  return doc.dump(1) + "\n";
}

Plan plan_from_json(const std::string& text_in, const std::string& source) {
  try {
    const Json j = parse_document(text_in, source);
    expect_object(j, "(top level)", std::string("a plan file (") + kPlanFormat + ")");
    const Json& format = at(j, "", "format");
    for (const char* old : kOldPlanFormats)
      if (format == old)
        fail_at("format", show(format) + " is an older plan format; expected \"" + kPlanFormat +
                              "\": make the plan again with `hetrain plan`");
    read_enum(format, "format", {kPlanFormat});
    Plan p;
    const Json& cfg = at(j, "", "config");
    p.config_name = text(cfg, "config", "name");
    p.config_hash = text(cfg, "config", "hash");
    p.cluster_source = text(j, "", "cluster");
    p.world_size = integer(j, "", "world_size", 1);
    p.blocks = integer(j, "", "blocks", 1);
    p.global_batch = read_int(at(j, "", "global_batch"), "global_batch", 1);
    p.strategy = *parse_strategy(read_enum(at(j, "", "strategy"), "strategy", strategy_names()));
    p.sync_policy = *parse_sync_policy(read_enum(at(j, "", "sync_policy"), "sync_policy", sync_policy_names()));
    if (p.sync_policy == SyncPolicy::local) p.local = read_local(at(j, "", "local"), "local");
    if (p.local && p.local->round_samples.empty())
      for (int h : p.local->group_steps) p.local->round_samples.push_back(h * p.global_batch);
    p.stage_ranges = read_ranges(array(j, "", "stage_ranges"), "stage_ranges");
    p.layout = read_layout(at(j, "", "layout"), "layout");
    p.ranks = list<RankPlan>(array(j, "", "ranks"), "ranks", read_rank);
    p.predicted = read_prediction(at(j, "", "predicted"), "predicted");
    const Json& b = at(j, "", "baseline");
    p.baseline.fits = read_bool(at(b, "baseline", "fits"), "baseline.fits");
    p.baseline.shortfalls = read_shortfalls(array(b, "baseline", "shortfalls"), "baseline.shortfalls");
    p.baseline.predicted = read_prediction(at(b, "baseline", "predicted"), "baseline.predicted");
    p.baseline.stage_ranges = read_ranges(array(b, "baseline", "stage_ranges"), "baseline.stage_ranges");
    p.baseline.layout = read_layout(at(b, "baseline", "layout"), "baseline.layout");
    p.speedup = nonneg(j, "", "speedup");
    p.notes = read_notes(array(j, "", "notes"), "notes");
    p.candidates = integer(j, "", "candidates", 0);
    check_plan(p);
    return p;
  } catch (const config::ConfigError& e) {
    const std::string what = e.what();
    throw config::ConfigError(what.rfind(source, 0) == 0 ? what : source + ": " + what);
  } catch (const Error& e) {
    throw config::ConfigError(source + ": not a consistent plan: " + e.what());
  }
}

std::optional<RoundSplit> read_local_split(const std::string& text, const Plan& plan) {
  HT_CHECK(plan.local, "read_local_split: the plan has no local groups");
  const std::string p = "local.split";
  const Json j = parse_document(text, p);
  expect_object(j, p, "the split's groups, inner_steps, group_steps and round_samples");
  const auto groups = int_rows(array(j, p, "groups"), key_path(p, "groups"));
  const int64_t inner_steps = read_int(at(j, p, "inner_steps"), key_path(p, "inner_steps"), 1);
  if (groups != plan.local->groups || inner_steps != plan.local->inner_steps) return std::nullopt;
  RoundSplit split;
  split.steps = int_list(array(j, p, "group_steps"), key_path(p, "group_steps"), 1);
  split.samples = read_int_array(array(j, p, "round_samples"), key_path(p, "round_samples"), 1);
  return split;
}

Plan read_plan(const std::string& path) {
  const std::string text = config::schema::read_document_file(path, std::string("a plan file (") + kPlanFormat + ")");
  return plan_from_json(text, path);
}

void check_plan(const Plan& p) {
  HT_CHECK(static_cast<int>(p.ranks.size()) == p.world_size, "the plan has ", p.ranks.size(),
           " ranks but world_size ", p.world_size);
  const size_t stages = p.stage_ranges.size();
  HT_CHECK(stages >= 1, "the plan has no stages");
  int next = 0;
  for (size_t s = 0; s < stages; ++s) {
    const auto [b, e] = p.stage_ranges[s];
    HT_CHECK(b == next && e > b, "stage_ranges[", s, "] = [", b, ", ", e, "); expected it to start at block ",
             next, " and hold at least one block");
    next = e;
  }
  HT_CHECK(next == p.blocks, "stage_ranges cover blocks [0, ", next, ") but the model has ", p.blocks);
  // A plan file trains: at least one replica (plan_schedules lets an empty layout through
  // for the idle rank's own plan that local sync makes in memory, never in a file).
  HT_CHECK(!p.layout.replicas.empty() && !p.layout.replicas[0].empty(), "layout.replicas ",
           p.layout.replicas.empty() ? "is empty" : "holds a replica of no stages",
           "; expected at least one replica of one stage or more");
  // Before the schedules are built from them: those index each replica by stage (a file
  // whose stage_ranges had more stages than its replicas ended in a segfault).
  for (size_t r = 0; r < p.layout.replicas.size(); ++r)
    HT_CHECK(p.layout.replicas[r].size() == stages, "layout.replicas[", r, "] has ", p.layout.replicas[r].size(),
             " stages but stage_ranges has ", stages, "; expected every replica to hold one rank per stage");
  const std::vector<Schedule> schedules = plan_schedules(p);  // validates the layout
  const std::vector<int>& alternate = p.layout.alternate_micro_batches;
  HT_CHECK(alternate.empty() || alternate.size() == p.layout.replicas.size(), "the layout has ",
           alternate.size(), " alternate_micro_batches for ", p.layout.replicas.size(), " replicas");
  for (size_t r = 0; r < alternate.size(); ++r)
    HT_CHECK(alternate[r] <= p.layout.samples[r], "replica ", r, " alternates with ", alternate[r],
             " micro-batches but has ", p.layout.samples[r], " samples; expected 0 (none) to ", p.layout.samples[r]);
  int64_t total = 0;
  for (int64_t n : p.layout.samples)
    HT_CHECK(!__builtin_add_overflow(total, n, &total), "the replicas' samples sum past 2^63; ",
             "expected them to sum to global_batch ", p.global_batch);
  // Under local each group's replicas take the global batch (check_local_plan).
  HT_CHECK(p.local || total == p.global_batch, "the replicas' samples sum to ", total, " but global_batch is ",
           p.global_batch);
  for (size_t k = 0; k < p.ranks.size(); ++k) {
    const RankPlan& r = p.ranks[k];
    HT_CHECK(r.rank == static_cast<int>(k), "ranks[", k, "] has rank ", r.rank, "; expected ", k);
    if (r.replica < 0) {
      HT_CHECK(schedules[k].empty(), "rank ", k, " has no replica but a schedule");
      continue;
    }
    HT_CHECK(static_cast<size_t>(r.replica) < p.layout.replicas.size() &&
                 r.stage >= 0 && static_cast<size_t>(r.stage) < stages &&
                 p.layout.replicas[r.replica][r.stage] == r.rank,
             "rank ", k, " says replica ", r.replica, " stage ", r.stage,
             " but the layout does not place it there");
    HT_CHECK(r.block_begin == p.stage_ranges[r.stage].first && r.block_end == p.stage_ranges[r.stage].second,
             "rank ", k, " holds blocks [", r.block_begin, ", ", r.block_end, ") but its stage ",
             r.stage, " is [", p.stage_ranges[r.stage].first, ", ", p.stage_ranges[r.stage].second, ")");
    HT_CHECK(r.samples == p.layout.samples[r.replica] && r.micro_batches == p.layout.micro_batches[r.replica],
             "rank ", k, " has ", r.samples, " samples in ", r.micro_batches,
             " micro-batches but its replica has ", p.layout.samples[r.replica], " in ",
             p.layout.micro_batches[r.replica]);
    const bool recompute = !p.layout.recompute.empty() && p.layout.recompute[r.replica][r.stage];
    HT_CHECK(r.recompute == recompute, "rank ", k, " recompute ", r.recompute, " disagrees with the layout");
  }
  for (size_t s = 0; s < stages; ++s) {
    const std::vector<double> shards = optimizer_shards(p, s);
    double total = 0;
    for (double f : shards) total += f;
    HT_CHECK(shards.empty() || std::fabs(total - 1) < 1e-6, "stage ", s, "'s ranks keep optimizer_shard ",
             "fractions that sum to ", total, "; expected 1 when a stage's optimizer state is sharded");
  }
  const ScheduleReport report = check_schedules(schedules);
  HT_CHECK(report.ok, "its schedules fail the check: ", report.problem);
  HT_CHECK((p.sync_policy == SyncPolicy::local) == p.local.has_value(), "sync_policy ", to_string(p.sync_policy),
           p.local ? " with" : " without", " local groups; expected groups exactly under local");
  if (p.local) check_local_plan(p);
}

}  // namespace ht::plan
