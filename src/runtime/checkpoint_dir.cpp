#include "runtime/checkpoint_dir.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace ht::runtime {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "ckpt-", kSuffix = ".safetensors";

std::string file_name(int64_t step) {
  char buf[48];  // room for any int64
  std::snprintf(buf, sizeof buf, "ckpt-%08lld.safetensors", static_cast<long long>(step));
  return buf;
}

// The step of a checkpoint file name, or nullopt for any other file. Only the canonical
// spelling counts, so "ckpt-1.safetensors", "ckpt-00000001.safetensors.tmp" or a copy the
// user made are never listed, loaded or deleted.
std::optional<int64_t> parse_name(const std::string& name) {
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix))
    return std::nullopt;
  const char* b = name.data() + kPrefix.size();
  const char* e = name.data() + name.size() - kSuffix.size();
  int64_t step = 0;
  auto [end, ec] = std::from_chars(b, e, step);
  if (ec != std::errc() || end != e || step < 0 || file_name(step) != name) return std::nullopt;
  return step;
}

}  // namespace

int CheckpointDir::remove_partial_writes() const {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return 0;
  constexpr std::string_view kPartial = ".tmp";
  std::vector<fs::path> partial;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e;
    if (name.ends_with(kPartial) && parse_name(name.substr(0, name.size() - kPartial.size())) &&
        it->is_regular_file(e) && !it->is_symlink(e))
      partial.push_back(it->path());
  }
  int removed = 0;
  for (const fs::path& p : partial) removed += fs::remove(p, ec) ? 1 : 0;
  return removed;
}

CheckpointDir::CheckpointDir(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  HT_CHECK(keep_ >= 1, "checkpoints in ", dir_, ": keep is ", keep_, "; expected at least 1");
}

std::string CheckpointDir::path_for(int64_t step) const {
  HT_CHECK(step >= 0, "checkpoint step ", step, " is negative; expected >= 0");
  return (fs::path(dir_) / file_name(step)).string();
}

std::vector<CheckpointFile> CheckpointDir::list(bool all) const {
  std::vector<CheckpointFile> out;
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return out;
  fs::directory_iterator it(dir_, ec);
  HT_CHECK(!ec, "cannot list checkpoints in ", dir_, ": ", ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    HT_CHECK(!ec, "cannot list checkpoints in ", dir_, ": ", ec.message());
    const auto step = parse_name(it->path().filename().string());
    if (!step) continue;
    std::error_code e;
    const fs::file_status st = it->status(e);  // through a link
    std::string what;
    if (e || st.type() == fs::file_type::not_found) what = it->is_symlink(e) ? "a link to nothing" : "unreadable";
    else if (st.type() == fs::file_type::directory) what = "a directory";
    else if (st.type() != fs::file_type::regular) what = "not a regular file";
    if (!what.empty() && !all) continue;
    out.push_back({*step, it->path().string(), what});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return a.step < b.step; });
  return out;
}

std::string CheckpointDir::save(int64_t step, const std::vector<nn::NamedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  const std::string path = prepare(step);
  write_checkpoint(path, tensors, metadata);  // throws before retention: nothing deleted
  retain(step, path);
  return path;
}

std::string CheckpointDir::save(int64_t step, std::vector<CheckpointSlot> slots,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<void(CheckpointWriter&)>& fill) {
  const std::string path = prepare(step);
  CheckpointWriter out(path, std::move(slots), metadata);
  fill(out);
  out.commit();  // throws before retention: nothing deleted
  retain(step, path);
  return path;
}

std::string CheckpointDir::prepare(int64_t step) {
  const std::string path = path_for(step);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  HT_CHECK(!ec, "cannot create the checkpoint directory ", dir_, ": ", ec.message());
  if (passed_over_.count(path) > 0) {  // the unreadable file the resume passed over, of this step
    std::string aside = path + ".unreadable";  // never over one set aside before
    for (int k = 1; fs::exists(fs::symlink_status(aside, ec)); ++k) aside = path + ".unreadable." + std::to_string(k);
    fs::rename(path, aside, ec);
    HT_CHECK(!ec, "cannot move the unreadable checkpoint ", path, " aside to ", aside,
             " before saving this step's: ", ec.message());
    passed_over_.erase(path);
    std::fprintf(stderr, "hetrain: warning: the unreadable checkpoint of step %lld is kept as %s\n",
                 static_cast<long long>(step), aside.c_str());
  }
  return path;
}

void CheckpointDir::retain(int64_t step, const std::string& path) {
  std::error_code ec;
  // Retention by step, not by file time: the lowest steps of this run's line go first
  // until `keep` remain (save's comment in the header says which files count).
  std::vector<CheckpointFile> files = list();
  std::erase_if(files, [&](const CheckpointFile& f) { return f.step > step || passed_over_.count(f.path) > 0; });
  int64_t excess = static_cast<int64_t>(files.size()) - keep_;
  for (const CheckpointFile& f : files) {
    if (excess <= 0) break;
    if (f.step == step) continue;
    fs::remove(f.path, ec);
    HT_CHECK(!ec, "saved ", path, " but could not remove the old checkpoint ", f.path, ": ",
             ec.message());
    --excess;
  }
}

std::optional<Checkpoint> CheckpointDir::load_newest_valid(std::vector<std::string>& skipped, bool keep_values) {
  std::vector<CheckpointFile> files = list(true);
  if (files.empty()) return std::nullopt;
  std::vector<std::string> problems;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    if (!it->not_a_file.empty()) {
      problems.push_back(it->path + ": " + it->not_a_file + "; expected a checkpoint file");
      passed_over_.insert(it->path);  // set aside when the run reaches its step, as an unreadable file
      continue;
    }
    try {
      Checkpoint c = read_checkpoint(it->path, keep_values);
      // A copy or a rename by hand: resumed, it would train its steps again past newer ones.
      if (const auto s = c.metadata.find("step"); s != c.metadata.end() && s->second != std::to_string(it->step))
        throw Error(it->path + ": its metadata is of step " + s->second + ", its name of step " +
                    std::to_string(it->step) + "; expected the step of its name");
      const std::string using_ = "; using " + fs::path(it->path).filename().string();
      for (const std::string& p : problems) skipped.push_back(p + using_);
      return c;
    } catch (const OutOfMemory&) {
      throw;  // not a property of the file: trying older ones would not help
    } catch (const Error& e) {
      problems.push_back(e.what());
      passed_over_.insert(it->path);
    }
  }
  std::string msg = "no valid checkpoint in " + dir_ + "; tried newest first:";
  for (const std::string& p : problems) msg += "\n  " + p;
  throw Error(msg);
}

}  // namespace ht::runtime
