// hetrain: one binary, one subcommand per verb (cli/*_command.cpp). Each verb
// registers itself here. Errors surface as one line on stderr: a rejected config exits
// 2, any other failure 1.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "runtime/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"hetrain: train neural networks across heterogeneous hardware", "hetrain"};
  app.set_version_flag("--version", std::string("hetrain ") + HETRAIN_VERSION);
  app.require_subcommand(0, 1);
  app.footer("Run 'hetrain SUBCOMMAND --help' for a subcommand's options.");
  hetrain_cli::register_info(app);
  hetrain_cli::register_train(app);
  hetrain_cli::register_eval(app);
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ht::config::ConfigError& e) {
    // A rejected config: nothing was started, and the exit status says so.
    std::fprintf(stderr, "hetrain: config error: %s\n", e.what());
    return 2;
  } catch (const ht::runtime::Interrupted& e) {
    std::fprintf(stderr, "hetrain: %s\n", e.what());
    return 130;  // the shell's status for SIGINT
  } catch (const std::exception& e) {  // ht::Error and anything from the library
    std::fprintf(stderr, "hetrain: error: %s\n", e.what());
    return 1;
  }
  if (app.get_subcommands().empty()) std::fputs(app.help().c_str(), stdout);
  return 0;
}
