#include "data/text_corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <system_error>

#include <sys/stat.h>

#include "core/error.h"

namespace ht::data {

namespace fs = std::filesystem;

namespace {

constexpr uint8_t kUnknownToken = '?' - 31;

bool ends_with_any(const std::string& name, const std::vector<std::string>& suffixes) {
  for (const auto& s : suffixes)
    if (!s.empty() && name.size() >= s.size() &&
        name.compare(name.size() - s.size(), s.size(), s) == 0)
      return true;
  return false;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void append_file(const std::string& path, std::vector<uint8_t>& out) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "text corpus: cannot open ", path, ": ", errno != 0 ? std::strerror(errno) : "unknown reason",
           "; expected a readable file");
  // To its end, not to the size stat gives: a file of procfs says 0 bytes, of sysfs a
  // page, whatever it holds.
  const size_t start = out.size();
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0)
    out.insert(out.end(), buf.begin(), buf.begin() + in.gcount());
  HT_CHECK(in.eof() && !in.bad(), "text corpus: reading ", path, " failed after ", out.size() - start, " bytes: ",
           errno != 0 ? std::strerror(errno) : "unknown reason", "; expected a readable file");
  // Tokenise in place: one token per byte.
  for (size_t i = start; i < out.size(); ++i) out[i] = byte_to_token(out[i]);
}

}  // namespace

uint8_t byte_to_token(unsigned char c) {
  if (c == '\n') return 0;
  if (c == '\t') return 1;
  if (c >= ' ' && c <= '~') return static_cast<uint8_t>(c - 31);
  return kUnknownToken;
}

char token_to_char(int64_t id) {
  HT_CHECK(id >= 0 && id < kByteVocab, "decode: token id ", id,
           " is out of range; expected 0 <= id < ", kByteVocab);
  return id == 0 ? '\n' : static_cast<char>(id + 31);
}

std::vector<uint8_t> encode(std::string_view text) {
  std::vector<uint8_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    ids[i] = byte_to_token(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string decode(std::span<const int32_t> ids) {
  std::string s(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) s[i] = token_to_char(ids[i]);
  return s;
}

std::string decode(std::span<const uint8_t> ids) {
  std::string s(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) s[i] = token_to_char(ids[i]);
  return s;
}

std::vector<std::string> list_corpus_files(const std::vector<std::string>& paths,
                                           const std::vector<std::string>& skip_suffixes) {
  HT_CHECK(!paths.empty(), "text corpus: no paths given");
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    const auto st = fs::status(p, ec);
    // A link loop or a directory that cannot be searched is not a missing package.
    HT_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "text corpus: path ", p, " cannot be read (",
             ec.message(), "); expected a text file or a directory of them");
    HT_CHECK(fs::exists(st), "text corpus: path ", p,
             " not found (the Debian package fortunes provides /usr/share/games/fortunes: "
             "apt-get install fortunes)");
    if (!fs::is_directory(st)) {
      // A device or a pipe never ends (/dev/zero) or reads once: only files hold a corpus.
      HT_CHECK(fs::is_regular_file(st), "text corpus: path ", p,
               " is not a regular file or a directory; expected text files or directories of them");
      files.push_back(p);
      continue;
    }
    std::vector<std::string> names;
    fs::directory_iterator it(p, ec);
    HT_CHECK(!ec, "text corpus: cannot list directory ", p, ": ", ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      HT_CHECK(!ec, "text corpus: cannot list directory ", p, ": ", ec.message());
      const std::string name = it->path().filename().string();
      // is_regular_file follows symlinks, so a link to a regular file is read too; one to
      // nothing (or a loop) is no file, and passed over as a subdirectory is.
      std::error_code entry;
      if (it->is_regular_file(entry) && !ends_with_any(name, skip_suffixes)) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) files.push_back((fs::path(p) / n).string());
  }
  // A file reached twice (a path listed twice, a file beside its directory, a hard link
  // to it) would be trained on twice as often as the rest: one file is one device and
  // inode.
  std::map<std::string, std::string> seen;  // device:inode -> the path that reached it
  for (const auto& f : files) {
    struct stat st {};
    std::error_code ec;
    const std::string key = ::stat(f.c_str(), &st) == 0
                                ? std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino)
                                : fs::weakly_canonical(f, ec).string();
    const auto [at, fresh] = seen.try_emplace(ec ? f : key, f);
    HT_CHECK(fresh, "text corpus: ", f, at->second == f ? std::string(" is reached twice") : " is the same file as " + at->second,
             " through data.paths; expected each file once");
  }
  return files;
}

TextCorpus load_text_corpus(const std::vector<std::string>& paths,
                            const std::vector<std::string>& skip_suffixes,
                            double validation_fraction, int64_t min_split_tokens) {
  HT_CHECK(validation_fraction >= 0.0 && validation_fraction < 1.0,
           "text corpus: validation_fraction ", validation_fraction,
           " is out of range; expected 0 <= fraction < 1");
  TextCorpus c;
  c.files = list_corpus_files(paths, skip_suffixes);
  std::vector<uint8_t> all;
  // One byte a token, read once into one buffer that becomes the train split (below): the
  // corpus in memory about once. Reserved from the files' sizes (a hint: procfs says 0),
  // where growing by doubling held twice a large corpus for a moment.
  uintmax_t sized = 0;
  for (const auto& f : c.files) {
    std::error_code ec;
    const uintmax_t n = fs::file_size(f, ec);
    if (!ec) sized += n;
  }
  try {
    if (sized > 0 && sized < all.max_size()) all.reserve(static_cast<size_t>(sized));
    for (const auto& f : c.files) append_file(f, all);
  } catch (const std::bad_alloc&) {
    // A bare bad_alloc, caught higher up, blamed the batch size.
    fail("text corpus from ", join(paths), ": out of host memory reading it (", sized, " bytes in its files, ",
         all.size(), " read); expected a corpus this machine's memory holds, one byte a token: use fewer or "
         "smaller files");
  }
  c.total_tokens = static_cast<int64_t>(all.size());
  HT_CHECK(c.total_tokens > 0, "text corpus is empty: ", c.files.size(), " file(s) read from ",
           join(paths));
  const auto n_val = static_cast<int64_t>(validation_fraction * static_cast<double>(all.size()));
  const int64_t n_train = c.total_tokens - n_val;
  HT_CHECK(n_train >= min_split_tokens, "text corpus from ", join(paths), ": train split has ",
           n_train, " tokens (of ", c.total_tokens, "); expected at least ", min_split_tokens,
           " (context + 1)");
  HT_CHECK(validation_fraction == 0.0 || n_val >= min_split_tokens, "text corpus from ",
           join(paths), ": validation split has ", n_val, " tokens (", validation_fraction,
           " of ", c.total_tokens, "); expected at least ", min_split_tokens,
           " (context + 1); raise validation_fraction or add text");
  // Held-out text spread over the whole corpus: K equal chunks each give their tail to
  // validation. A corpus made of files on different subjects (the fortune files run
  // alphabetically from "art" to "zippy") would otherwise be validated on its last
  // files alone, a different distribution from the one trained on.
  // The train split is the buffer itself, its segments moved down over the held-out tails
  // once those are copied out (each segment's destination is at or before its source).
  const int64_t segments = std::max<int64_t>(1, n_val / kValidationSegment);
  c.validation.reserve(static_cast<size_t>(n_val));
  for (int64_t k = 0; k < segments; ++k) {
    const int64_t end = c.total_tokens * (k + 1) / segments, held = n_val * (k + 1) / segments - n_val * k / segments;
    c.validation.insert(c.validation.end(), all.begin() + (end - held), all.begin() + end);
  }
  int64_t kept = 0;
  for (int64_t k = 0; k < segments; ++k) {
    const int64_t begin = c.total_tokens * k / segments, end = c.total_tokens * (k + 1) / segments;
    const int64_t held = n_val * (k + 1) / segments - n_val * k / segments, n = end - held - begin;
    std::memmove(all.data() + kept, all.data() + begin, static_cast<size_t>(n));
    kept += n;
  }
  all.resize(static_cast<size_t>(kept));
  c.train = std::move(all);
  return c;
}

}  // namespace ht::data
