// Every file reader against a fixed corpus of malformed versions of a valid file (see
// fuzz_readers.h): each case parses or throws ht::Error with a one-line message; no
// other exception, no crash. tools/fuzz_readers.cpp runs the same mutators for longer.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "data/idx_file.h"
#include "tests/unit/fuzz_readers.h"
#include "tests/unit/temp_dir.h"

using namespace ht::fuzz;
namespace fs = std::filesystem;

namespace {

using ht::test_fixtures::TempDir;

// Enough to hit every mutator many times per reader while keeping the suite fast.
constexpr uint64_t kRandomCases = 400;
constexpr size_t kMaxTruncations = 600;

// Built once: the plan's seed runs the planner.
struct Corpus {
  TempDir scratch;
  std::vector<Reader> readers = all_readers(scratch.path);
};

Corpus& corpus() {
  static Corpus c;
  return c;
}

const Reader* find_reader(const std::string& name) {
  for (const Reader& x : corpus().readers)
    if (x.name == name) return &x;
  return nullptr;
}

void fuzz(const std::string& name) {
  const Reader* r = nullptr;
  r = find_reader(name);
  REQUIRE(r != nullptr);
  // The seed is valid: otherwise every case would be rejected for the seed's own fault.
  const Result seed = run_case(*r, r->finish(r->seed, 1));
  REQUIRE_MESSAGE(seed.outcome == Outcome::parsed, seed.message);

  std::vector<std::string> cases = fixed_cases(*r, kMaxTruncations);
  for (uint64_t i = 0; i < kRandomCases; ++i) cases.push_back(random_case(*r, i));
  size_t parsed = 0, rejected = 0, bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Result res = run_case(*r, cases[i]);
    if (res.outcome == Outcome::parsed) ++parsed;
    if (res.outcome == Outcome::rejected) ++rejected;
    if (res.outcome == Outcome::bad && ++bad <= 5) {
      const size_t fixed = cases.size() - kRandomCases;
      CAPTURE(i < fixed ? "fixed case " + std::to_string(i) : "random case " + std::to_string(i - fixed));
      FAIL_CHECK(res.message);
    }
  }
  MESSAGE(name, ": ", cases.size(), " cases, ", parsed, " parsed, ", rejected, " rejected, ", bad, " bad");
  CHECK(bad == 0);
  // Truncation alone guarantees rejections; none would mean the reader was never reached.
  CHECK(rejected > cases.size() / 4);
}

}  // namespace

TEST_CASE("fuzz: config reader (MLP config)") { fuzz("config-fashion_mnist_mlp"); }
TEST_CASE("fuzz: config reader (GPT config)") { fuzz("config-text_gpt_tiny"); }
TEST_CASE("fuzz: config reader (every section, under local)") { fuzz("config-full-local"); }
TEST_CASE("fuzz: config reader (every section, under deadline)") { fuzz("config-full-deadline"); }
TEST_CASE("fuzz: cluster file reader") { fuzz("cluster"); }
TEST_CASE("fuzz: plan file reader") { fuzz("plan"); }
TEST_CASE("fuzz: plan file reader (every note, memory step and problem kind)") { fuzz("plan-facts"); }
TEST_CASE("fuzz: plan file reader (a local plan: groups, round, outer step)") { fuzz("plan-local"); }
TEST_CASE("fuzz: plan file reader (a deadline plan)") { fuzz("plan-deadline"); }
TEST_CASE("fuzz: device catalogue reader") { fuzz("catalogue"); }
TEST_CASE("fuzz: train --inject's fault spec") { fuzz("option-inject"); }
TEST_CASE("fuzz: plan --what-if's event spec") { fuzz("option-what-if"); }
TEST_CASE("fuzz: --cluster synth: spec") { fuzz("option-synth"); }
TEST_CASE("fuzz: IDX images") { fuzz("idx-images"); }
TEST_CASE("fuzz: IDX labels") { fuzz("idx-labels"); }
TEST_CASE("fuzz: gzipped IDX file") { fuzz("idx-gzip"); }
TEST_CASE("fuzz: checkpoint (safetensors) reader") { fuzz("checkpoint"); }
TEST_CASE("fuzz: checkpoint reader without its values, each tensor then read") { fuzz("checkpoint-lazy"); }

// Byte mutations change one number at a time, which the cross-checks catch; a plan scaled
// consistently to 10^9 micro-batches passes them, and its schedules alone would take
// more memory than any machine has.
TEST_CASE("fuzz: a consistent plan of 10^9 micro-batches is refused before schedules are built") {
  const Reader* r = find_reader("plan");
  REQUIRE(r != nullptr);
  nlohmann::json p = nlohmann::json::parse(r->seed);
  const int64_t big = 1'000'000'000;
  const size_t replicas = p["layout"]["samples"].size();
  p["global_batch"] = big * static_cast<int64_t>(replicas);
  p["layout"]["samples"] = std::vector<int64_t>(replicas, big);
  p["layout"]["micro_batches"] = std::vector<int64_t>(replicas, big);
  for (auto& rank : p["ranks"])
    if (rank["replica"].get<int>() >= 0) rank["samples"] = rank["micro_batches"] = big, rank["micro_batch_size"] = 1;
  const Result res = run_case(*r, p.dump());
  CHECK(res.outcome == Outcome::rejected);
  CHECK(res.message.find("micro_batches[0]: 1000000000 micro-batches; expected at most 65536") != std::string::npos);
}

// Deflate packs 64 MiB of zeros into about 64 KiB: a file whose header promises 5 labels
// is refused once a 6th byte arrives, not after inflating all of it.
TEST_CASE("fuzz: a gzipped IDX file longer than its header promises is refused at the promise") {
  TempDir scratch;
  const std::string path = scratch.path + "/labels.gz";
  gzFile f = gzopen(path.c_str(), "wb9");
  REQUIRE(f != nullptr);
  const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0, 5};
  REQUIRE(gzwrite(f, header, sizeof header) == static_cast<int>(sizeof header));
  const std::string zeros(1 << 20, '\0');
  for (int i = 0; i < 64; ++i) REQUIRE(gzwrite(f, zeros.data(), static_cast<unsigned>(zeros.size())) > 0);
  REQUIRE(gzclose(f) == Z_OK);
  CHECK(fs::file_size(path) < (1 << 20));
  CHECK_THROWS_WITH_AS(ht::data::read_idx_labels(path),
                       doctest::Contains("IDX payload holds more than the 5 bytes the header promises"),
                       ht::Error);
}
