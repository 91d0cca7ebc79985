// A device as a config names it: "cpu", "cuda", "cuda:N" or "auto". Parsed here, in the
// core, so that the config's reader and device selection (backend/cuda/device_select.h)
// accept the same forms.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ht {

struct DeviceRequest {
  enum class Kind { cpu, cuda, automatic };
  Kind kind = Kind::cpu;
  int index = -1;  // cuda:N; -1 picks by local rank
  std::string text;  // as written, for messages
};

// The accepted forms, for messages: "\"cpu\", \"cuda\", ... or \"auto\"".
extern const char* const kDeviceForms;

// `text` in double quotes, as the device messages name what was written.
std::string quoted(std::string_view text);

// nullopt where `text` is none of the forms.
std::optional<DeviceRequest> try_parse_device(std::string_view text);
// Throws ht::Error naming the text and the accepted forms.
DeviceRequest parse_device(std::string_view text);

}  // namespace ht
