// The fields of a one-line spec `kind:key=value,...` given on the command line (the
// testing aid --inject, what-if events): split, each key one of the kind's, none twice.
#pragma once

#include <string>
#include <vector>

namespace ht::config {

struct SpecField {
  std::string key, value;
};

// `s` as a message shows it: each byte outside printable ASCII as \xNN, and cut to `max`
// characters with "..." (a spec or value of thousands of characters would bury the rest
// of the message, and a newline would split it).
std::string spec_text(const std::string& s, size_t max = 60);
// A field as a message shows it: key=value, the value through spec_text.
inline std::string field_text(const std::string& key, const std::string& value) {
  return key + "=" + spec_text(value);
}

// The fields after the spec's colon (none without one), in order. `allowed` are the
// kind's keys, as `allowed_text` lists them in messages. A field that is not key=value,
// an unknown key or a key given twice throws ConfigError "<what> <spec>: ...", naming it.
std::vector<SpecField> spec_fields(const std::string& what, const std::string& spec,
                                   const std::vector<std::string>& allowed, const std::string& allowed_text);

}  // namespace ht::config
