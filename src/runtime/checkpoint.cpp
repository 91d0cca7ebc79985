#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <set>
#include <sstream>
#include <system_error>

#include "core/crc32.h"
#include "core/error.h"
#include "runtime/atomic_file.h"
#include "runtime/safetensors.h"

namespace ht::runtime {

namespace {

namespace st = safetensors;

std::string filename_of(const std::string& path) {
  std::string f = std::filesystem::path(path).filename().string();
  return f.empty() ? path : f;
}

// Reads exactly `bytes` at `offset`, or throws naming what came up short.
void read_exact(int fd, uint64_t offset, void* out, size_t bytes, const char* what) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read the ", what, ": ", std::system_category().message(errno));
    if (n == 0) fail("truncated while reading the ", what, " (the file shrank?)");
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Where the 8 digits of the checksum start in the raw header text. The writer emits the
// key once, unescaped and directly followed by its string value; a header with the
// sequence twice (e.g. inside a tensor entry) or only in escaped form is not one it wrote.
size_t crc_digits_at(const std::string& header) {
  const std::string needle = std::string("\"") + kCrcKey + "\":\"";
  const size_t at = header.find(needle);
  HT_CHECK(at != std::string::npos && header.find(needle, at + 1) == std::string::npos,
           "\"", kCrcKey, "\" appears ", at == std::string::npos ? "escaped or not at all" : "twice",
           " in the header text; expected it once, as the writer puts it");
  const size_t digits = at + needle.size();
  HT_CHECK(digits + 9 <= header.size() && header[digits + 8] == '"', "\"", kCrcKey,
           "\" in the header text is not followed by 8 digits and a closing quote");
  return digits;
}

// The body of read_checkpoint; errors here describe the problem and the caller prefixes
// the file name once.
Checkpoint read_unprefixed(const std::string& path) {
  // Non-blocking, so that opening a FIFO returns at once and is refused below instead of
  // waiting for a writer (no effect on a regular file's reads).
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) fail("cannot open: ", std::system_category().message(errno));
  struct stat sb {};
  if (::fstat(f.fd, &sb) != 0) fail("cannot stat: ", std::system_category().message(errno));
  HT_CHECK(S_ISREG(sb.st_mode), "not a regular file (a ",
           S_ISDIR(sb.st_mode) ? "directory" : S_ISFIFO(sb.st_mode) ? "pipe" : "special file",
           "); expected a checkpoint file written by hetrain train");
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  HT_CHECK(size >= st::kLengthBytes, "truncated: the file has ", size,
           " bytes, less than the 8-byte header length field");

  unsigned char len[st::kLengthBytes];
  read_exact(f.fd, 0, len, sizeof len, "header length");
  const uint64_t n = st::decode_length(len);
  HT_CHECK(n <= st::kMaxHeaderBytes, "header length field says ", n,
           " bytes, over the limit of ", st::kMaxHeaderBytes, " (corrupt or not safetensors)");
  HT_CHECK(n <= size - st::kLengthBytes, "truncated: header length field says ", n,
           " bytes, but the file has only ", size - st::kLengthBytes, " bytes after it");

  std::string text(n, '\0');
  read_exact(f.fd, st::kLengthBytes, text.data(), n, "header");
  const uint64_t data_bytes = size - st::kLengthBytes - n;
  st::Header h = st::parse_header(text, data_bytes);

  auto fmt = h.metadata.find(kFormatKey);
  HT_CHECK(fmt != h.metadata.end(), "no \"", kFormatKey,
           "\" in __metadata__ (a safetensors file, but not a hetrain checkpoint)");
  HT_CHECK(fmt->second != "1", kFormatKey, " is '1': written by an older hetrain whose checksum ",
           "covers only the data, so its header (step, data position) cannot be verified; ",
           "expected format ", kFormat, " (resume from a newer checkpoint or start afresh)");
  HT_CHECK(fmt->second == kFormat, kFormatKey, " is '", fmt->second, "'; this build reads format ",
           kFormat);
  auto crc_it = h.metadata.find(kCrcKey);
  HT_CHECK(crc_it != h.metadata.end(), "no \"", kCrcKey, "\" in __metadata__");
  uint32_t want = 0;
  const std::string& hex = crc_it->second;
  auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), want, 16);
  // Lowercase only, as written: "A" for "a" would change the file without changing the sum.
  HT_CHECK(ec == std::errc() && end == hex.data() + hex.size() && hex.size() == 8 &&
               hex.find_first_not_of("0123456789abcdef") == std::string::npos,
           kCrcKey, " is '", hex, "'; expected 8 lowercase hex digits");
  // The checksum covers the file as written with its own digits zeroed; find them in the
  // raw header text, where the writer put them (the parsed header cannot say where).
  const size_t at = crc_digits_at(text);

  std::vector<unsigned char> data;
  try {
    data.resize(data_bytes);
  } catch (const std::bad_alloc&) {
    fail("its ", data_bytes, " bytes of tensor data do not fit in this host's memory (the header declares them; "
         "expected a checkpoint of this config's model)");
  } catch (const std::length_error&) {
    fail("its ", data_bytes, " bytes of tensor data are more than one buffer can hold");
  }
  read_exact(f.fd, st::kLengthBytes + n, data.data(), data.size(), "tensor data");
  std::string zeroed = text;
  zeroed.replace(at, 8, crc32_hex(0));
  uint32_t got = crc32_update(0, len, sizeof len);
  got = crc32_update(got, zeroed.data(), zeroed.size());
  got = crc32_update(got, data.data(), data.size());
  HT_CHECK(got == want, "checksum mismatch: the header records crc32 ", crc32_hex(want),
           ", the file has ", crc32_hex(got), " (the header or the data is corrupt)");

  Checkpoint ck;
  ck.path = path;
  for (const st::Entry& e : h.entries) {
    const unsigned char* src = data.data() + e.begin;
    const size_t count = static_cast<size_t>((e.end - e.begin) / dtype_size(e.dtype));
    if (e.dtype == DType::f32) {
      std::vector<float> v(count);
      if (count) std::memcpy(v.data(), src, count * sizeof(float));
      // Written finite (write_checkpoint refuses anything else), so a non-finite value is
      // damage the checksum did not catch, or another writer's: resuming from it would
      // train on and never checkpoint again.
      for (size_t i = 0; i < count; ++i)
        HT_CHECK(std::isfinite(v[i]), "tensor '", e.name, "' holds ", v[i], " at element ", i, " of ", count,
                 "; expected finite values, as hetrain writes them");
      ck.tensors.emplace(e.name, Tensor::from_vector(v, e.shape, cpu_backend()));
    } else {
      std::vector<int32_t> v(count);
      if (count) std::memcpy(v.data(), src, count * sizeof(int32_t));
      ck.tensors.emplace(e.name, Tensor::from_ints(v, e.shape, cpu_backend()));
    }
  }
  h.metadata.erase(kFormatKey);
  h.metadata.erase(kCrcKey);
  ck.metadata = std::move(h.metadata);
  return ck;
}

}  // namespace

namespace {

// A checkpoint with valid CRC is what --resume trusts: a non-finite value would poison
// every run resumed from it, so such a model is never written.
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i)
    HT_CHECK(std::isfinite(v[i]), "not writing checkpoint ", path, ": tensor '", name, "' holds ", v[i],
             " at element ", i, " of ", v.size(), "; a non-finite model is never written, so the newest "
             "checkpoint already written stays the newest valid one");
}

}  // namespace

void write_checkpoint(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything that can be checked without the disk is checked first, so a bad call
  // never creates a file.
  for (const char* key : {kCrcKey, kFormatKey})
    HT_CHECK(!metadata.count(key), "write_checkpoint ", path, ": metadata key '", key,
             "' is reserved for the writer");
  std::set<std::string> seen;
  std::vector<st::Entry> entries;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    HT_CHECK(!name.empty() && name != "__metadata__", "write_checkpoint ", path,
             ": invalid tensor name '", name, "'");
    HT_CHECK(seen.insert(name).second, "write_checkpoint ", path, ": duplicate tensor name '",
             name, "'");
    HT_CHECK(t.defined(), "write_checkpoint ", path, ": tensor '", name, "' is undefined");
    if (t.dtype() == DType::f32) check_finite(path, name, t);
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    entries.push_back({name, t.dtype(), t.shape(), offset, offset + bytes});
    offset += bytes;
  }

  // The CRC goes in the header but covers the whole file with its own digits zeroed, so
  // the header is written with zeros in their place (that is what is summed) and
  // rewritten at the end. This streams one tensor at a time instead of holding a host
  // copy of the whole model.
  std::map<std::string, std::string> meta = metadata;
  meta.insert_or_assign(kFormatKey, std::string(kFormat));  // not operator=: GCC 12 -Wrestrict false positive
  meta[kCrcKey] = crc32_hex(0);
  const std::string zeroed_header = st::encode_header(entries, meta);

  AtomicFile out(path, "checkpoint");
  out.write(zeroed_header.data(), zeroed_header.size());
  uint32_t crc = crc32_update(0, zeroed_header.data(), zeroed_header.size());
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    if (t.dtype() == DType::f32) {
      std::vector<float> v = t.to_vector();
      crc = crc32_update(crc, v.data(), v.size() * sizeof(float));
      out.write(v.data(), v.size() * sizeof(float));
    } else {
      std::vector<int32_t> v = t.to_ints();
      crc = crc32_update(crc, v.data(), v.size() * sizeof(int32_t));
      out.write(v.data(), v.size() * sizeof(int32_t));
    }
  }
  meta[kCrcKey] = crc32_hex(crc);
  const std::string header = st::encode_header(entries, meta);
  HT_CHECK(header.size() == zeroed_header.size(), "write_checkpoint: header size changed");
  out.write_at(0, header.data(), header.size());
  out.commit();
}

Checkpoint read_checkpoint(const std::string& path) {
  try {
    return read_unprefixed(path);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    fail("checkpoint ", path, ": ", e.what());
  }
}

void load_into(const std::vector<nn::NamedTensor>& into, const Checkpoint& checkpoint,
               const std::string& prefix) {
  // Collect every problem first: fixing a model/checkpoint mismatch one error at a time
  // is slow, and a partial load must never happen.
  std::vector<std::string> problems;
  std::set<std::string> names;
  for (const auto& [name, t] : into) {
    if (!names.insert(name).second) {
      problems.push_back("tensor '" + name + "' appears twice in the model");
      continue;
    }
    auto it = checkpoint.tensors.find(name);
    if (it == checkpoint.tensors.end()) {
      problems.push_back("tensor '" + name + "' of shape " + to_string(t.shape()) +
                         " is missing from the checkpoint");
      continue;
    }
    const Tensor& src = it->second;
    if (src.shape() != t.shape())
      problems.push_back("tensor '" + name + "' has shape " + to_string(src.shape()) +
                         " in the checkpoint and " + to_string(t.shape()) + " in the model");
    else if (src.dtype() != t.dtype())
      problems.push_back("tensor '" + name + "' is " + dtype_name(src.dtype()) +
                         " in the checkpoint and " + dtype_name(t.dtype()) + " in the model");
  }
  for (const auto& [name, t] : checkpoint.tensors)
    if (name.starts_with(prefix) && !names.count(name))
      problems.push_back("tensor '" + name + "' of shape " + to_string(t.shape()) +
                         " is in the checkpoint but not in the model");
  if (!problems.empty()) {
    // A checkpoint of another model differs in every tensor: the first few say what is
    // wrong, and a line of hundreds would hide the message's end.
    constexpr size_t kShown = 8;
    std::ostringstream s;
    s << "checkpoint " << filename_of(checkpoint.path) << " does not match the model: ";
    for (size_t i = 0; i < std::min(problems.size(), kShown); ++i) s << (i ? "; " : "") << problems[i];
    if (problems.size() > kShown)
      s << "; and " << problems.size() - kShown << " more of " << problems.size() << " mismatches";
    size_t shared = 0;
    for (const auto& [name, t] : into) shared += checkpoint.tensors.count(name);
    if (shared == 0) s << " (none of the model's tensors is in it: it holds another model)";
    throw Error(s.str());
  }

  for (const auto& [name, t] : into) {
    const Tensor& src = checkpoint.tensors.at(name);
    // A released tensor (a block outside this rank's stage) was checked above, kept not.
    if (t.numel() == 0 || t.released()) continue;
    Backend& be = t.backend();
    const bool f32 = t.dtype() == DType::f32;
    std::vector<float> fv;
    std::vector<int32_t> iv;
    const void* host = nullptr;
    if (f32) host = (fv = src.to_vector()).data();
    else host = (iv = src.to_ints()).data();
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    if (t.is_contiguous()) {
      be.copy_from_host(f32 ? static_cast<void*>(t.data()) : static_cast<void*>(t.data_i32()),
                        host, bytes);
    } else {
      // A strided view (rare for parameters): stage densely on its backend, then let the
      // backend scatter through the view's strides.
      Tensor staged = f32 ? Tensor::from_vector(fv, t.shape(), be) : Tensor::from_ints(iv, t.shape(), be);
      be.copy(staged.raw(), staged.strides(), t.raw(), t.strides(), t.shape());
    }
  }
}

}  // namespace ht::runtime
