// Parsing and checking what-if event specs (plan/what_if.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include "config/config.h"
#include "config/spec_fields.h"
#include "plan/what_if.h"

namespace ht::plan {

namespace {

[[noreturn]] void reject(const std::string& spec, const std::string& what) {
  // The spec names the event; the command line adds the option that carried it.
  throw config::ConfigError("what-if event " + config::spec_text(spec, 80) + ": " + what);
}

int rank_value(const std::string& spec, const std::string& key, const std::string& text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  // All digits but past an int: out of range, not malformed.
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size())
    reject(spec, config::field_text(key, text) +
                     " is out of range; expected a rank of the cluster (an integer of at least 0)");
  if (ec != std::errc() || end != text.data() + text.size() || v < 0)
    reject(spec, config::field_text(key, text) + " is not a rank; expected an integer of at least 0");
  return v;
}

// A number from `min` (excluded with above_min) to `max`: the upper bounds keep every sum
// the simulator forms from them finite (a stall of 1.7e308 s printed "inf s").
double real_value(const std::string& spec, const std::string& key, const std::string& text, double min,
                  bool above_min, double max, const char* expected) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v))
    reject(spec, config::field_text(key, text) + " is not a number; expected " + expected);
  if (v < min || (above_min && v == min) || v > max)
    reject(spec, config::field_text(key, text) + " is out of range; expected " + expected);
  return v;
}

struct KindFields {
  WhatIfKind kind;
  std::vector<std::string> fields;  // every one required
};

const std::map<std::string, KindFields>& kinds() {
  static const std::map<std::string, KindFields> k = {
      {"stall", {WhatIfKind::stall, {"rank", "at", "for"}}},
      {"slow", {WhatIfKind::slow, {"rank", "at", "factor"}}},
      {"fail", {WhatIfKind::fail, {"rank", "at"}}},
      {"link", {WhatIfKind::link, {"ranks", "at", "latency", "bandwidth"}}},
      {"join", {WhatIfKind::join, {"device", "at"}}}};
  return k;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

}  // namespace

WhatIfEvent parse_what_if_event(const std::string& spec) {
  WhatIfEvent e;
  e.spec = spec;
  const std::string kind = spec.substr(0, spec.find(':'));
  const auto k = kinds().find(kind);
  if (k == kinds().end())
    reject(spec, "unknown kind '" + config::spec_text(kind) +
                     "'; expected stall, slow, fail, link or join (e.g. stall:rank=1,at=10,for=5)");
  e.kind = k->second.kind;
  const std::vector<std::string>& allowed = k->second.fields;
  std::set<std::string> seen;
  for (const auto& [key, value] : config::spec_fields("what-if event", spec, allowed, joined(allowed))) {
    seen.insert(key);
    if (key == "rank") {
      e.rank = rank_value(spec, key, value);
    } else if (key == "ranks") {
      const size_t dash = value.find('-');
      if (dash == std::string::npos || dash == 0 || value.find('-', dash + 1) != std::string::npos)
        reject(spec, config::field_text("ranks", value) +
                         " is not a rank pair; expected A-B, the two ranks (at least 0) the link joins (e.g. 0-3)");
      e.rank = rank_value(spec, key, value.substr(0, dash));
      e.peer = rank_value(spec, key, value.substr(dash + 1));
      if (e.rank == e.peer)
        reject(spec, config::field_text("ranks", value) + " joins a rank to itself; expected two different ranks");
    } else if (key == "at") {
      e.at_s = real_value(spec, key, value, 0, false, kMaxEventSeconds, "seconds of job time, from 0 to 1e9");
    } else if (key == "for") {
      e.for_s = real_value(spec, key, value, 0, true, kMaxEventSeconds, "seconds, above 0 and at most 1e9");
    } else if (key == "factor") {
      e.factor = real_value(spec, key, value, 1, false, kMaxSlowFactor,
                            "a compute-time multiplier from 1 to 1e6 (2: twice as slow)");
    } else if (key == "latency") {
      e.latency_s = real_value(spec, key, value, 0, false, 1e6, "the one-way latency in milliseconds, from 0 to 1e6") / 1e3;
    } else if (key == "bandwidth") {
      e.bandwidth_bytes_per_s = real_value(spec, key, value, 1e-6, false, 1e9,
                                           "the bandwidth in MB/s (1 MB = 1e6 bytes), from 1e-6 (a byte a second) to 1e9") *
                                1e6;
    } else if (key == "device") {
      if (value.empty()) reject(spec, "device= is empty; expected a device id of the catalogue (e.g. rtx3060)");
      e.device = value;
    }
  }
  std::vector<std::string> missing;
  for (const std::string& f : allowed)
    if (!seen.count(f)) missing.push_back(f);
  if (!missing.empty())
    reject(spec, "missing " + joined(missing) + "; expected " + kind + ":" + [&] {
      std::string s;
      for (size_t i = 0; i < allowed.size(); ++i) s += (i ? "," : "") + allowed[i] + "=...";
      return s;
    }());
  return e;
}

void check_what_if_events(const std::vector<WhatIfEvent>& events, size_t world_size, const Catalogue& catalogue) {
  const auto check_rank = [&](const WhatIfEvent& e, int rank) {
    if (static_cast<size_t>(rank) >= world_size)
      reject(e.spec, "rank " + std::to_string(rank) + " is not in the cluster; expected 0 to " +
                         std::to_string(world_size - 1) + " (the cluster has " + std::to_string(world_size) +
                         " ranks)");
  };
  for (const WhatIfEvent& e : events) {
    if (e.kind == WhatIfKind::join) {
      const bool known = std::any_of(catalogue.devices.begin(), catalogue.devices.end(),
                                     [&](const CatalogueDevice& d) { return d.id == e.device; });
      std::string ids;
      for (const CatalogueDevice& d : catalogue.devices) ids += (ids.empty() ? "" : ", ") + d.id;
      if (!known)
        reject(e.spec, config::field_text("device", e.device) + " is not in the catalogue; expected one of " + ids);
      continue;
    }
    check_rank(e, e.rank);
    if (e.kind == WhatIfKind::link) check_rank(e, e.peer);
  }
}

}  // namespace ht::plan
