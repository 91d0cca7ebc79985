#include "plan/plan_facts.h"

#include "core/enum_names.h"

namespace ht::plan {

namespace {

// The strategies keep the names users already read in the table's strategy column.
constexpr EnumName<MemoryStrategy> kMemoryStrategyNames[] = {
    {MemoryStrategy::recompute, "recompute"},
    {MemoryStrategy::micro_batches, "micro-batches"},
    {MemoryStrategy::optimizer_sharding, "optimizer sharding"}};

constexpr EnumName<MemoryStepKind> kMemoryStepNames[] = {
    {MemoryStepKind::over_capacity, "over_capacity"},
    {MemoryStepKind::recompute, "recompute"},
    {MemoryStepKind::micro_batches, "micro_batches"},
    {MemoryStepKind::optimizer_sharding, "optimizer_sharding"},
    {MemoryStepKind::shard_for_peer, "shard_for_peer"},
    {MemoryStepKind::recompute_dropped, "recompute_dropped"}};

constexpr EnumName<StageSplitProblem> kStageSplitNames[] = {
    {StageSplitProblem::block_too_large, "block_too_large"},
    {StageSplitProblem::stage_too_small, "stage_too_small"},
    {StageSplitProblem::no_contiguous_split, "no_contiguous_split"}};

constexpr EnumName<LayoutProblemKind> kLayoutProblemNames[] = {
    {LayoutProblemKind::batch_below_replicas, "batch_below_replicas"},
    {LayoutProblemKind::no_stage_split, "no_stage_split"},
    {LayoutProblemKind::memory, "memory"}};

constexpr EnumName<NoteKind> kNoteNames[] = {{NoteKind::work_by_device, "work_by_device"},
                                             {NoteKind::hub_reduces, "hub_reduces"},
                                             {NoteKind::hub_steps_optimizer, "hub_steps_optimizer"},
                                             {NoteKind::idle_ranks, "idle_ranks"},
                                             {NoteKind::uniform_baseline, "uniform_baseline"},
                                             {NoteKind::shape, "shape"},
                                             {NoteKind::deadline_leader, "deadline_leader"},
                                             {NoteKind::rank0_host, "rank0_host"},
                                             {NoteKind::host_memory, "host_memory"}};

}  // namespace

const char* to_string(MemoryStrategy s) { return enum_name(s, kMemoryStrategyNames); }
std::vector<std::string> memory_strategy_names() { return enum_names(kMemoryStrategyNames); }
std::optional<MemoryStrategy> parse_memory_strategy(std::string_view s) {
  return enum_from_name(s, kMemoryStrategyNames);
}

const char* to_string(MemoryStepKind k) { return enum_name(k, kMemoryStepNames); }
std::vector<std::string> memory_step_kind_names() { return enum_names(kMemoryStepNames); }
std::optional<MemoryStepKind> parse_memory_step_kind(std::string_view s) {
  return enum_from_name(s, kMemoryStepNames);
}

const char* to_string(StageSplitProblem p) { return enum_name(p, kStageSplitNames); }
std::vector<std::string> stage_split_problem_names() { return enum_names(kStageSplitNames); }
std::optional<StageSplitProblem> parse_stage_split_problem(std::string_view s) {
  return enum_from_name(s, kStageSplitNames);
}

const char* to_string(LayoutProblemKind k) { return enum_name(k, kLayoutProblemNames); }
std::vector<std::string> layout_problem_names() { return enum_names(kLayoutProblemNames); }
std::optional<LayoutProblemKind> parse_layout_problem(std::string_view s) {
  return enum_from_name(s, kLayoutProblemNames);
}

const char* to_string(NoteKind k) { return enum_name(k, kNoteNames); }
std::vector<std::string> note_kind_names() { return enum_names(kNoteNames); }
std::optional<NoteKind> parse_note_kind(std::string_view s) { return enum_from_name(s, kNoteNames); }

}  // namespace ht::plan
