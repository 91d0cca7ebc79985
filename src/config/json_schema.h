// A small validator for JSON config documents, private to src/config (it pulls in
// nlohmann/json.hpp, which config.h deliberately does not). It gives typed reads with
// range checks and a walk over an object's keys in document order that rejects unknown
// keys (with a spelling suggestion) and keys that belong to another variant of the
// object (e.g. an sgd-only key on adamw). Every failure throws ConfigError with one
// line: "<json path>: <value> <problem>; expected <what>".
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"

namespace ht::config::schema {

// ordered_json keeps document order, so "the first problem" is the first in the file.
using Json = nlohmann::ordered_json;

// Deeper documents are refused: no hetrain file needs more than a handful of levels.
inline constexpr size_t kMaxJsonDepth = 64;

// Parses text; a syntax error, an empty document, a duplicate key, a number beyond a
// double or nesting deeper than kMaxJsonDepth is a ConfigError naming `source` (syntax
// errors also give nlohmann's line, column, byte and reason). Every JSON file hetrain
// reads goes through here.
Json parse_document(const std::string& text, const std::string& source);

// The whole of the regular file at `path`, for parse_document. A missing file, a
// directory, a pipe or device (which a read could wait on for good) or a failed read is
// a ConfigError naming the path and `expected` (what the file should be).
std::string read_document_file(const std::string& path, const std::string& expected);

[[noreturn]] void fail_at(const std::string& path, const std::string& what);
// A float as the shortest decimal that reads back as the same float (0.001, not
// 0.0010000000474974513), so messages and to_json print what the user wrote.
Json float_json(float f);
// The value as JSON text on one line, truncated when long.
std::string show(const Json& v);
// "model" + "hidden" -> "model.hidden"; odd or long keys are quoted: model["a b"].
std::string key_path(const std::string& parent, const std::string& key);
std::string index_path(const std::string& parent, size_t i);  // model.hidden[1]
// The candidate `word` was probably meant to be (edit distance <= 2, or one contains
// the other), or "" when none is close.
std::string suggest(const std::string& word, const std::vector<std::string>& candidates);
// For names that come in families (devices "v100-16g", "v100-32g"): every candidate that
// starts with `word`; else every one that contains it or that it contains (3 letters or
// more); else the ones at the smallest edit distance <= 2 (1 for short words); else none.
std::vector<std::string> suggest_all(const std::string& word,
                                     const std::vector<std::string>& candidates);

// An interval of acceptable numbers, printed in messages as "a number > 0" etc.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  static Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity()}; }
  static Range above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true}; }
  static Range closed_open(double lo, double hi) { return {lo, hi, false, true}; }
  static Range open(double lo, double hi) { return {lo, hi, true, true}; }
  // A measured or datasheet figure of a cluster or catalogue file, of any unit: finite
  // and at most kMaxFigure, since past it the planner's sums and products over thousands
  // of ranks and steps leave a double's range (1e308 GFLOP/s planned as inf); a figure
  // above 0 is at least kMinFigure, since a time divided by one (a link of 1e-300 B/s)
  // left it just as well.
  static constexpr double kMaxFigure = 1e15;
  static constexpr double kMinFigure = 1e-15;
  static Range figure_above_0() { return {kMinFigure, kMaxFigure}; }
  static Range figure_at_least_0() { return {0, kMaxFigure}; }
  bool contains(double x) const;
  std::string describe() const;  // "a number in [0, 1)"
};

// Integers reject booleans and fractions; a float with an integral value (1e4) is fine.
int64_t read_int(const Json& v, const std::string& path, int64_t min);
// The same, at most `max` (a count that the code holds in fewer bits, or adds to a step).
int64_t read_int(const Json& v, const std::string& path, int64_t min, int64_t max);
// The same, held in an int: at most INT_MAX, where a cast would wrap 2^32 to 0.
int read_int32(const Json& v, const std::string& path, int64_t min);
uint64_t read_uint(const Json& v, const std::string& path);
double read_double(const Json& v, const std::string& path, const Range& r);
// Checked after conversion, so 1e-50 (0 as a float) fails "> 0" and 1e300 fails.
float read_float(const Json& v, const std::string& path, const Range& r);
bool read_bool(const Json& v, const std::string& path);
// `what` names the expected content, e.g. "a directory path"; empty strings fail.
std::string read_string(const Json& v, const std::string& path, const std::string& what);
// "one of \"a\", \"b\" or \"c\"", as enum messages phrase the choices.
std::string one_of(const std::vector<std::string>& choices);
std::string read_enum(const Json& v, const std::string& path,
                      const std::vector<std::string>& choices);
std::vector<int64_t> read_int_array(const Json& v, const std::string& path, int64_t min);
std::vector<std::string> read_string_array(const Json& v, const std::string& path,
                                           const std::string& what);
void expect_object(const Json& v, const std::string& path, const std::string& what);
// "<path>: missing; expected <what>"
[[noreturn]] void fail_missing(const std::string& path, const std::string& what);
// obj[key], or fail_missing naming <path>.<key> and `what`.
const Json& require(const Json& obj, const std::string& path, const std::string& key,
                    const std::string& what);

// One known key of an object: the variants (values of the object's discriminator, e.g.
// model.type) it applies to, none meaning all, and how to read it.
struct Field {
  std::string key;
  std::vector<std::string> only_for;
  std::function<void(const Json& value, const std::string& path)> read;
};

// Reads each key of `obj` in document order through its Field, after checking that the
// key is known and applies to `variant` (the discriminator's value; its path, e.g.
// "model.type", is `variant_path`). Leave both empty for objects without variants.
void walk(const Json& obj, const std::string& path, const std::vector<Field>& fields,
          const std::string& variant_path = "", const std::string& variant = "");

}  // namespace ht::config::schema
