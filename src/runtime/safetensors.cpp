#include "runtime/safetensors.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

#include "config/json_schema.h"
#include "core/error.h"

namespace ht::runtime::safetensors {

// Tensor bytes are copied verbatim from memory, so the host must be little-endian
// like the format.
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping");

namespace {

// ordered_json keeps the header in data order, which makes files easy to eyeball; the
// reader takes the same type from the one JSON reader every file goes through.
using ordered_json = nlohmann::ordered_json;
using json = config::schema::Json;

constexpr const char* kMetadataKey = "__metadata__";

bool parse_dtype(const std::string& tag, DType& out) {
  if (tag == "F32") out = DType::f32;
  else if (tag == "I32") out = DType::i32;
  else return false;
  return true;
}

// Byte size of a shape, or false when the element count (zero dimensions aside) or
// the byte size overflows int64: [0, 2^62, 2^62] holds no bytes, yet multiplying its
// dimensions, as every later use of the shape does, would overflow.
bool shape_bytes(const Shape& shape, DType dtype, uint64_t& out) {
  int64_t count = 1;
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) empty = true;
    else if (__builtin_mul_overflow(count, d, &count)) return false;
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<int64_t>(dtype_size(dtype)), &bytes)) return false;
  out = empty ? 0 : static_cast<uint64_t>(bytes);
  return true;
}

Entry parse_entry(const std::string& name, const json& v) {
  HT_CHECK(v.is_object(), "tensor '", name, "': expected an object, found ", v.type_name());
  Entry e;
  e.name = name;

  auto dt = v.find("dtype");
  HT_CHECK(dt != v.end() && dt->is_string(), "tensor '", name, "' has no string \"dtype\"");
  HT_CHECK(parse_dtype(dt->get<std::string>(), e.dtype), "tensor '", name, "' has dtype '",
           dt->get<std::string>(), "'; this reader supports F32 and I32");

  auto sh = v.find("shape");
  HT_CHECK(sh != v.end() && sh->is_array(), "tensor '", name, "' has no \"shape\" array");
  for (const json& d : *sh) {
    HT_CHECK(d.is_number_unsigned() &&
                 d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             "tensor '", name, "' has shape entry ", d.dump(), "; expected a non-negative integer");
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  auto off = v.find("data_offsets");
  HT_CHECK(off != v.end() && off->is_array() && off->size() == 2 &&
               (*off)[0].is_number_unsigned() && (*off)[1].is_number_unsigned(),
           "tensor '", name, "' has no \"data_offsets\" pair of non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  HT_CHECK(e.begin <= e.end, "tensor '", name, "' has data_offsets [", e.begin, ", ", e.end,
           "] that end before they begin");

  uint64_t bytes = 0;
  HT_CHECK(shape_bytes(e.shape, e.dtype, bytes), "tensor '", name, "' has shape ",
           to_string(e.shape), " whose size overflows");
  HT_CHECK(bytes == e.end - e.begin, "tensor '", name, "' has shape ", to_string(e.shape), " (",
           bytes, " bytes of ", dtype_tag(e.dtype), ") but data_offsets [", e.begin, ", ", e.end,
           "] span ", e.end - e.begin, " bytes");
  return e;
}

}  // namespace

const char* dtype_tag(DType d) { return d == DType::f32 ? "F32" : "I32"; }

std::string encode_header(const std::vector<Entry>& entries,
                          const std::map<std::string, std::string>& metadata) {
  ordered_json h = ordered_json::object();
  if (!metadata.empty()) h[kMetadataKey] = metadata;
  for (const Entry& e : entries)
    h[e.name] = {{"dtype", dtype_tag(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text;
  try {
    text = h.dump();
  } catch (const nlohmann::json::exception& ex) {
    fail("safetensors: cannot encode the header (a tensor name or metadata string is not "
         "valid UTF-8): ", ex.what());
  }
  // Pad so that the data section starts 8-byte aligned, as the reference writer does.
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');

  std::string out(kLengthBytes, '\0');
  uint64_t n = text.size();
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

uint64_t decode_length(const unsigned char bytes[kLengthBytes]) {
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return n;
}

Header parse_header(std::string_view json_text, uint64_t data_bytes) {
  json h;
  try {
    h = config::schema::parse_document(std::string(json_text), "header");
  } catch (const config::ConfigError& ex) {
    fail(ex.what());  // the caller names the file; ConfigError would read as a config's
  }
  HT_CHECK(h.is_object(), "header is a JSON ", h.type_name(), "; expected an object");

  Header out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == kMetadataKey) {
      HT_CHECK(it->is_object(), "\"", kMetadataKey, "\" is a JSON ", it->type_name(),
               "; expected an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        HT_CHECK(m->is_string(), "metadata '", m.key(), "' is a JSON ", m->type_name(),
                 "; expected a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(it.key(), *it));
  }

  // Ranges: inside the data section, non-overlapping, and covering all of it (a gap or
  // tail would be bytes nobody accounts for, which the reference reader rejects too).
  std::sort(out.entries.begin(), out.entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t end = 0;
  for (size_t i = 0; i < out.entries.size(); ++i) {
    const Entry& e = out.entries[i];
    if (i > 0) {
      const Entry& p = out.entries[i - 1];
      HT_CHECK(e.begin >= p.end, "tensors '", p.name, "' [", p.begin, ", ", p.end, ") and '",
               e.name, "' [", e.begin, ", ", e.end, ") overlap");
    }
    HT_CHECK(e.begin <= end, "bytes [", end, ", ", e.begin, ") before tensor '", e.name,
             "' belong to no tensor");
    end = e.end;
  }
  HT_CHECK(end <= data_bytes, "truncated: header promises ", end, " data bytes, file has ",
           data_bytes);
  HT_CHECK(end == data_bytes, "the file has ", data_bytes, " data bytes but the tensors end at ",
           end, " (trailing bytes)");
  return out;
}

}  // namespace ht::runtime::safetensors
