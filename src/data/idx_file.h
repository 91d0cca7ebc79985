// Gzipped IDX files (the MNIST / Fashion-MNIST container): a big-endian header
// (magic 0x000008TT with TT the rank, then one uint32 per dimension) followed by the
// raw uint8 payload. Only the uint8 rank-1 (labels) and rank-3 (images) forms are read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht::data {

// The whole decompressed content of a gzip file, read with zlib in large chunks.
// Throws ht::Error naming `path` when the file is missing or unreadable, is not a
// gzip stream, is corrupt, or ends in the middle of the stream (truncated). Reads at
// most `limit` bytes: a longer stream sets `*more` and returns the first `limit`
// (unverified past them), or without `more` is an error.
std::vector<uint8_t> read_gzip_file(const std::string& path, uint64_t limit = UINT64_MAX,
                                    bool* more = nullptr);

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // (count, rows, cols), row-major
};

struct IdxLabels {
  std::vector<uint8_t> labels;  // (count)
};

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8, rank 3
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8, rank 1

// Parse an in-memory IDX buffer; `path` only names the source in errors. Checks the
// magic number and that the payload is exactly what the header promises.
IdxImages parse_idx_images(std::vector<uint8_t> bytes, const std::string& path);
IdxLabels parse_idx_labels(std::vector<uint8_t> bytes, const std::string& path);

// read_gzip_file + parse.
IdxImages read_idx_images(const std::string& path);
IdxLabels read_idx_labels(const std::string& path);

}  // namespace ht::data
