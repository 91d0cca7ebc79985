// CRC-32 (zlib's polynomial) for checksums people compare: checkpoint data, config and
// plan hashes, replica parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ht {

// Continues `crc` over `bytes` at `data`; start a new checksum from 0. Any length.
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);

// 8 lowercase hex digits.
std::string crc32_hex(uint32_t crc);

}  // namespace ht
