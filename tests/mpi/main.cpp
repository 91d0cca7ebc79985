// Doctest main for the MPI suite: every rank runs every test case in the same order,
// and the job fails when any rank fails (a logical-or allreduce of the outcomes).
// Rank 0 prints doctest's report; every rank prints its own failures, prefixed with
// its rank, through the listener below.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>

#include "comm/communicator.h"

namespace {

int world_rank() { return ht::comm::world().rank(); }

struct RankListener : doctest::IReporter {
  explicit RankListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override { current_ = tc.m_name; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException& e) override {
    std::fprintf(stderr, "[rank %d] %s: exception: %s\n", world_rank(), current_,
                 e.error_string.c_str());
  }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& a) override {
    if (!a.m_failed) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s: %s( %s ) is %s%s%s\n", world_rank(), a.m_file,
                 a.m_line, current_, doctest::assertString(a.m_at), a.m_expr, a.m_decomp.c_str(),
                 a.m_threw ? " threw: " : "", a.m_threw ? a.m_exception.c_str() : "");
  }
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

 private:
  const char* current_ = "";
};

}  // namespace

REGISTER_LISTENER("rank", 1, RankListener);

int main(int argc, char** argv) {
  ht::comm::Communicator& world = ht::comm::world();  // MPI_Init_thread(MPI_THREAD_MULTIPLE)
  doctest::Context context(argc, argv);
  context.setOption("no-colors", true);
  if (world.rank() != 0) context.setOption("out", "/dev/null");  // one report, not four
  const int failed = context.run() != 0 ? 1 : 0;
  if (context.shouldExit()) return failed;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "[rank %d] FAILED (see the lines above)\n", world.rank());
  if (world.rank() == 0)
    std::printf("mpi suite on %d ranks: %s\n", world.size(),
                any ? "some rank failed" : "all ranks passed");
  return any;
}
