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
Checkpoint read_unprefixed(const std::string& path, bool keep_values) {
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
  std::string zeroed = text;
  zeroed.replace(at, 8, crc32_hex(0));
  uint32_t got = crc32_update(0, len, sizeof len);
  got = crc32_update(got, zeroed.data(), zeroed.size());

  Checkpoint ck;
  ck.path = path;
  // The data is read in chunks, summed, checked finite and, with keep_values, copied into
  // tensors; without, the reader holds one chunk, not the file, and get() reads a tensor
  // from the verified file when asked (every rank of a pipeline resumes from the whole
  // model's checkpoint and keeps its own stage).
  std::vector<Tensor> into(h.entries.size());
  auto source = std::make_shared<CheckpointSource>();
  for (size_t e = 0; e < h.entries.size(); ++e) {
    const st::Entry& entry = h.entries[e];
    ck.table.emplace(entry.name, CheckpointSlot{entry.name, entry.dtype, entry.shape});
    source->ranges.emplace(entry.name, std::make_pair(st::kLengthBytes + n + entry.begin, entry.end - entry.begin));
    if (keep_values) into[e] = Tensor::empty(entry.shape, entry.dtype, cpu_backend(), "checkpoint tensor");
  }
  // A multiple of 4 bytes, so that no float straddles two chunks (every entry starts at a
  // multiple of 4 within the data).
  constexpr uint64_t kChunk = 8u << 20;
  std::vector<unsigned char> chunk(static_cast<size_t>(std::min<uint64_t>(kChunk, std::max<uint64_t>(data_bytes, 1))));
  size_t e = 0;
  std::string non_finite;  // the first non-finite value found
  for (uint64_t done = 0; done < data_bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), data_bytes - done));
    read_exact(f.fd, st::kLengthBytes + text.size() + done, chunk.data(), n, "tensor data");
    got = crc32_update(got, chunk.data(), n);
    // The entries over [done, done + n), in file order.
    while (e < h.entries.size() && h.entries[e].end <= done) ++e;
    for (size_t k = e; k < h.entries.size() && h.entries[k].begin < done + n; ++k) {
      const st::Entry& entry = h.entries[k];
      const uint64_t from = std::max(entry.begin, done), to = std::min(entry.end, done + n);
      if (from >= to) continue;
      const unsigned char* src = chunk.data() + (from - done);
      if (entry.dtype == DType::f32) {
        // Written finite (write_checkpoint refuses anything else), so a non-finite value is
        // damage the checksum did not catch, or another writer's: resuming from it would
        // train on and never checkpoint again.
        // Said after the checksum, which names damage first.
        const uint64_t first = (from - entry.begin) / sizeof(float), count = (to - from) / sizeof(float);
        for (uint64_t i = 0; i < count && non_finite.empty(); ++i) {
          float v;
          std::memcpy(&v, src + i * sizeof(float), sizeof v);
          if (!std::isfinite(v)) {
            std::ostringstream m;
            m << "tensor '" << entry.name << "' holds " << v << " at element " << first + i << " of "
              << (entry.end - entry.begin) / sizeof(float) << "; expected finite values, as hetrain writes them";
            non_finite = m.str();
          }
        }
      }
      if (into[k].defined())
        std::memcpy(static_cast<unsigned char*>(into[k].raw()) + (from - entry.begin), src, static_cast<size_t>(to - from));
    }
    done += n;
  }
  HT_CHECK(got == want, "checksum mismatch: the header records crc32 ", crc32_hex(want),
           ", the file has ", crc32_hex(got), " (the header or the data is corrupt)");
  HT_CHECK(non_finite.empty(), non_finite);
  for (size_t k = 0; k < h.entries.size(); ++k)
    if (into[k].defined()) ck.tensors.emplace(h.entries[k].name, std::move(into[k]));
  if (!keep_values) {
    source->fd = f.fd;
    f.fd = -1;  // the source closes it
    source->size = size;
    source->mtime_ns = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1'000'000'000 + sb.st_mtim.tv_nsec;
    ck.source = std::move(source);
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
void check_finite(const std::string& path, const std::string& name, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    HT_CHECK(std::isfinite(v[i]), "not writing checkpoint ", path, ": tensor '", name, "' holds ", v[i],
             " at element ", i, " of ", n, "; a non-finite model is never written, so the newest "
             "checkpoint already written stays the newest valid one");
}

// The table's entries, laid out in order from the start of the data section.
std::vector<st::Entry> entries_of(const std::vector<CheckpointSlot>& slots) {
  std::vector<st::Entry> entries;
  uint64_t offset = 0;
  for (const CheckpointSlot& slot : slots) {
    const uint64_t bytes = static_cast<uint64_t>(numel(slot.shape)) * dtype_size(slot.dtype);
    entries.push_back({slot.name, slot.dtype, slot.shape, offset, offset + bytes});
    offset += bytes;
  }
  return entries;
}

// A tensor's values in host memory: its own where it is a dense host tensor, else a copy
// made in `f` or `i` (one tensor at a time: the writer never holds more).
const void* host_values(const Tensor& t, std::vector<float>& f, std::vector<int32_t>& i) {
  if (t.backend().kind() == DeviceKind::cpu && t.is_contiguous()) return t.raw();
  if (t.dtype() == DType::f32) return (f = t.to_vector()).data();
  return (i = t.to_ints()).data();
}

}  // namespace

CheckpointWriter::CheckpointWriter(const std::string& path, std::vector<CheckpointSlot> slots,
                                   const std::map<std::string, std::string>& metadata)
    : path_(path), slots_(std::move(slots)), metadata_(metadata) {
  // Everything that can be checked without the disk is checked first, so a bad call
  // never creates a file.
  for (const char* key : {kCrcKey, kFormatKey})
    HT_CHECK(!metadata_.count(key), "write_checkpoint ", path, ": metadata key '", key,
             "' is reserved for the writer");
  std::set<std::string> seen;
  for (const CheckpointSlot& slot : slots_) {
    HT_CHECK(!slot.name.empty() && slot.name != "__metadata__", "write_checkpoint ", path,
             ": invalid tensor name '", slot.name, "'");
    HT_CHECK(seen.insert(slot.name).second, "write_checkpoint ", path, ": duplicate tensor name '", slot.name, "'");
  }
  // The CRC goes in the header but covers the whole file with its own digits zeroed, so
  // the header is written with zeros in their place (that is what is summed) and
  // rewritten at the end.
  metadata_.insert_or_assign(kFormatKey, std::string(kFormat));  // not operator=: GCC 12 -Wrestrict false positive
  metadata_[kCrcKey] = crc32_hex(0);
  zeroed_header_ = st::encode_header(entries_of(slots_), metadata_);
  out_ = std::make_unique<AtomicFile>(path, "checkpoint");
  out_->write(zeroed_header_.data(), zeroed_header_.size());
  crc_ = crc32_update(0, zeroed_header_.data(), zeroed_header_.size());
}

CheckpointWriter::~CheckpointWriter() = default;  // AtomicFile removes an uncommitted file

void CheckpointWriter::write(const Tensor& t) {
  HT_CHECK(out_ && next_ < slots_.size(), "write_checkpoint ", path_, ": a tensor past the table's ", slots_.size());
  const CheckpointSlot& slot = slots_[next_];
  HT_CHECK(t.defined(), "write_checkpoint ", path_, ": tensor '", slot.name, "' is undefined");
  HT_CHECK(t.shape() == slot.shape && t.dtype() == slot.dtype, "write_checkpoint ", path_, ": tensor '", slot.name,
           "' is ", dtype_name(t.dtype()), " ", to_string(t.shape()), "; its table entry says ",
           dtype_name(slot.dtype), " ", to_string(slot.shape));
  const size_t n = static_cast<size_t>(t.numel());
  if (n > 0) {
    std::vector<float> f;
    std::vector<int32_t> i;
    const void* host = host_values(t, f, i);
    if (t.dtype() == DType::f32) {
      try {
        check_finite(path_, slot.name, static_cast<const float*>(host), n);
      } catch (const Error&) {
        out_.reset();  // the temporary file goes before the error does
        throw;
      }
    }
    const size_t bytes = n * dtype_size(t.dtype());
    crc_ = crc32_update(crc_, host, bytes);
    out_->write(host, bytes);
  }
  ++next_;
}

void CheckpointWriter::commit() {
  HT_CHECK(out_ && next_ == slots_.size(), "write_checkpoint ", path_, ": ", next_, " of the table's ",
           slots_.size(), " tensors written; expected all before the commit");
  metadata_[kCrcKey] = crc32_hex(crc_);
  const std::string header = st::encode_header(entries_of(slots_), metadata_);
  HT_CHECK(header.size() == zeroed_header_.size(), "write_checkpoint: header size changed");
  out_->write_at(0, header.data(), header.size());
  out_->commit();
  out_.reset();
}

void write_checkpoint(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<CheckpointSlot> slots;
  for (const auto& [name, t] : tensors) {
    HT_CHECK(t.defined(), "write_checkpoint ", path, ": tensor '", name, "' is undefined");
    if (t.dtype() == DType::f32 && t.numel() > 0) {  // before the file exists: a bad model never creates one
      std::vector<float> f;
      std::vector<int32_t> i;
      check_finite(path, name, static_cast<const float*>(host_values(t, f, i)), static_cast<size_t>(t.numel()));
    }
    slots.push_back({name, t.dtype(), t.shape()});
  }
  CheckpointWriter out(path, std::move(slots), metadata);
  for (const auto& [name, t] : tensors) out.write(t);
  out.commit();
}

CheckpointSource::~CheckpointSource() {
  if (fd >= 0) ::close(fd);
}

Tensor Checkpoint::get(const std::string& name) const {
  if (const auto it = tensors.find(name); it != tensors.end()) return it->second;
  const auto slot = table.find(name);
  HT_CHECK(slot != table.end(), "checkpoint ", path, " holds no tensor '", name, "'");
  HT_CHECK(source != nullptr, "checkpoint ", path, ": tensor '", name,
           "' was not kept when the file was read; expected it read with its values");
  // The file stays open from its verification; one changed since (another writer over the
  // same file, not a rename, which leaves the open one as it was) is refused.
  struct stat sb {};
  if (::fstat(source->fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != source->size ||
      static_cast<int64_t>(sb.st_mtim.tv_sec) * 1'000'000'000 + sb.st_mtim.tv_nsec != source->mtime_ns)
    fail_as<CheckpointReadError>("checkpoint ", path,
                                 " changed after it was verified; expected it left as it was while the run resumes");
  const auto [offset, bytes] = source->ranges.at(name);
  Tensor t;
  {
    // A host copy on its way into a tensor the caller holds (on its device, or under the
    // cap a CPU rank's device is): staging, outside that cap.
    Allocator::HostStaging staging;
    t = Tensor::empty(slot->second.shape, slot->second.dtype, cpu_backend(), "checkpoint tensor");
  }
  try {
    if (bytes > 0) read_exact(source->fd, offset, t.raw(), static_cast<size_t>(bytes), "tensor data");
  } catch (const Error& e) {
    fail_as<CheckpointReadError>("checkpoint ", path, ": tensor '", name, "': ", e.what());
  }
  return t;
}

Checkpoint read_checkpoint(const std::string& path, bool keep_values) {
  try {
    return read_unprefixed(path, keep_values);
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
    auto it = checkpoint.table.find(name);
    if (it == checkpoint.table.end()) {
      problems.push_back("tensor '" + name + "' of shape " + to_string(t.shape()) +
                         " is missing from the checkpoint");
      continue;
    }
    const CheckpointSlot& src = it->second;
    if (src.shape != t.shape())
      problems.push_back("tensor '" + name + "' has shape " + to_string(src.shape) +
                         " in the checkpoint and " + to_string(t.shape()) + " in the model");
    else if (src.dtype != t.dtype())
      problems.push_back("tensor '" + name + "' is " + dtype_name(src.dtype) +
                         " in the checkpoint and " + dtype_name(t.dtype()) + " in the model");
  }
  for (const auto& [name, slot] : checkpoint.table)
    if (name.starts_with(prefix) && !names.count(name))
      problems.push_back("tensor '" + name + "' of shape " + to_string(slot.shape) +
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
    for (const auto& [name, t] : into) shared += checkpoint.table.count(name);
    if (shared == 0) s << " (none of the model's tensors is in it: it holds another model)";
    throw Error(s.str());
  }

  for (const auto& [name, t] : into) {
    // A released tensor (a block outside this rank's stage) was checked above, kept not.
    if (t.numel() == 0 || t.released()) continue;
    // One at a time, from the file where the read kept none: a dense host tensor, copied
    // from where it is.
    const Tensor src = checkpoint.get(name);
    Backend& be = t.backend();
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    if (t.is_contiguous()) {
      be.copy_from_host(t.raw(), src.raw(), bytes);
    } else {
      // A strided view (rare for parameters): stage densely on its backend, then let the
      // backend scatter through the view's strides.
      Tensor staged = Tensor::empty(t.shape(), t.dtype(), be);
      be.copy_from_host(staged.raw(), src.raw(), bytes);
      be.copy(staged.raw(), staged.strides(), t.raw(), t.strides(), t.shape());
    }
  }
}

}  // namespace ht::runtime
