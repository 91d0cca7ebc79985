#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/blas_kernels.h"
#include "backend/registry.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "core/threads.h"

namespace hetrain_cli {

namespace {

nlohmann::json describe(const ht::Backend& be) {
  ht::MemoryInfo mem = be.memory_info();
  nlohmann::json ops = nlohmann::json::array();
  for (int k = 0; k < static_cast<int>(ht::OpKind::count_); ++k)
    if (be.supports(static_cast<ht::OpKind>(k)))
      ops.push_back(ht::op_kind_name(static_cast<ht::OpKind>(k)));
  return {{"name", be.name()},
          {"memory_total_bytes", mem.total},
          {"memory_available_bytes", mem.available},
          {"supported_ops", ops}};
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show this build's backends, threads and memory");
  auto json_out = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_out, "Print machine-readable JSON");
  cmd->callback([json_out] {
    int threads = ht::resolve_thread_count(0, ht::comm::world().local_size());
    // The CUDA backend is a module loaded where a GPU is asked for (registry.h): info
    // names it without loading it, which would cost every `hetrain info` its libraries.
#ifdef HETRAIN_HAVE_CUDA_BACKEND
    const bool cuda_built = true;
#else
    const bool cuda_built = false;
#endif
    nlohmann::json info = {
        {"version", HETRAIN_VERSION},
        {"threads", threads},
        {"cuda_backend", cuda_built},
        {"blas_kernels", ht::blas_core_name()},
        {"blas_kernels_text", ht::blas_kernels_text()},
        {"backends", {describe(ht::cpu_backend())}},
    };
    if (cuda_built) info["cuda_module"] = ht::cuda_module_path();
    if (*json_out) {
      std::printf("%s\n", info.dump(2).c_str());
      return;
    }
    std::printf("hetrain %s\n", HETRAIN_VERSION);
    std::printf("threads        %d (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or cores per rank)\n",
                threads);
    std::printf("blas kernels   %s\n", info["blas_kernels_text"].get<std::string>().c_str());
    if (cuda_built)
      std::printf("cuda backend   built: %s, loaded where a GPU is asked for (device cuda, cuda:N or auto; "
                  "probe --device)\n",
                  info["cuda_module"].get<std::string>().c_str());
    else
      std::printf("cuda backend   not built (CPU only)\n");
    for (const auto& be : info["backends"]) {
      std::printf("backend %-6s memory %.1f GiB total, %.1f GiB available, %zu ops\n",
                  be["name"].get<std::string>().c_str(),
                  be["memory_total_bytes"].get<double>() / (1 << 30),
                  be["memory_available_bytes"].get<double>() / (1 << 30),
                  be["supported_ops"].size());
    }
  });
}

}  // namespace hetrain_cli
