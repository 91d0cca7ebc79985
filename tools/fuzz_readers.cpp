// fuzz-readers: runs the unit suite's reader mutators (tests/unit/fuzz_readers.h) for a
// time budget per reader: the fixed corpus once, then random mutations by index. Each
// reader runs in a child process, so a crash, a sanitizer report or a hang is counted
// and the run carries on from the next case. Build it under ASan/UBSan for the run that
// counts:
//   meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized
//   build-asan/tools/fuzz-readers --seconds 120
// `--reader NAME --case N` reruns random case N alone (with its bytes written to
// --dump FILE), to reproduce what a run reported.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/fuzz_readers.h"

// A sanitizer finding stops the child with a code of its own, so the parent can tell it
// from a crash or a bad exception; UBSan would otherwise report and carry on.
extern "C" const char* __asan_default_options() { return "exitcode=86:detect_leaks=1"; }
extern "C" const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1:exitcode=87";
}

namespace {

using namespace ht::fuzz;
using Clock = std::chrono::steady_clock;

constexpr int kAsanExit = 86, kUbsanExit = 87, kLeakExit = 23, kBadExit = 3;

// What a child reports while it runs; the parent reads it after the child stops.
struct Progress {
  uint64_t cases, parsed, rejected, bad;
  uint64_t fixed_done;   // fixed cases finished (the child is on fixed case `current` until all are)
  uint64_t current;      // the case being read: fixed index, or random index after them
  int in_random;
  char first_bad[512];
};

struct Totals {
  uint64_t cases = 0, parsed = 0, rejected = 0, bad = 0, crashes = 0, hangs = 0, sanitizer = 0;
  std::vector<std::string> findings;
};

std::string describe(const Progress& p) {
  return p.in_random ? "random case " + std::to_string(p.current) : "fixed case " + std::to_string(p.current);
}

[[noreturn]] void child(const Reader& r, const std::vector<std::string>& fixed, Progress* p,
                        uint64_t fixed_from, uint64_t random_from, double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  auto one = [&](const std::string& bytes) {
    const Result res = run_case(r, bytes);
    ++p->cases;
    if (res.outcome == Outcome::parsed) ++p->parsed;
    if (res.outcome == Outcome::rejected) ++p->rejected;
    if (res.outcome == Outcome::bad) {
      if (p->bad++ == 0)
        std::snprintf(p->first_bad, sizeof p->first_bad, "%s: %s", describe(*p).c_str(), res.message.c_str());
    }
  };
  p->in_random = 0;
  for (uint64_t i = fixed_from; i < fixed.size() && Clock::now() < until; ++i) {
    p->current = i;
    one(fixed[i]);
    p->fixed_done = i + 1;
  }
  p->in_random = 1;
  for (uint64_t i = random_from; Clock::now() < until; ++i) {
    p->current = i;
    one(random_case(r, i));
  }
  std::exit(0);  // exit, not _exit: LeakSanitizer checks at exit
}

// Runs `r` for `seconds`, restarting the child past any case that killed it.
Totals run_reader(const Reader& r, double seconds, double hang_s) {
  const std::vector<std::string> fixed = fixed_cases(r, 2000);
  auto* p = static_cast<Progress*>(
      mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) {
    std::perror("fuzz-readers: mmap");
    std::exit(1);
  }
  Totals t;
  uint64_t fixed_from = 0, random_from = 0;
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    std::memset(p, 0, sizeof *p);
    const double left = std::chrono::duration<double>(until - Clock::now()).count();
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fuzz-readers: fork");
      std::exit(1);
    }
    if (pid == 0) child(r, fixed, p, fixed_from, random_from, left);
    uint64_t seen = 0;
    auto last_change = Clock::now();
    int status = 0;
    bool hung = false;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (p->cases != seen) {
        seen = p->cases;
        last_change = Clock::now();
      } else if (std::chrono::duration<double>(Clock::now() - last_change).count() > hang_s) {
        hung = true;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    t.cases += p->cases;
    t.parsed += p->parsed;
    t.rejected += p->rejected;
    t.bad += p->bad;
    if (p->bad) t.findings.push_back(std::string("bad outcome, ") + p->first_bad);
    const bool clean = !hung && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (clean) break;  // its time is up
    std::string what;
    if (hung) {
      ++t.hangs;
      what = "hang (no progress for " + std::to_string(static_cast<int>(hang_s)) + " s)";
    } else if (WIFSIGNALED(status)) {
      ++t.crashes;
      what = std::string("crash (") + strsignal(WTERMSIG(status)) + ")";
    } else if (const int code = WEXITSTATUS(status);
               code == kAsanExit || code == kUbsanExit || code == kLeakExit) {
      ++t.sanitizer;
      what = code == kAsanExit ? "AddressSanitizer report" : code == kUbsanExit ? "UBSan report" : "leak report";
    } else {
      ++t.crashes;
      what = "exit code " + std::to_string(code);
    }
    t.findings.push_back(what + " at " + describe(*p));
    ++t.cases;  // the case that stopped it
    if (p->in_random) {
      fixed_from = fixed.size();
      random_from = p->current + 1;
    } else {
      fixed_from = p->current + 1;
    }
  }
  munmap(p, sizeof *p);
  return t;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "fuzz-readers: %s\n"
               "usage: fuzz-readers [--seconds S] [--hang-seconds H] [--reader NAME]... [--list]\n"
               "       fuzz-readers --reader NAME --case N [--dump FILE]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10, hang_s = 20;
  std::vector<std::string> only;
  long long one_case = -1;
  std::string dump;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage((a + " needs a value").c_str()));
      return argv[++i];
    };
    try {
      if (a == "--seconds") seconds = std::stod(value());
      else if (a == "--hang-seconds") hang_s = std::stod(value());
      else if (a == "--reader") only.push_back(value());
      else if (a == "--case") one_case = std::stoll(value());
      else if (a == "--dump") dump = value();
      else if (a == "--list") list = true;
      else return usage(("unknown option " + a).c_str());
    } catch (const std::exception&) {
      return usage(("bad number for " + a).c_str());
    }
  }
  if (!(seconds > 0) || !(hang_s > 0)) return usage("--seconds and --hang-seconds must be > 0");

  std::string scratch = (std::filesystem::temp_directory_path() / "ht-fuzz-readers-XXXXXX").string();
  if (!mkdtemp(scratch.data())) {
    std::perror("fuzz-readers: mkdtemp");
    return 1;
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{scratch};

  std::vector<Reader> readers = all_readers(scratch);
  if (list) {
    for (const Reader& r : readers) std::printf("%s (%zu-byte seed)\n", r.name.c_str(), r.seed.size());
    return 0;
  }
  std::vector<const Reader*> chosen;
  for (const Reader& r : readers)
    if (only.empty() || std::find(only.begin(), only.end(), r.name) != only.end()) chosen.push_back(&r);
  if (chosen.size() < (only.empty() ? readers.size() : only.size()))
    return usage("an unknown --reader name (see --list)");

  if (one_case >= 0) {
    if (chosen.size() != 1) return usage("--case needs exactly one --reader");
    const std::string bytes = random_case(*chosen[0], static_cast<uint64_t>(one_case));
    if (!dump.empty()) std::ofstream(dump, std::ios::binary) << bytes;
    const Result res = run_case(*chosen[0], bytes);
    const char* kind = res.outcome == Outcome::parsed ? "parsed" : res.outcome == Outcome::rejected ? "rejected" : "BAD";
    std::printf("%s case %lld (%zu bytes): %s %s\n", chosen[0]->name.c_str(), one_case, bytes.size(), kind,
                res.message.c_str());
    return res.outcome == Outcome::bad ? kBadExit : 0;
  }

  std::printf("%-26s %9s %9s %9s %5s %7s %5s %9s\n", "reader", "cases", "parsed", "rejected", "bad",
              "crashes", "hangs", "sanitizer");
  uint64_t problems = 0;
  std::vector<std::string> findings;
  for (const Reader* r : chosen) {
    const Totals t = run_reader(*r, seconds, hang_s);
    std::printf("%-26s %9llu %9llu %9llu %5llu %7llu %5llu %9llu\n", r->name.c_str(),
                static_cast<unsigned long long>(t.cases), static_cast<unsigned long long>(t.parsed),
                static_cast<unsigned long long>(t.rejected), static_cast<unsigned long long>(t.bad),
                static_cast<unsigned long long>(t.crashes), static_cast<unsigned long long>(t.hangs),
                static_cast<unsigned long long>(t.sanitizer));
    std::fflush(stdout);
    problems += t.bad + t.crashes + t.hangs + t.sanitizer;
    for (const std::string& f : t.findings) findings.push_back(r->name + ": " + f);
  }
  for (const std::string& f : findings) std::printf("  %s\n", f.c_str());
  return problems ? 1 : 0;
}
