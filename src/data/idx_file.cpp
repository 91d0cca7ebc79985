#include "data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace ht::data {

namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Closes the handle on every exit path; the explicit close below reports stream errors.
struct GzCloser {
  gzFile f;
  ~GzCloser() {
    if (f) gzclose_r(f);
  }
};

// Checks the magic number and the payload size of an IDX buffer of rank `rank`; returns
// the dimensions. The payload must be exactly the product of the dimensions: fewer bytes
// is a truncated file, more means the header and the data disagree.
std::vector<int64_t> check_idx(const std::vector<uint8_t>& bytes, uint32_t magic, int rank,
                               const char* kind, const std::string& path) {
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  HT_CHECK(bytes.size() >= header, path, ": IDX header is cut short (", bytes.size(),
           " bytes); expected at least ", header, " bytes (magic + ", rank, " dimensions)");
  const uint32_t got = read_be32(bytes.data());
  HT_CHECK(got == magic, path, ": wrong IDX magic number ", hex32(got), "; expected ",
           hex32(magic), " (uint8 ", kind, ", ", rank, " dimension", rank == 1 ? "" : "s", ")");
  std::vector<int64_t> dims(static_cast<size_t>(rank));
  const uint64_t payload = bytes.size() - header;
  // Three uint32 dimensions can multiply past 2^64 and wrap onto the payload's size;
  // a product beyond the payload already tells the file is truncated.
  uint64_t expected = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i) {
    dims[static_cast<size_t>(i)] = read_be32(bytes.data() + 4 + 4 * i);
    overflow = overflow || __builtin_mul_overflow(
                               expected, static_cast<uint64_t>(dims[static_cast<size_t>(i)]), &expected);
  }
  if (overflow) {
    std::string product;
    for (int64_t d : dims) product += (product.empty() ? "" : " x ") + std::to_string(d);
    fail(path, ": IDX header promises ", product, " bytes, more than 2^64; the payload holds ",
         payload, " bytes (file is truncated or corrupt)");
  }
  HT_CHECK(payload == expected, path, ": IDX payload holds ", payload,
           " bytes but the header promises ", expected, payload < expected
               ? " (file is truncated)" : " (extra bytes after the data)");
  return dims;
}

// gzerror's text starts with the path given to gzopen; drop it, the caller names it.
std::string zlib_message(gzFile f, const std::string& path, int* err) {
  std::string msg = gzerror(f, err);
  const std::string prefix = path + ": ";
  if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
  return msg;
}

// The gzip trailer's last 4 bytes are ISIZE, the uncompressed size mod 2^32 (little
// endian). Only a size hint: a wrong or wrapped value just means the buffer regrows.
// The +1 lets the final zero-byte read find EOF without a resize.
size_t initial_capacity(const std::string& path) {
  constexpr size_t kMin = size_t{1} << 16;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return kMin;
  uint8_t t[4] = {0, 0, 0, 0};
  long compressed = -1;
  if (std::fseek(f, 0, SEEK_END) == 0) compressed = std::ftell(f);
  const bool ok =
      compressed >= 18 && std::fseek(f, -4, SEEK_END) == 0 && std::fread(t, 1, 4, f) == 4;
  std::fclose(f);
  if (!ok) return kMin;
  const size_t isize =
      size_t{t[0]} | (size_t{t[1]} << 8) | (size_t{t[2]} << 16) | (size_t{t[3]} << 24);
  // Deflate expands at most ~1032x; a larger claim is a corrupt trailer.
  return std::max(kMin, std::min(isize + 1, 1032 * static_cast<size_t>(compressed)));
}

}  // namespace

std::vector<uint8_t> read_gzip_file(const std::string& path, uint64_t limit, bool* more) {
  std::error_code ec;
  HT_CHECK(std::filesystem::is_regular_file(path, ec), path,
           std::filesystem::exists(path, ec) ? ": is not a regular file; expected a gzip-compressed IDX file"
                                             : ": file not found");
  errno = 0;
  GzCloser gz{gzopen(path.c_str(), "rb")};
  HT_CHECK(gz.f != nullptr, path, ": cannot open: ",
           errno ? std::strerror(errno) : "out of memory");
  // A big internal buffer and big reads keep the 47 MB training images to a handful of
  // zlib calls, and sizing the output once avoids regrowing (and re-faulting) it.
  gzbuffer(gz.f, 1 << 20);
  // One byte past the limit tells whether the stream holds more than it.
  const uint64_t cap = limit == UINT64_MAX ? limit : limit + 1;
  std::vector<uint8_t> out(static_cast<size_t>(std::min<uint64_t>(initial_capacity(path), cap)));
  size_t size = 0;
  for (;;) {
    if (size == cap) break;
    if (size == out.size()) out.resize(static_cast<size_t>(std::min<uint64_t>(out.size() * 2, cap)));
    const size_t want = std::min<size_t>(out.size() - size, INT_MAX);
    const int got = gzread(gz.f, out.data() + size, static_cast<unsigned>(want));
    if (got < 0) {
      int err = Z_OK;
      fail(path, ": corrupt gzip stream (zlib: ", zlib_message(gz.f, path, &err), ")");
    }
    if (got == 0) break;
    size += static_cast<size_t>(got);
  }
  if (size == cap && cap != limit) {
    // Stopped early: the stream's end (and its trailer) was not reached, so only report.
    HT_CHECK(gzdirect(gz.f) == 0, path, ": not a gzip stream (no gzip header)");
    HT_CHECK(more != nullptr, path, ": decompresses to more than ", limit, " bytes; expected at most ", limit);
    *more = true;
    out.resize(static_cast<size_t>(limit));
    return out;
  }
  if (more) *more = false;
  out.resize(size);
  // zlib reports an input that ends inside the deflate stream as Z_BUF_ERROR
  // ("unexpected end of file") rather than as a failed read.
  int err = Z_OK;
  const std::string msg = zlib_message(gz.f, path, &err);
  HT_CHECK(err == Z_OK, path, err == Z_BUF_ERROR ? ": truncated gzip stream (zlib: "
                                                 : ": gzip read error (zlib: ", msg, ")");
  // gzread passes non-gzip input through unchanged; these files must be gzipped.
  const bool direct = gzdirect(gz.f) != 0;
  const int rc = gzclose_r(gz.f);
  gz.f = nullptr;
  HT_CHECK(rc == Z_OK, path, rc == Z_BUF_ERROR ? ": truncated gzip stream"
                                               : ": error closing gzip stream");
  HT_CHECK(size > 0 || !direct, path, ": file is empty; expected a gzip stream");
  HT_CHECK(!direct, path, ": not a gzip stream (no gzip header)");
  return out;
}

IdxImages parse_idx_images(std::vector<uint8_t> bytes, const std::string& path) {
  const auto dims = check_idx(bytes, kIdxImagesMagic, 3, "images", path);
  IdxImages r;
  r.count = dims[0];
  r.rows = dims[1];
  r.cols = dims[2];
  bytes.erase(bytes.begin(), bytes.begin() + 16);  // drop the header, keep the buffer
  r.pixels = std::move(bytes);
  return r;
}

IdxLabels parse_idx_labels(std::vector<uint8_t> bytes, const std::string& path) {
  check_idx(bytes, kIdxLabelsMagic, 1, "labels", path);
  IdxLabels r;
  bytes.erase(bytes.begin(), bytes.begin() + 8);
  r.labels = std::move(bytes);
  return r;
}

namespace {

// The decompressed file, read no further than its header promises: deflate expands up to
// about 1000x, so a small file could otherwise claim gigabytes it never holds. The header
// is read first, then exactly the payload it promises; a longer stream fails as extra
// bytes, a shorter or an overflowing promise in check_idx.
std::vector<uint8_t> read_idx_bytes(const std::string& path, int rank) {
  const uint64_t header = 4 + 4 * static_cast<uint64_t>(rank);
  bool more = false;
  const std::vector<uint8_t> head = read_gzip_file(path, header, &more);
  if (head.size() < header) return head;  // check_idx names the short header
  uint64_t promised = 1;
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(promised, uint64_t{read_be32(head.data() + 4 + 4 * i)}, &promised))
      return head;  // check_idx names the overflow
  if (__builtin_add_overflow(promised, header, &promised)) return head;
  std::vector<uint8_t> bytes = read_gzip_file(path, promised, &more);
  HT_CHECK(!more, path, ": IDX payload holds more than the ", promised - header,
           " bytes the header promises (extra bytes after the data)");
  return bytes;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  return parse_idx_images(read_idx_bytes(path, 3), path);
}

IdxLabels read_idx_labels(const std::string& path) {
  return parse_idx_labels(read_idx_bytes(path, 1), path);
}

}  // namespace ht::data
