// The plan file's objects for plan_facts.h: each note, memory step, shortfall and problem
// is {"kind": ..., the fields of that kind}. Readers name the JSON path of what is wrong;
// a field a kind does not use is an error, one it uses but omits keeps its default.
#pragma once

#include <string>
#include <vector>

#include "config/json_schema.h"
#include "plan/plan_facts.h"

namespace ht::plan {

config::schema::Json memory_strategies_json(const std::vector<MemoryStrategy>& s);
config::schema::Json memory_steps_json(const std::vector<MemoryStep>& steps);
config::schema::Json shortfalls_json(const std::vector<Shortfall>& s);
config::schema::Json notes_json(const std::vector<PlanNote>& notes);
config::schema::Json host_use_json(const HostUse& h);

std::vector<MemoryStrategy> read_memory_strategies(const config::schema::Json& v, const std::string& path);
std::vector<MemoryStep> read_memory_steps(const config::schema::Json& v, const std::string& path);
std::vector<Shortfall> read_shortfalls(const config::schema::Json& v, const std::string& path);
std::vector<PlanNote> read_notes(const config::schema::Json& v, const std::string& path);
HostUse read_host_use(const config::schema::Json& v, const std::string& path);

}  // namespace ht::plan
