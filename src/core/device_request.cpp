#include "core/device_request.h"

#include <charconv>

#include "core/error.h"

namespace ht {

const char* const kDeviceForms =
    "\"cpu\", \"cuda\", \"cuda:N\" (N a GPU index from 0) or \"auto\"";

std::string quoted(std::string_view text) {
  std::string q(1, '"');
  q.append(text);
  q += '"';
  return q;
}

namespace {

// The index of "cuda:N", or -1 where N is not a whole number from 0.
int cuda_index(std::string_view digits) {
  int index = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0) return -1;
  return index;
}

}  // namespace

std::optional<DeviceRequest> try_parse_device(std::string_view text) {
  DeviceRequest r;
  r.text = std::string(text);
  if (text == "cpu") return r;
  if (text == "auto") {
    r.kind = DeviceRequest::Kind::automatic;
    return r;
  }
  if (text == "cuda") {
    r.kind = DeviceRequest::Kind::cuda;
    return r;
  }
  if (text.starts_with("cuda:")) {
    r.index = cuda_index(text.substr(5));
    if (r.index < 0) return std::nullopt;
    r.kind = DeviceRequest::Kind::cuda;
    return r;
  }
  return std::nullopt;
}

DeviceRequest parse_device(std::string_view text) {
  if (std::optional<DeviceRequest> r = try_parse_device(text)) return *r;
  if (text.starts_with("cuda:"))
    fail("device ", quoted(text), ": the GPU index ", quoted(text.substr(5)),
         " is not a whole number from 0; expected ", kDeviceForms);
  fail("device ", quoted(text), " is not a device; expected ", kDeviceForms);
}

}  // namespace ht
