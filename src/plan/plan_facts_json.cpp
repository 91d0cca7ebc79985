#include "plan/plan_facts_json.h"

#include <limits>

#include "plan/plan_json_fields.h"

namespace ht::plan {

using namespace config::schema;
using namespace json_fields;

namespace {

Json memory_json(const MemoryUse& m) {
  return {{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer}, {"activations", m.activations}};
}

MemoryUse read_memory(const Json& m, const std::string& p) {
  return {nonneg(m, p, "params"), nonneg(m, p, "grads"), nonneg(m, p, "optimizer"), nonneg(m, p, "activations")};
}

}  // namespace

Json host_use_json(const HostUse& h) {
  return {{"other_weights", h.other_weights},
          {"checkpoint_state", h.checkpoint_state},
          {"outer_state", h.outer_state},
          {"device", h.device}};
}

HostUse read_host_use(const Json& h, const std::string& p) {
  return {nonneg(h, p, "other_weights"), nonneg(h, p, "checkpoint_state"), nonneg(h, p, "outer_state"),
          nonneg(h, p, "device")};
}

namespace {

// Readers for walk(): each stores one field.
Field number_field(const char* key, double& out, std::vector<std::string> only_for = {}) {
  return {key, std::move(only_for), [&out](const Json& v, const std::string& p) {
            out = read_double(v, p, Range::at_least(0));
          }};
}
template <class Int>
Field int_field(const char* key, Int& out, int64_t min, std::vector<std::string> only_for = {}) {
  return {key, std::move(only_for), [&out, min](const Json& v, const std::string& p) {
            const int64_t x = read_int(v, p, min);
            if (x > (int64_t{1} << 31)) fail_at(p, std::to_string(x) + " is out of range; expected at most 2^31");
            out = static_cast<Int>(x);
          }};
}
Field kind_field() {
  return {"kind", {}, [](const Json&, const std::string&) {}};  // read before the walk
}

// The object's "kind", checked against `names`, and the object's path.
std::string kind_of(const Json& o, const std::string& p, const std::vector<std::string>& names) {
  return read_enum(at(o, p, "kind"), key_path(p, "kind"), names);
}

Json split_json(const StageSplitFailure& f) {
  return {{"problem", to_string(f.problem)}, {"blocks", f.blocks},
          {"stages", f.stages},              {"block", f.block},
          {"stage", f.stage},                {"device", f.device},
          {"device_memory", f.device_memory}, {"needed", f.needed},
          {"capacity", f.capacity},          {"whole_model_stage", f.whole_model_stage},
          {"all_weights", f.all_weights},    {"whole_model_streamed", f.whole_model_streamed}};
}

StageSplitFailure read_split(const Json& j, const std::string& p) {
  StageSplitFailure f;
  f.problem = *parse_stage_split_problem(read_enum(at(j, p, "problem"), key_path(p, "problem"),
                                                   stage_split_problem_names()));
  f.blocks = integer(j, p, "blocks", 1);
  f.stages = integer(j, p, "stages", 1);
  f.block = integer(j, p, "block", -1);
  f.stage = integer(j, p, "stage", -1);
  f.device = text(j, p, "device");
  f.device_memory = nonneg(j, p, "device_memory");
  f.needed = nonneg(j, p, "needed");
  f.capacity = nonneg(j, p, "capacity");
  f.whole_model_stage = integer(j, p, "whole_model_stage", -1);
  f.all_weights = nonneg(j, p, "all_weights");
  f.whole_model_streamed = j.contains("whole_model_streamed") &&
                           read_bool(j.at("whole_model_streamed"), key_path(p, "whole_model_streamed"));
  return f;
}

Json shortfall_json(const Shortfall& s) {
  Json j{{"rank", s.rank},
          {"device", s.device},
          {"capacity", s.capacity},
          {"stage", s.stage},
          {"blocks", {s.block_begin, s.block_end}},
          {"samples", s.samples},
          {"need", memory_json(s.need)},
          {"after_strategies", s.after_strategies},
          {"micro_batches", s.micro_batches},
          {"micro_batch_size", s.micro_batch_size},
          {"sharding_possible", s.sharding_possible},
          {"sharded", s.sharded},
          {"idle", s.idle}};
  if (s.host) {
    j["host"] = true;
    j["host_name"] = s.host_name;
    j["host_need"] = host_use_json(s.host_need);
    j["host_others"] = s.host_others;
  }
  if (s.evaluation) {
    j["evaluation"] = true;
    j["eval_batch"] = s.eval_batch;
    j["eval_fits"] = s.eval_fits;
  }
  return j;
}

Shortfall read_shortfall(const Json& j, const std::string& p) {
  Shortfall s;
  s.rank = integer(j, p, "rank", 0);
  s.device = text(j, p, "device");
  s.capacity = nonneg(j, p, "capacity");
  s.stage = integer(j, p, "stage", -1);
  const auto blocks = read_int_array(at(j, p, "blocks"), key_path(p, "blocks"), 0);
  if (blocks.size() != 2 || blocks[0] > blocks[1] || blocks[1] > std::numeric_limits<int>::max())
    fail_at(key_path(p, "blocks"), show(at(j, p, "blocks")) + " is not a [begin, end) pair; expected two block indices");
  s.block_begin = static_cast<int>(blocks[0]);
  s.block_end = static_cast<int>(blocks[1]);
  s.samples = read_int(at(j, p, "samples"), key_path(p, "samples"), 0);
  s.need = read_memory(at(j, p, "need"), key_path(p, "need"));
  s.after_strategies = read_bool(at(j, p, "after_strategies"), key_path(p, "after_strategies"));
  s.micro_batches = integer(j, p, "micro_batches", 1);
  s.micro_batch_size = read_int(at(j, p, "micro_batch_size"), key_path(p, "micro_batch_size"), 0);
  s.sharding_possible = read_bool(at(j, p, "sharding_possible"), key_path(p, "sharding_possible"));
  s.sharded = j.contains("sharded") && read_bool(j.at("sharded"), key_path(p, "sharded"));
  s.idle = j.contains("idle") && read_bool(j.at("idle"), key_path(p, "idle"));
  s.host = j.contains("host") && read_bool(j.at("host"), key_path(p, "host"));
  if (s.host) {
    s.host_name = text(j, p, "host_name");
    s.host_need = read_host_use(at(j, p, "host_need"), key_path(p, "host_need"));
    s.host_others = nonneg(j, p, "host_others");
  }
  s.evaluation = j.contains("evaluation") && read_bool(j.at("evaluation"), key_path(p, "evaluation"));
  if (s.evaluation) {
    s.eval_batch = read_int(at(j, p, "eval_batch"), key_path(p, "eval_batch"), 1);
    s.eval_fits = read_int(at(j, p, "eval_fits"), key_path(p, "eval_fits"), 0);
  }
  return s;
}

Json problem_json(const LayoutProblem& lp) {
  Json j{{"kind", to_string(lp.kind)}};
  switch (lp.kind) {
    case LayoutProblemKind::batch_below_replicas:
      j["global_batch"] = lp.global_batch;
      j["replicas"] = lp.replicas;
      break;
    case LayoutProblemKind::no_stage_split:
      j["split"] = split_json(lp.split);
      break;
    case LayoutProblemKind::memory:
      j["shortfall"] = shortfall_json(lp.shortfall);
      break;
  }
  return j;
}

LayoutProblem read_problem(const Json& j, const std::string& p) {
  LayoutProblem lp;
  const std::string kind = kind_of(j, p, layout_problem_names());
  lp.kind = *parse_layout_problem(kind);
  walk(j, p,
       {kind_field(),
        int_field("global_batch", lp.global_batch, 1, {"batch_below_replicas"}),
        int_field("replicas", lp.replicas, 1, {"batch_below_replicas"}),
        {"split", {"no_stage_split"}, [&](const Json& v, const std::string& q) { lp.split = read_split(v, q); }},
        {"shortfall", {"memory"}, [&](const Json& v, const std::string& q) { lp.shortfall = read_shortfall(v, q); }}},
       key_path(p, "kind"), kind);
  return lp;
}

std::vector<int> read_ranks(const Json& v, const std::string& p) {
  return int_list(v, p, 0);
}

}  // namespace

Json memory_strategies_json(const std::vector<MemoryStrategy>& s) {
  Json j = Json::array();
  for (MemoryStrategy m : s) j.push_back(to_string(m));
  return j;
}

std::vector<MemoryStrategy> read_memory_strategies(const Json& v, const std::string& path) {
  return list<MemoryStrategy>(v, path, [](const Json& x, const std::string& q) {
    return *parse_memory_strategy(read_enum(x, q, memory_strategy_names()));
  });
}

Json memory_steps_json(const std::vector<MemoryStep>& steps) {
  Json out = Json::array();
  for (const MemoryStep& s : steps) {
    Json j{{"kind", to_string(s.kind)}};
    switch (s.kind) {
      case MemoryStepKind::over_capacity:
        j["use"] = memory_json(s.use);
        j["capacity"] = s.capacity;
        break;
      case MemoryStepKind::micro_batches:
        j["micro_batches"] = s.micro_batches;
        j["micro_batch_size"] = s.micro_batch_size;
        [[fallthrough]];
      case MemoryStepKind::recompute:
      case MemoryStepKind::recompute_dropped:
        j["activations_before"] = s.activations_before;
        j["activations_after"] = s.activations_after;
        break;
      case MemoryStepKind::optimizer_sharding:
      case MemoryStepKind::shard_for_peer:
        j["state_bytes"] = s.state_bytes;
        j["group_size"] = s.group_size;
        j["kept_fraction"] = s.kept_fraction;
        j["stage"] = s.stage;
        j["for_rank"] = s.for_rank;
        break;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<MemoryStep> read_memory_steps(const Json& v, const std::string& path) {
  return list<MemoryStep>(v, path, [](const Json& j, const std::string& p) {
    MemoryStep s;
    const std::string kind = kind_of(j, p, memory_step_kind_names());
    s.kind = *parse_memory_step_kind(kind);
    const std::vector<std::string> saving{"recompute", "micro_batches", "recompute_dropped"};
    const std::vector<std::string> sharding{"optimizer_sharding", "shard_for_peer"};
    walk(j, p,
         {kind_field(),
          {"use", {"over_capacity"}, [&](const Json& x, const std::string& q) { s.use = read_memory(x, q); }},
          number_field("capacity", s.capacity, {"over_capacity"}),
          number_field("activations_before", s.activations_before, saving),
          number_field("activations_after", s.activations_after, saving),
          int_field("micro_batches", s.micro_batches, 1, {"micro_batches"}),
          int_field("micro_batch_size", s.micro_batch_size, 1, {"micro_batches"}),
          number_field("state_bytes", s.state_bytes, sharding),
          int_field("group_size", s.group_size, 1, sharding),
          {"kept_fraction", sharding, [&](const Json& x, const std::string& q) {
             s.kept_fraction = read_double(x, q, Range{0, 1});
           }},
          int_field("stage", s.stage, 0, sharding),
          int_field("for_rank", s.for_rank, 0, sharding)},
         key_path(p, "kind"), kind);
    return s;
  });
}

Json shortfalls_json(const std::vector<Shortfall>& s) {
  Json j = Json::array();
  for (const Shortfall& x : s) j.push_back(shortfall_json(x));
  return j;
}

std::vector<Shortfall> read_shortfalls(const Json& v, const std::string& path) {
  return list<Shortfall>(v, path, read_shortfall);
}

Json notes_json(const std::vector<PlanNote>& notes) {
  Json out = Json::array();
  for (const PlanNote& n : notes) {
    Json j{{"kind", to_string(n.kind)}};
    switch (n.kind) {
      case NoteKind::work_by_device: {
        Json work = Json::array();
        for (const DeviceWork& w : n.work)
          work.push_back({{"device", w.device}, {"ranks", w.ranks}, {"fraction", w.fraction}});
        j["work"] = std::move(work);
        break;
      }
      case NoteKind::idle_ranks:
        j["world"] = n.world;
        [[fallthrough]];
      case NoteKind::hub_reduces:
      case NoteKind::hub_steps_optimizer:
        j["ranks"] = n.ranks;
        j["seconds"] = n.seconds;
        j["other_seconds"] = n.other_seconds;
        break;
      case NoteKind::deadline_leader:
        j["replicas"] = n.replicas;
        j["seconds"] = n.seconds;
        j["other_seconds"] = n.other_seconds;
        break;
      case NoteKind::host_memory:
        j["ranks"] = n.ranks;
        [[fallthrough]];
      case NoteKind::rank0_host:
        j["bytes"] = n.bytes;
        j["other_bytes"] = n.other_bytes;
        break;
      case NoteKind::uniform_baseline:
        j["stages"] = n.stages;
        j["seconds"] = n.seconds;
        if (n.problem) j["problem"] = problem_json(*n.problem);
        break;
      case NoteKind::shape:
        j["stages"] = n.stages;
        j["replicas"] = n.replicas;
        j["ranks_used"] = n.ranks_used;
        j["world"] = n.world;
        if (n.problem) j["problem"] = problem_json(*n.problem);
        else j["seconds"] = n.seconds;
        if (n.other_seconds > 0) j["other_seconds"] = n.other_seconds;
        break;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<PlanNote> read_notes(const Json& v, const std::string& path) {
  return list<PlanNote>(v, path, [](const Json& j, const std::string& p) {
    PlanNote n;
    const std::string kind = kind_of(j, p, note_kind_names());
    n.kind = *parse_note_kind(kind);
    const std::vector<std::string> timed{"hub_reduces", "hub_steps_optimizer", "idle_ranks",
                                         "uniform_baseline", "shape", "deadline_leader"};
    const std::vector<std::string> compared{"hub_reduces", "hub_steps_optimizer", "idle_ranks", "deadline_leader",
                                            "host_memory"};
    walk(j, p,
         {kind_field(),
          {"work", {"work_by_device"}, [&](const Json& x, const std::string& q) {
             n.work = list<DeviceWork>(x, q, [](const Json& w, const std::string& r) {
               return DeviceWork{text(w, r, "device"), integer(w, r, "ranks", 1),
                                 read_double(at(w, r, "fraction"), key_path(r, "fraction"), Range{0, 1})};
             });
           }},
          {"ranks", compared, [&](const Json& x, const std::string& q) { n.ranks = read_ranks(x, q); }},
          number_field("seconds", n.seconds, timed),
          number_field("other_seconds", n.other_seconds,
                       {"hub_reduces", "hub_steps_optimizer", "idle_ranks", "deadline_leader", "shape"}),
          number_field("bytes", n.bytes, {"rank0_host", "host_memory"}),
          number_field("other_bytes", n.other_bytes, {"rank0_host", "host_memory"}),
          int_field("stages", n.stages, 1, {"uniform_baseline", "shape"}),
          int_field("replicas", n.replicas, 1, {"shape", "deadline_leader"}),
          int_field("ranks_used", n.ranks_used, 1, {"shape"}),
          int_field("world", n.world, 1, {"idle_ranks", "shape"}),
          {"problem", {"uniform_baseline", "shape"},
           [&](const Json& x, const std::string& q) { n.problem = read_problem(x, q); }}},
         key_path(p, "kind"), kind);
    return n;
  });
}

}  // namespace ht::plan
