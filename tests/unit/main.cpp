// The unit suite's entry point: doctest's own main, plus one option for test cases that
// need files a machine may lack.
//
// How to write a test case that needs such a file (the Fashion-MNIST dataset, say): put
// it in a doctest test suite "needs-" + the need,
//
//     TEST_CASE("data: the real Fashion-MNIST loads" * doctest::test_suite("needs-fashion-mnist")) {
//
// and do not test for the file inside it. The `unit` meson test leaves every needs-*
// suite out (--test-suite-exclude=needs-*); a meson test of its own per need
// (`unit-fashion-mnist` in tests/unit/meson.build) runs only that suite, as
//
//     unit_tests --requires=/usr/share/datasets/fashion-mnist --test-suite=needs-fashion-mnist
//
// --requires=PATH (repeatable) exits 77 before any test runs when PATH does not exist,
// so meson reports SKIP, naming the path. A test case that instead returns early with a
// message passes where it did not run. With --requires, a run that selects no test case
// fails: a misspelt suite name would otherwise pass, checking nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

constexpr int kMesonSkip = 77;
constexpr const char* kRequires = "--requires=";

// Records how many test cases the filters selected: doctest's Context does not say.
unsigned g_selected = 0;

struct SelectionCounter : doctest::IReporter {
  explicit SelectionCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override { g_selected = s.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("selection-counter", 1, SelectionCounter);

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  std::vector<std::string> required;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], kRequires, std::strlen(kRequires)) == 0)
      required.emplace_back(argv[i] + std::strlen(kRequires));
    else
      args.push_back(argv[i]);
  }
  for (const std::string& path : required) {
    if (path.empty()) {
      std::fprintf(stderr, "unit_tests: --requires= names no path; expected --requires=PATH\n");
      return 2;
    }
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      std::printf("SKIP: %s not found; these test cases need it\n", path.c_str());
      return kMesonSkip;
    }
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  const int status = context.run();
  if (context.shouldExit()) return status;
  if (!required.empty() && g_selected == 0) {
    std::fprintf(stderr, "unit_tests: the filters selected no test case; expected at least one "
                         "in the suite that needs %s\n", required.front().c_str());
    return 1;
  }
  return status;
}
