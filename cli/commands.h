#pragma once

namespace CLI {
class App;
}

namespace hetrain_cli {

// `hetrain info`: what this build and this process can use.
void register_info(CLI::App& app);

// `hetrain probe`: fingerprint every rank's hardware, device rates and links.
void register_probe(CLI::App& app);

// `hetrain plan CONFIG`: plan and show the split over a cluster (probed or given).
void register_plan(CLI::App& app);

// `hetrain train CONFIG`: train one process from a config, into a run directory.
void register_train(CLI::App& app);

// `hetrain eval CONFIG --checkpoint FILE`: evaluate a checkpoint.
void register_eval(CLI::App& app);

}  // namespace hetrain_cli
