// The plan file: `hetrain plan --json FILE` writes it and `hetrain train --plan FILE`
// reads it back. Format "hetrain-plan/2", documented in docs/formats.md. Schedules are not
// stored: they follow from the layout through build_1f1b (plan_schedules), so a file
// cannot carry a schedule that disagrees with its own layout.
#pragma once

#include <optional>
#include <string>

#include "plan/local_plan.h"
#include "plan/plan.h"

namespace ht::plan {

inline constexpr const char* kPlanFormat = "hetrain-plan/2";
// Older formats, refused with a pointer to regenerating the file: /1 held notes and
// memory reasons as English sentences.
inline constexpr const char* kOldPlanFormats[] = {"hetrain-plan/1"};

std::string plan_to_json(const Plan& plan);

// Parses and checks a plan; errors are config::ConfigError naming `source` and the JSON
// path, or what is inconsistent (layout vs ranks, ranges vs blocks, schedules).
Plan plan_from_json(const std::string& text, const std::string& source);
Plan read_plan(const std::string& path);

// A checkpoint's "local.split" (its run's groups, H, and H_g and n_g as it last stepped by
// them): the split, where the groups and H are `plan`'s; nullopt where they are another
// plan's (its rounds are its own). Every count is range-checked, none wrapped; errors are
// config::ConfigError naming the field (local.split.group_steps[1]). Whether the split
// fits the plan is the caller's check (LocalSync::resume_split).
std::optional<RoundSplit> read_local_split(const std::string& text, const Plan& plan);

// Consistency of a plan (also used on planner output in tests): ranges contiguous over
// [0, blocks), ranks agreeing with the layout, schedules that pass check_schedules.
// Throws ht::Error naming the first problem.
void check_plan(const Plan& plan);

}  // namespace ht::plan
