// hetrain: one binary, one subcommand per verb (cli/*_command.cpp). Each verb
// registers itself here. Errors surface as one line on stderr: a rejected config exits
// 2, any other failure 1.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <exception>
#include <string>
#include <thread>

#include "backend/cpu/blas_kernels.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "comm/launch.h"
#include "config/config.h"
#include "core/error.h"
#include "plan/plan_facts.h"
#include "report/plan_text.h"
#include "runtime/run_dir.h"
#include "runtime/trainer.h"

namespace {

// Under mpirun an error names its rank and ends every rank: a peer must not wait for
// this one until its deadline. With `end_all` false (a stop every rank agreed on) each
// rank returns, to end through MPI_Finalize: Open MPI 4's launcher can crash taking
// several ranks' aborts at once.
//
// A rejected config or option (status 2; a signal's status is 130 or 143) is, in the
// common case, the same on every rank, each having read the same file or command line:
// a rank other than 0 waits kSameErrorGraceS before it says so, so that the launcher,
// ending the job on rank 0's exit with the same message, leaves one copy where every rank
// printed one. A rank whose error is its own (a device entry of its own, a file only its
// host lacks) still says it, that much later.
constexpr auto kSameErrorGraceS = std::chrono::seconds(3);

int finish(int status, const char* kind, const char* what, bool end_all = true) {
  const ht::comm::Launch l = ht::comm::launch();
  const bool multi = l.launched && l.size != 1;  // size 0: not known, so possibly many
  if (multi && status == 2 && l.rank != 0) std::this_thread::sleep_for(kSameErrorGraceS);
  // Messages about peers (a peer timeout) begin with the rank that reports them.
  const std::string own = "rank " + std::to_string(l.rank) + ": ";
  if (multi && std::string_view(what).substr(0, own.size()) == own) what += own.size();
  if (multi)
    std::fprintf(stderr, "hetrain: rank %d: %s%s\n", l.rank, kind, what);
  else
    std::fprintf(stderr, "hetrain: %s%s\n", kind, what);
  std::fflush(stderr);
  if (multi && end_all) ht::comm::abort_job(status);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  ht::prefer_blas_kernels(argv);  // before anything else: it may re-execute the binary
  CLI::App app{"hetrain: train neural networks across heterogeneous hardware", "hetrain"};
  app.set_version_flag("--version", std::string("hetrain ") + HETRAIN_VERSION);
  app.require_subcommand(0, 1);
  app.footer("Run 'hetrain SUBCOMMAND --help' for a subcommand's options.");
  hetrain_cli::register_info(app);
  hetrain_cli::register_probe(app);
  hetrain_cli::register_plan(app);
  hetrain_cli::register_train(app);
  hetrain_cli::register_eval(app);
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    // --help and --version end here with status 0; a rejected option is a bad input like
    // a rejected config: status 2 and one line, whatever CLI11's own code for it.
    if (e.get_exit_code() == 0) return app.exit(e);
    const std::string what = std::string(e.what()) + " (see 'hetrain --help' and 'hetrain COMMAND --help')";
    return finish(2, "option error: ", what.c_str());
  } catch (const ht::config::ConfigError& e) {
    // A rejected config: nothing was started, and the exit status says so.
    return finish(2, "config error: ", e.what());
  } catch (const ht::runtime::RunDirInUse& e) {
    const std::string what = std::string(e.what()) + "; pass --resume to continue it, or --run-dir to start a new one";
    return finish(1, "error: ", what.c_str());
  } catch (const ht::runtime::InterruptedTogether& e) {
    return finish(e.status(), "", e.what(), false);
  } catch (const ht::runtime::Interrupted& e) {
    return finish(e.status(), "", e.what());  // the shell's status for the signal
  } catch (const ht::plan::NoPlanFits& e) {
    return finish(1, "error: ", ht::report::no_plan_text(e).c_str());
  } catch (const std::exception& e) {  // ht::Error and anything from the library
    return finish(1, "error: ", e.what());
  }
  if (app.get_subcommands().empty()) std::fputs(app.help().c_str(), stdout);
  return 0;
}
