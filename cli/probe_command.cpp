// `hetrain probe`: fingerprint every rank's hardware and links.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_select.h"
#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/planning.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "probe/probe.h"
#include "runtime/task.h"
#include "runtime/atomic_file.h"

namespace hetrain_cli {

namespace {
// A device the option names badly is bad input, as in a config: exit 2.
ht::DeviceRequest parse_probe_device(const std::string& text) {
  try {
    return ht::parse_device(text);
  } catch (const ht::Error& e) {
    throw ht::config::ConfigError(std::string("probe --device: ") + e.what());
  }
}
}  // namespace

void register_probe(CLI::App& app) {
  struct Args {
    bool quick = false;
    std::string json, model, device = "cpu";
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("probe", "Fingerprint each rank's hardware, device rates and links");
  cmd->add_flag("--quick", args->quick, "Shorter measurements (under 5 s on 4 ranks), less accurate");
  CLI::Option* json_option =
      cmd->add_option("--json", args->json, "Write the cluster fingerprint here (for `hetrain plan --cluster` and `hetrain train --cluster`)");
  cmd->add_option("--model", args->model,
                  "Config whose model blocks are profiled on each rank; its emulate section applies")
      ->check(non_empty_path());
  cmd->add_option("--device", args->device,
                  "What each rank probes and trains on: cpu, cuda (the GPU of its local rank), cuda:N or auto; "
                  "or one per world rank, comma-separated (cuda,cpu,cpu: a job of GPU and CPU ranks)")
      ->capture_default_str();
  refuse_option_names_as_values(cmd);
  cmd->callback([args, json_option] {
    // Before the probe's seconds of work: an output that cannot be written fails now.
    check_given_path("--json", json_option->count() > 0, args->json);
    check_not_an_input("--json", args->json, {{"the --model config", args->model}});
    check_outputs({{"--json", args->json}});
    ht::comm::Communicator& world = ht::comm::world();
    std::vector<std::string> devices;
    for (size_t at = 0;;) {
      const size_t comma = args->device.find(',', at);
      devices.push_back(args->device.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    if (devices.size() > 1 && static_cast<int>(devices.size()) != world.size())
      throw ht::config::ConfigError("probe --device \"" + args->device + "\": " + std::to_string(devices.size()) +
                                    " devices for " + std::to_string(world.size()) +
                                    " ranks; expected one per world rank, comma-separated, or one for every rank");
    // A CPU probe asks for no GPU: querying them would load the CUDA backend module.
    const ht::DeviceRequest request =
        parse_probe_device(devices.size() > 1 ? devices[static_cast<size_t>(world.rank())] : devices[0]);
    const ht::DeviceChoice device = ht::choose_device(
        request, world.local_rank(),
        request.kind == ht::DeviceRequest::Kind::cpu ? ht::GpuAvailability{} : ht::query_gpus());
    if (!device.note.empty()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), device.note.c_str());
    ht::probe::ProbeOptions opts;
    opts.quick = args->quick;
    opts.backend = &ht::backend_for(device);
    if (device.kind == ht::DeviceKind::cuda) opts.gpu_index = device.index;
    if (!args->model.empty()) opts.model = ht::config::load_config(args->model);
    opts.build_model = [](const ht::config::Config& c) {
      return ht::runtime::make_task(c, ht::cpu_backend())->build_model(c.train.seed);
    };
    ht::probe::ClusterFingerprint c = ht::probe::run_probe(world, opts);
    if (world.rank() != 0) return;
    if (opts.model) c.model_signature = model_signature(ht::runtime::describe_model(*opts.model));
    std::printf("%s", ht::probe::format_cluster(c).c_str());
    if (!args->json.empty()) {
      ht::runtime::write_file_atomically(args->json, ht::probe::cluster_to_json(c) + "\n",
                                         "cluster file");
      std::printf("\ncluster fingerprint written to %s\n", args->json.c_str());
    }
  });
}

}  // namespace hetrain_cli
