// The plan file's field readers, shared by plan_json.cpp and plan_facts_json.cpp: every
// field goes through the schema helpers, so an error carries its JSON path.
#pragma once

#include <string>
#include <vector>

#include "config/json_schema.h"

namespace ht::plan::json_fields {

using config::schema::Json;

inline const Json& at(const Json& obj, const std::string& path, const char* key) {
  config::schema::expect_object(obj, path, "an object");
  return config::schema::require(obj, path, key, "a value");
}
inline double nonneg(const Json& obj, const std::string& path, const char* key) {
  return config::schema::read_double(at(obj, path, key), config::schema::key_path(path, key),
                                     config::schema::Range::at_least(0));
}
inline int integer(const Json& obj, const std::string& path, const char* key, int64_t min) {
  return config::schema::read_int32(at(obj, path, key), config::schema::key_path(path, key), min);
}
inline std::string text(const Json& obj, const std::string& path, const char* key) {
  const Json& v = at(obj, path, key);
  if (!v.is_string())
    config::schema::fail_at(config::schema::key_path(path, key),
                            config::schema::show(v) + " is not a string; expected text");
  return v.get<std::string>();
}
inline const Json& array(const Json& obj, const std::string& path, const char* key) {
  const Json& v = at(obj, path, key);
  if (!v.is_array())
    config::schema::fail_at(config::schema::key_path(path, key),
                            config::schema::show(v) + " is not an array; expected a list");
  return v;
}

template <class T, class Read>
std::vector<T> list(const Json& v, const std::string& path, Read read) {
  if (!v.is_array()) config::schema::fail_at(path, config::schema::show(v) + " is not an array; expected a list");
  std::vector<T> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(read(v[i], config::schema::index_path(path, i)));
  return out;
}

// A list of ints, each at least `min` and at most INT_MAX (read_int32: never wrapped).
inline std::vector<int> int_list(const Json& v, const std::string& path, int64_t min) {
  return list<int>(v, path,
                   [min](const Json& x, const std::string& q) { return config::schema::read_int32(x, q, min); });
}

}  // namespace ht::plan::json_fields
