// Mutation fuzzing of every file reader hetrain has: a valid file per reader, turned by
// deterministic mutations (seeded byte flips, truncation, insertions, deep nesting, huge
// numbers, NULs, bad length fields) into malformed ones, each fed through the reader as
// the CLI calls it. A reader passes a case when it returns or throws ht::Error with a
// short one-line message; any other exception fails, and a crash or hang kills the run.
// Shared by the unit suite (test_fuzz_readers.cpp: a fixed, fast corpus) and
// tools/fuzz_readers.cpp (random mutations for a time budget, under sanitizers).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ht::fuzz {

struct Reader {
  std::string name;  // "config", "cluster", ...
  std::string seed;  // the valid file's bytes
  bool json = true;  // text mutations (nesting, numbers) apply
  // Writes `bytes` where the reader expects its file and reads it; throws what it throws.
  std::function<void(const std::string& bytes)> read;
  // Called on every mutated input before it is read: the checkpoint reader re-stamps its
  // checksum on some cases so that mutations reach the checks behind the checksum.
  std::function<std::string(std::string bytes, uint64_t case_index)> finish;
};

// The readers, their seeds built in code or taken from configs/. Scratch files go under
// `scratch_dir`, which must exist; the caller removes it.
std::vector<Reader> all_readers(const std::string& scratch_dir);

// The structured corpus: empty input, truncation at every byte (at evenly spaced bytes
// past `max_truncations`), deep nesting, 5,000-digit and out-of-range numbers, NULs,
// and length fields that claim more than the file holds.
std::vector<std::string> fixed_cases(const Reader& r, size_t max_truncations);

// Mutation number `index` of the seed: a pure function of (reader name, index), so any
// failing case can be rerun from the two alone.
std::string random_case(const Reader& r, uint64_t index);

enum class Outcome { parsed, rejected, bad };
struct Result {
  Outcome outcome = Outcome::parsed;
  std::string message;  // the error (rejected) or what was wrong (bad)
};

// Runs one case. `bad` when the reader threw anything but ht::Error, or an ht::Error
// whose message is empty, spans lines or runs past kMaxMessage characters.
inline constexpr size_t kMaxMessage = 1000;
Result run_case(const Reader& r, const std::string& bytes);

}  // namespace ht::fuzz
