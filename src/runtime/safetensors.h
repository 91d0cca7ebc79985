// The safetensors file layout, so that checkpoints are readable by other tools:
//   [8-byte little-endian N][N bytes of JSON header, space-padded to a multiple of 8][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the start of the data section) plus an optional "__metadata__"
// object of string -> string. This file knows only the layout; checksums, atomic writes
// and file names live in checkpoint.h. JSON stays inside the .cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace ht::runtime::safetensors {

// The same cap the reference implementation applies: a larger length field is garbage.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr size_t kLengthBytes = 8;

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

struct Header {
  std::vector<Entry> entries;  // sorted by begin (file order)
  std::map<std::string, std::string> metadata;
};

// "F32" / "I32", the safetensors spelling.
const char* dtype_tag(DType d);

// The length prefix and the padded JSON, ready to write. Entries appear in the given
// order. Throws ht::Error when a name or metadata string is not valid UTF-8.
std::string encode_header(const std::vector<Entry>& entries,
                          const std::map<std::string, std::string>& metadata);

uint64_t decode_length(const unsigned char bytes[kLengthBytes]);

// Parses and validates header JSON against a data section of `data_bytes`: known dtypes,
// shapes that match their byte ranges, ranges inside the data and non-overlapping, and
// no unaccounted bytes. Throws ht::Error describing the problem; the caller adds the
// file name.
Header parse_header(std::string_view json_text, uint64_t data_bytes);

}  // namespace ht::runtime::safetensors
