// Output paths against input paths: a command that would write over one of its own
// inputs (`hetrain plan c.json --json c.json`) is refused before it does anything.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "config/config.h"
#include "runtime/run_dir.h"

namespace hetrain_cli {

// Whether `a` and `b` name one file: the same file where both exist, else the same
// path once made absolute and normal.
inline bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a, ec), ec), pb = fs::weakly_canonical(fs::absolute(b, ec), ec);
  return !ec && pa == pb;
}

// Throws ConfigError when `output` (given with `flag`) is one of `inputs` ({what, path};
// empty paths are skipped).
inline void check_not_an_input(const std::string& flag, const std::string& output,
                               const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (output.empty()) return;
  for (const auto& [what, path] : inputs)
    if (!path.empty() && same_file(output, path))
      throw ht::config::ConfigError(flag + " " + output + ": is " + what + " (" + path +
                                    "), which writing there would replace; expected another path");
}

// Every option of `cmd` that takes a value refuses one of `cmd`'s own option names as
// that value: CLI11 takes the word after an option as its value, so `--run-dir -q` (the
// directory forgotten) trained 3,750 steps into ./-q, and `--inject --run-dir D` was
// refused as "D not expected". Call once every option is registered. A path that begins
// with a dash is still written as ./-q.
inline void refuse_option_names_as_values(CLI::App* cmd) {
  for (CLI::Option* o : cmd->get_options()) {
    if (o->get_type_size_min() <= 0) continue;  // a flag
    o->check(CLI::Validator(
        [cmd](std::string& text) -> std::string {
          if (text.size() < 2 || text[0] != '-') return "";
          for (const CLI::Option* other : cmd->get_options())
            if (other->check_name(text))
              return "'" + text + "' is an option of this command, not a value: its value is missing" +
                     (text[1] == '-' ? std::string() : " (a path that begins with a dash is written ./" + text + ")");
          return "";
        },
        "", "not_an_option_name"));
  }
}

// Throws ConfigError when an output option was given an empty path (it would write
// nothing, silently).
inline void check_given_path(const std::string& flag, bool given, const std::string& path) {
  if (given && path.empty()) throw ht::config::ConfigError(flag + ": an empty path; expected a file path");
}

// For an input path option: an empty value is refused (CLI11 would take it, and an empty
// --cluster quick-probed the job as if the option were not there).
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "an empty path; expected a file path" : ""; },
      "", "non_empty_path");
}

// What of a run's state `output` would replace, or "": a run directory's lock (a second
// run could then share the directory), one of a run's own files, anything in a run's
// checkpoints/, or a checkpoint anywhere (.safetensors that exists). A trace written over
// the checkpoint being resumed from left no valid one behind. Symbolic links are followed.
inline std::string run_state_at(const std::string& output) {
  namespace fs = std::filesystem;
  using ht::runtime::RunDir;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(output, ec), ec);
  if (ec || p.empty()) return {};
  const fs::path dir = p.parent_path();
  auto run_dir = [](const fs::path& d) {
    std::error_code e;
    return !d.empty() && (fs::exists(d / RunDir::kLockFile, e) || RunDir::holds_run(d.string()));
  };
  if (p.filename() == RunDir::kLockFile) return "a run directory's lock file";
  if (run_dir(dir))
    for (const char* name : RunDir::kRunFiles)
      if (p.filename() == name) return std::string("the run's ") + name + " (the run directory " + dir.string() + ")";
  if (dir.filename() == "checkpoints" && run_dir(dir.parent_path()))
    return "in the checkpoints of the run in " + dir.parent_path().string();
  if (p.extension() == ".safetensors" && fs::exists(p, ec)) return "a checkpoint";
  return {};
}

// Throws ConfigError unless every given output ({flag, path}; empty paths are skipped)
// can be written: it replaces no run's state (run_state_at), its directory exists, it is
// a regular file where it exists (the file is written beside it and renamed over it,
// which would replace a device such as /dev/null, a pipe or a socket with a plain file),
// and no two name one file (one would silently replace the other's output).
inline void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  namespace fs = std::filesystem;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    if (path.empty()) continue;
    std::error_code ec;
    if (fs::is_directory(path, ec))
      throw ht::config::ConfigError(flag + " " + path + ": is a directory; expected a file path");
    if (const std::string state = run_state_at(path); !state.empty())
      throw ht::config::ConfigError(flag + " " + path + ": is " + state +
                                    ", which writing there would replace; expected a path outside a run's state");
    if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
      throw ht::config::ConfigError(flag + " " + path +
                                    ": is not a regular file (a device, pipe or socket), which writing there would "
                                    "replace with one; expected a regular file path");
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
      throw ht::config::ConfigError(flag + " " + path + ": " + parent.string() +
                                    (fs::exists(parent, ec) ? " is not a directory" : ", its directory, does not exist") +
                                    "; expected a file in an existing directory");
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].second.empty() && same_file(path, outputs[j].second))
        throw ht::config::ConfigError(flag + " " + path + ": is also " + outputs[j].first +
                                      "'s output, which writing there would replace; expected another path");
  }
}

}  // namespace hetrain_cli
