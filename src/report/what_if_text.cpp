#include "report/what_if_text.h"

#include <cstdio>

#include "core/units.h"

namespace ht::report {

std::string what_if_text(const plan::WhatIfResult& result, const std::vector<plan::WhatIfEvent>& events) {
  std::string out = "what if, over " + std::to_string(result.steps) + " steps of " +
                    std::to_string(result.global_batch) + " samples:";
  for (const plan::WhatIfEvent& e : events) out += " " + e.spec;
  out += "\n";
  // Fixed widths: three rows of short figures (the work-lost column last, unpadded).
  const auto row = [](const std::string& policy, const std::string& step, const std::string& rate,
                      const std::string& seconds, const std::string& lost, const std::string& dropped,
                      const std::string& short_steps, const std::string& work) {
    char line[512];
    std::snprintf(line, sizeof line, "%-9s %-10s %-11s %-16s %-15s %-16s %-13s %s\n", policy.c_str(), step.c_str(),
                  rate.c_str(), seconds.c_str(), lost.c_str(), dropped.c_str(), short_steps.c_str(), work.c_str());
    return std::string(line);
  };
  out += row("policy", "step", "samples/s", "time to N steps", "lost to events", "dropped/waited", "closed short",
             "work lost");
  for (const plan::PolicyOutcome& p : result.policies) {
    const std::string name = config::to_string(p.policy);
    if (!p.refused.empty()) {
      out += row(name, "-", "-", "-", "-", "-", "-", "- (not simulated)");
      continue;
    }
    const bool deadline = p.policy == config::SyncPolicy::deadline;
    const std::string dropped = deadline                                  ? std::to_string(p.samples_dropped)
                                : p.policy == config::SyncPolicy::local ? std::to_string(p.samples_waited_for) + " w"
                                                                          : "-";
    out += row(name, format_seconds(p.step_seconds), number("%.1f", p.samples_per_s), format_seconds(p.seconds),
               format_seconds(p.lost_seconds), dropped,
               deadline ? std::to_string(p.steps_closed_short) : "-",
               p.work_lost_steps > 0 || p.work_lost_seconds > 0
                   ? std::to_string(p.work_lost_steps) + " steps, " + format_seconds(p.work_lost_seconds)
                   : "0");
  }
  for (const plan::PolicyOutcome& p : result.policies) {
    const std::string name = config::to_string(p.policy);
    if (!p.refused.empty()) out += "  " + name + ": not simulated: " + p.refused + "\n";
    if (!p.plan_shape.empty()) out += "  " + name + ": plays " + p.plan_shape + "\n";
    for (const std::string& n : p.notes) out += "  " + name + ": " + n + "\n";
    // Time gained, not lost: a re-plan (after a failure or a join) found a faster plan than
    // the one the job began with, or deadline closed its steps without the part of a rank
    // that failed, stalled or slowed, which had set their pace (a slow factor of 100 gave
    // -46 s, where the note blamed a re-plan or a failure that had not happened).
    if (p.refused.empty() && p.lost_seconds < 0)
      out += "  " + name + ": lost to events is negative: the job ran " + format_seconds(-p.lost_seconds) +
             " faster than without them (a re-plan found a faster plan than the first, whose search is a "
             "heuristic, or deadline closed steps without the part of a rank that failed, stalled or slowed, "
             "which had set their pace)\n";
  }
  // An event timed after the job's end changes nothing: say so, or a stall of seconds
  // that "costs 0" reads as a prediction.
  bool every_late = true;  // every event after the job's end under every policy played
  for (const plan::WhatIfEvent& e : events) {
    std::string after;
    size_t played = 0, late = 0;
    for (const plan::PolicyOutcome& p : result.policies) {
      if (!p.refused.empty()) continue;
      ++played;
      if (e.at_s < p.seconds) continue;
      ++late;
      after += std::string(after.empty() ? "" : ", ") + config::to_string(p.policy) + " (" +
               format_seconds(p.seconds) + ")";
    }
    every_late = every_late && late > 0 && late == played;
    if (late == 0) continue;
    out += "  " + e.spec + ": at " + format_seconds(e.at_s) + ", after the job's end under " +
           (late == played ? "every policy: " : "") + after +
           ", so it changes nothing there; give an earlier time or play more steps\n";
  }
  // Events that cost no policy anything: said once, or a table of zeros reads as a
  // prediction that the job shrugs them off (a link event between two ranks that exchange
  // nothing, read as a range of ranks, changed nothing and said nothing).
  bool any_played = false, none_cost = true, any_link = false;
  for (const plan::PolicyOutcome& p : result.policies) {
    if (!p.refused.empty()) continue;
    any_played = true;
    none_cost = none_cost && p.lost_seconds == 0 && p.samples_dropped == 0 && p.samples_waited_for == 0 &&
                p.work_lost_steps == 0 && p.work_lost_seconds == 0;
  }
  for (const plan::WhatIfEvent& e : events) any_link = any_link || e.kind == plan::WhatIfKind::link;
  if (any_played && none_cost && !events.empty() && !every_late)  // (late events are said above)
    out += std::string("  the events change nothing under any policy played") +
           (any_link ? " (link:ranks=A-B slows the one link between ranks A and B, which counts only where the "
                       "plans send data over it)"
                     : "") +
           "\n";
  out += "  (a restart, after a failure or for a join, is assumed to take " + format_seconds(plan::kRestartSeconds) +
         "; dropped/waited: deadline's samples left out; local drops none and applies none staler than the "
         "round its design delays every group's progress: its exchange waits, and 'N w' counts the samples of rounds "
         "held by an event that another group waited for)\n";
  return out;
}

}  // namespace ht::report
