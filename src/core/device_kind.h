// What a device is, for the backends, the probe's fingerprints and the planner's cluster
// model alike. Files spell it "cpu" or "cuda"; code compares the enum.
#pragma once

#include "core/enum_names.h"

namespace ht {

enum class DeviceKind { cpu, cuda };

inline constexpr EnumName<DeviceKind> kDeviceKindNames[] = {{DeviceKind::cpu, "cpu"},
                                                            {DeviceKind::cuda, "cuda"}};
inline const char* to_string(DeviceKind k) { return enum_name(k, kDeviceKindNames); }
inline std::vector<std::string> device_kind_names() { return enum_names(kDeviceKindNames); }
inline std::optional<DeviceKind> parse_device_kind(std::string_view s) {
  return enum_from_name(s, kDeviceKindNames);
}

}  // namespace ht
