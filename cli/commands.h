#pragma once

namespace CLI {
class App;
}

namespace hetrain_cli {

// `hetrain info`: what this build and this process can use.
void register_info(CLI::App& app);

}  // namespace hetrain_cli
