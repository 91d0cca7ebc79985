// hetrain: one binary, one subcommand per verb (cli/*_command.cpp). Each verb
// registers itself here; errors from the engine surface as one line and exit 1.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"hetrain: train neural networks across heterogeneous hardware", "hetrain"};
  app.set_version_flag("--version", std::string("hetrain ") + HETRAIN_VERSION);
  app.require_subcommand(0, 1);
  app.footer("Run 'hetrain SUBCOMMAND --help' for a subcommand's options.");
  hetrain_cli::register_info(app);
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ht::Error& e) {
    std::fprintf(stderr, "hetrain: error: %s\n", e.what());
    return 1;
  }
  if (app.get_subcommands().empty()) std::fputs(app.help().c_str(), stdout);
  return 0;
}
