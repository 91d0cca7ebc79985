#include "config/spec_fields.h"

#include <algorithm>
#include <cstdio>

#include "config/config.h"

namespace ht::config {

std::string spec_text(const std::string& s, size_t max) {
  std::string out;
  for (const unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
    if (out.size() > max) return out.substr(0, max > 3 ? max - 3 : 0) + "...";
  }
  return out;
}

std::vector<SpecField> spec_fields(const std::string& what, const std::string& spec,
                                   const std::vector<std::string>& allowed, const std::string& allowed_text) {
  auto reject = [&](const std::string& why) { throw ConfigError(what + " " + spec_text(spec, 80) + ": " + why); };
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string fields = colon == std::string::npos ? "" : spec.substr(colon + 1);
  std::vector<SpecField> out;
  for (size_t pos = 0; !fields.empty() && pos <= fields.size();) {
    const size_t comma = std::min(fields.find(',', pos), fields.size());
    const std::string item = fields.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      reject("field '" + spec_text(item) + "' is not key=value; expected the fields of " + spec_text(kind) + " (" +
             allowed_text + ") as key=value, comma-separated");
    SpecField f{item.substr(0, eq), item.substr(eq + 1)};
    if (std::find(allowed.begin(), allowed.end(), f.key) == allowed.end())
      reject("unknown field '" + spec_text(f.key) + "' for " + spec_text(kind) + "; expected " + allowed_text);
    if (std::any_of(out.begin(), out.end(), [&](const SpecField& o) { return o.key == f.key; }))
      reject("field '" + f.key + "' is given twice; expected it once");
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace ht::config
