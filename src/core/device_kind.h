// What a device is, for the backends, the probe's fingerprints and the planner's cluster
// model alike. Files spell it "cpu" or "cuda"; code compares the enum.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ht {

enum class DeviceKind { cpu, cuda };

inline const char* to_string(DeviceKind k) { return k == DeviceKind::cuda ? "cuda" : "cpu"; }

// The spellings, in the order messages list them.
inline std::vector<std::string> device_kind_names() { return {"cpu", "cuda"}; }

inline std::optional<DeviceKind> parse_device_kind(std::string_view s) {
  for (DeviceKind k : {DeviceKind::cpu, DeviceKind::cuda})
    if (s == to_string(k)) return k;
  return std::nullopt;
}

}  // namespace ht
