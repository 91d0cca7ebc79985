#include "config/json_schema.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

namespace ht::config::schema {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Optimal string alignment distance: a swapped pair of letters counts once, the most
// common typo in a key.
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// How a JSON value is named in "<value> is not <kind>" messages.
std::string kind_of(const Json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  return "a number";
}

std::string fmt(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

std::string quoted_list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += i + 1 == items.size() ? " or " : ", ";
    out += '"' + items[i] + '"';
  }
  return out;
}

}  // namespace

void fail_at(const std::string& path, const std::string& what) {
  throw ConfigError(path + ": " + what);
}

void fail_missing(const std::string& path, const std::string& what) {
  fail_at(path, "missing; expected " + what);
}

const Json& require(const Json& obj, const std::string& path, const std::string& key,
                    const std::string& what) {
  auto it = obj.find(key);
  if (it == obj.end()) fail_missing(key_path(path, key), what);
  return *it;
}

Json float_json(float f) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, f);
  return Json(std::stod(std::string(buf, res.ptr)));
}

std::string show(const Json& v) {
  // ASCII-only output keeps the message on one line and safe to truncate anywhere.
  std::string s = v.dump(-1, ' ', true, Json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (s.size() > kMax) s = s.substr(0, kMax - 3) + "...";
  return s;
}

std::string key_path(const std::string& parent, const std::string& key) {
  bool plain = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  // A long key goes through show() like an odd one, which keeps the message short.
  if (plain && key.size() <= 40) return parent.empty() ? key : parent + "." + key;
  return parent + "[" + show(Json(key)) + "]";
}

std::string index_path(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

std::string suggest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  // Short words are within distance 2 of too much; allow one edit for them.
  const size_t max_dist = w.size() <= 3 ? 1 : 2;
  std::string best;
  size_t best_dist = max_dist + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(w, lower(c));
    if (d < best_dist) best = c, best_dist = d;
  }
  if (!best.empty()) return best;
  // "warmup" for warmup_steps, "num_layers" for layers: one contains the other.
  for (const auto& c : candidates) {
    const std::string lc = lower(c);
    const std::string& shorter = lc.size() < w.size() ? lc : w;
    const std::string& longer = lc.size() < w.size() ? w : lc;
    if (shorter.size() >= 3 && longer.find(shorter) != std::string::npos) return c;
  }
  return "";
}

std::vector<std::string> suggest_all(const std::string& word,
                                     const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  std::vector<std::string> starts, contains, closest;
  const size_t max_dist = w.size() <= 3 ? 1 : 2;
  size_t best_dist = max_dist + 1;
  for (const auto& c : candidates) {
    const std::string lc = lower(c);
    if (lc == w) continue;
    if (!w.empty() && lc.rfind(w, 0) == 0) starts.push_back(c);
    const std::string& shorter = lc.size() < w.size() ? lc : w;
    const std::string& longer = lc.size() < w.size() ? w : lc;
    if (shorter.size() >= 3 && longer.find(shorter) != std::string::npos) contains.push_back(c);
    const size_t d = edit_distance(w, lc);
    if (d < best_dist) closest.clear(), best_dist = d;
    if (d == best_dist) closest.push_back(c);
  }
  if (!starts.empty()) return starts;
  if (!contains.empty()) return contains;
  return closest;
}

bool Range::contains(double x) const {
  if (std::isnan(x)) return false;
  bool lo_ok = lo_open ? x > lo : x >= lo;
  bool hi_ok = hi_open ? x < hi : x <= hi;
  return lo_ok && hi_ok;
}

std::string Range::describe() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return "a number in " + std::string(lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) +
           (hi_open ? ")" : "]");
  if (has_lo) return std::string("a number ") + (lo_open ? "> " : ">= ") + fmt(lo);
  if (has_hi) return std::string("a number ") + (hi_open ? "< " : "<= ") + fmt(hi);
  return "a finite number";
}

int64_t read_int(const Json& v, const std::string& path, int64_t min) {
  const std::string expect = "an integer >= " + std::to_string(min);
  int64_t x = 0;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    x = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_at(path, show(v) + " is out of range; expected " + expect + " and at most 9223372036854775807");
    x = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d))
      fail_at(path, show(v) + " is not an integer; expected " + expect);
    if (std::fabs(d) >= 9.2e18)
      fail_at(path, show(v) + " is out of range; expected " + expect + " and below 9.2e18");
    x = static_cast<int64_t>(d);
  } else {
    fail_at(path, show(v) + " is not an integer; expected " + expect);
  }
  if (x < min) fail_at(path, show(v) + " is out of range; expected " + expect);
  return x;
}

int64_t read_int(const Json& v, const std::string& path, int64_t min, int64_t max) {
  const int64_t x = read_int(v, path, min);
  if (x > max)
    fail_at(path, show(v) + " is out of range; expected an integer from " + std::to_string(min) + " to " +
                      std::to_string(max));
  return x;
}

int read_int32(const Json& v, const std::string& path, int64_t min) {
  return static_cast<int>(read_int(v, path, min, std::numeric_limits<int>::max()));
}

uint64_t read_uint(const Json& v, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  const std::string expect = "an integer from 0 to 18446744073709551615";
  if (v.is_number_integer()) {  // negative
    fail_at(path, show(v) + " is out of range; expected " + expect);
  } else if (v.is_number_float()) {  // past 2^64 the parser reads a float
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) fail_at(path, show(v) + " is not an integer; expected " + expect);
    if (d < 0 || d >= 18446744073709551616.0) fail_at(path, show(v) + " is out of range; expected " + expect);
    return static_cast<uint64_t>(d);
  }
  fail_at(path, show(v) + " is not an integer; expected " + expect);
}

double read_double(const Json& v, const std::string& path, const Range& r) {
  // is_number() is false for booleans, so true is not silently 1.
  if (!v.is_number())
    fail_at(path, show(v) + " is not a number; expected " + r.describe());
  double x = v.get<double>();
  if (!std::isfinite(x) || !r.contains(x))
    fail_at(path, show(v) + " is out of range; expected " + r.describe());
  return x;
}

float read_float(const Json& v, const std::string& path, const Range& r) {
  double x = read_double(v, path, r);
  float f = static_cast<float>(x);
  if (!std::isfinite(f) || !r.contains(f))
    fail_at(path, show(v) + " is out of range for a float; expected " + r.describe() +
                      (std::isfinite(f) ? "" : " and at most 3.4e38 (a float's largest)"));
  return f;
}

bool read_bool(const Json& v, const std::string& path) {
  if (!v.is_boolean()) fail_at(path, show(v) + " is not a boolean; expected true or false");
  return v.get<bool>();
}

std::string read_string(const Json& v, const std::string& path, const std::string& what) {
  if (!v.is_string()) fail_at(path, show(v) + " is not a string; expected " + what);
  std::string s = v.get<std::string>();
  if (s.empty()) fail_at(path, "\"\" is empty; expected " + what);
  // No name or path holds one: a path would end there for the system, and a run take
  // another file than its config records.
  if (s.find('\0') != std::string::npos) fail_at(path, show(v) + " contains a NUL character; expected " + what);
  return s;
}

std::string one_of(const std::vector<std::string>& choices) {
  return "one of " + quoted_list(choices);
}

std::string read_enum(const Json& v, const std::string& path,
                      const std::vector<std::string>& choices) {
  const std::string expect = one_of(choices);
  if (!v.is_string()) fail_at(path, show(v) + " is not a string; expected " + expect);
  std::string s = v.get<std::string>();
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  std::string hint = suggest(s, choices);
  fail_at(path, show(v) + " is not a known choice; expected " + expect +
                    (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
}

std::vector<int64_t> read_int_array(const Json& v, const std::string& path, int64_t min) {
  if (!v.is_array())
    fail_at(path, show(v) + " is not an array; expected an array of integers >= " +
                      std::to_string(min));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(read_int(v[i], index_path(path, i), min));
  return out;
}

std::vector<std::string> read_string_array(const Json& v, const std::string& path,
                                           const std::string& what) {
  if (!v.is_array()) fail_at(path, show(v) + " is not an array; expected an array of " + what);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(read_string(v[i], index_path(path, i), "a non-empty string"));
  return out;
}

void expect_object(const Json& v, const std::string& path, const std::string& what) {
  if (!v.is_object()) fail_at(path, show(v) + " is " + kind_of(v) + "; expected " + what);
}

void walk(const Json& obj, const std::string& path, const std::vector<Field>& fields,
          const std::string& variant_path, const std::string& variant) {
  for (const auto& [key, value] : obj.items()) {
    const std::string here = key_path(path, key);
    auto field = std::find_if(fields.begin(), fields.end(),
                              [&](const Field& f) { return f.key == key; });
    if (field == fields.end()) {
      std::vector<std::string> names, applicable;
      for (const auto& f : fields) {
        names.push_back(f.key);
        if (f.only_for.empty() || std::count(f.only_for.begin(), f.only_for.end(), variant))
          applicable.push_back(f.key);
      }
      std::string hint = suggest(key, names);
      if (!hint.empty()) fail_at(here, "unknown key; did you mean '" + hint + "'?");
      std::string list;
      for (const auto& n : applicable) list += (list.empty() ? "" : ", ") + n;
      fail_at(here, "unknown key; expected one of: " + list);
    }
    const auto& only = field->only_for;
    if (!only.empty() && std::find(only.begin(), only.end(), variant) == only.end())
      fail_at(here, show(value) + " is not allowed with " + variant_path + " \"" + variant +
                        "\"; expected only with " + variant_path + " " + quoted_list(only));
    field->read(value, here);
  }
}

std::string read_document_file(const std::string& path, const std::string& expected) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw ConfigError(path + ": no such file; expected " + expected);
  if (fs::is_directory(st)) throw ConfigError(path + ": is a directory; expected " + expected);
  if (!fs::is_regular_file(st))
    throw ConfigError(path + ": is not a regular file (a pipe or device); expected " + expected);
  std::ifstream in(path, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (!in.is_open() || in.bad()) throw ConfigError(path + ": cannot be read; expected " + expected);
  return text;
}

Json parse_document(const std::string& text, const std::string& source) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw ConfigError(source + ": the file is empty; expected a JSON object");
  // nlohmann reads a NUL as the end of the input and would report a cut-short document.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw ConfigError(source + ": a NUL byte at byte " + std::to_string(nul) +
                      "; expected JSON text");
  // nlohmann keeps the last of duplicate keys silently; a config that sets a key twice
  // is almost always an editing slip, so the parse callback tracks where it is (one
  // frame per open object or array) and remembers the first duplicate. The same frames
  // bound the nesting: nlohmann parses iteratively, but dump() and copies recurse once
  // per level, so a document nested 100,000 deep would overflow the stack later.
  struct Frame {
    bool array = false;
    size_t index = 0;  // elements begun so far (arrays)
    std::string key;   // key being read (objects)
    std::set<std::string> keys;
  };
  std::vector<Frame> frames;
  std::string duplicate;
  auto begin_element = [&] {
    if (!frames.empty() && frames.back().array) ++frames.back().index;
  };
  auto callback = [&](int, Json::parse_event_t ev, Json& parsed) {
    using E = Json::parse_event_t;
    if (ev == E::object_start || ev == E::array_start) {
      if (frames.size() >= kMaxJsonDepth)
        throw ConfigError(source + ": JSON nesting reaches level " +
                          std::to_string(frames.size() + 1) + "; expected at most " +
                          std::to_string(kMaxJsonDepth) + " levels");
      begin_element();
      frames.push_back(Frame{ev == E::array_start, 0, {}, {}});
    } else if (ev == E::object_end || ev == E::array_end) {
      frames.pop_back();
    } else if (ev == E::value) {
      begin_element();
    } else if (ev == E::key) {
      const std::string k = parsed.get<std::string>();
      if (!frames.back().keys.insert(k).second && duplicate.empty()) {
        std::string p;
        for (size_t i = 0; i + 1 < frames.size(); ++i)
          p = frames[i].array ? index_path(p, frames[i].index - 1) : key_path(p, frames[i].key);
        duplicate = key_path(p, k);
      }
      frames.back().key = k;
    }
    return true;
  };
  Json doc;
  try {
    doc = Json::parse(text, callback);
  } catch (const Json::exception& e) {
    // parse_error (syntax, bad UTF-8) and out_of_range (a number too large for
    // a double) alike. Drop nlohmann's "[json.exception.parse_error.101] " tag and cap
    // the text: it quotes the offending token, which may be a 5,000-digit number.
    std::string reason = e.what();
    if (auto p = reason.find("] "); reason.rfind("[json.exception", 0) == 0 && p != reason.npos)
      reason = reason.substr(p + 2);
    constexpr size_t kMaxReason = 160;
    if (reason.size() > kMaxReason) reason = reason.substr(0, kMaxReason - 3) + "...";
    // The token it quotes may be any bytes (a binary file, a checkpoint's corrupt header):
    // written as \xNN outside printable ASCII, so that the message is text.
    std::string shown;
    for (const unsigned char c : reason)
      if (c >= 0x20 && c < 0x7f) shown += static_cast<char>(c);
      else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        shown += hex;
      }
    reason = shown;
    const auto* pe = dynamic_cast<const Json::parse_error*>(&e);
    throw ConfigError(source + ": invalid JSON" +
                      (pe ? " at byte " + std::to_string(pe->byte) : std::string()) + ": " +
                      reason);
  }
  // Named with its file, as a syntax error is: the readers' own wrappers name the file
  // only for what parse_document returns.
  if (!duplicate.empty()) fail_at(source + ": " + duplicate, "duplicate key; expected each key once");
  return doc;
}

}  // namespace ht::config::schema
