#include "core/crc32.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>

namespace ht {

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  // zlib takes 32-bit lengths; feed it in chunks so buffers over 4 GiB work.
  const auto* p = static_cast<const Bytef*>(data);
  constexpr size_t kChunk = size_t{1} << 30;
  while (bytes > 0) {
    const size_t n = std::min(bytes, kChunk);
    crc = static_cast<uint32_t>(::crc32(crc, p, static_cast<uInt>(n)));
    p += n;
    bytes -= n;
  }
  return crc;
}

std::string crc32_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

}  // namespace ht
