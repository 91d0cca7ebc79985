// The plan's facts in English: what `hetrain plan` and `hetrain train` print for the
// planner's memory decisions, shortfalls, ruled-out layouts and notes
// (plan/plan_facts.h). The planner records numbers only; every sentence is made here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"

namespace ht::report {

// "recompute + micro-batches", or "none" when the rank fits as it is.
std::string memory_strategies_text(const std::vector<plan::MemoryStrategy>& strategies);

// "needs 103.0 MiB of 87.7 MiB (params ..., grads ..., optimizer ..., activations ...)",
// "recompute: activations 61.0 MiB -> 32.5 MiB", ...
std::string memory_step_text(const plan::MemoryStep& step);

// The rank's strategies and why, as the plan's "memory strategies" section shows them;
// "" when it has none.
std::string memory_reason_text(const plan::RankPlan& rank);

// "a 1 MiB message to its typical peer takes 2.00 ms, 8x the cluster's typical 250 µs";
// "" when the rank's link is not slow.
std::string slow_link_text(const plan::RankPlan& rank);

// "rank 3 (rtx3060, 12.0 GiB): 32 samples on blocks 0-47 need 14.2 GiB (...), 2.2 GiB
// short", or, after every strategy, "rank 3 (...) cannot hold stage 1 (...) even with ...".
std::string shortfall_text(const plan::Shortfall& s);
// What a rank keeps in its host's memory, part by part ("12.00 MiB of weights of blocks
// outside its stage and ...").
std::string host_use_text(const plan::HostUse& h);

// Texts paired with the rank each is of, as (text, every rank with it) in the order of its
// first rank; and "rank 3" or "ranks 0-7, 9" for such a list.
std::vector<std::pair<std::string, std::vector<int>>> ranks_by_text(const std::vector<std::pair<int, std::string>>& items);
std::string ranks_text(const std::vector<int>& ranks);

// One line per shortfall text, but for the rank, with every rank that has it, in the order
// of its first: "ranks 0-7 (rtx3060, 12.0 GiB): ..." (a baseline on 1,024 ranks was
// 1,024 lines, and an interleaved cluster one line per rank).
std::vector<std::string> shortfall_lines(const std::vector<plan::Shortfall>& shortfalls);

// "no pipeline split of 6 blocks over 2 devices fits: block 0 alone needs ...".
std::string stage_split_text(const plan::StageSplitFailure& f);

std::string layout_problem_text(const plan::LayoutProblem& p);

// "one rank", "data (4 replicas)", "pipeline (2 stages)", "hybrid (2 replicas x 2 stages)".
std::string shape_name(int stages, int replicas);

// "equal batches, whole model per rank (DDP)" for one stage, else DeepSpeed's uniform split.
std::string baseline_name(int stages);

std::string note_text(const plan::PlanNote& note);

// The planner's refusal with every layout it ruled out, one per line.
std::string no_plan_text(const plan::NoPlanFits& e);

}  // namespace ht::report
