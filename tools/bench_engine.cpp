// tools/bench-engine's timing program: median time of one full training step
// (forward, cross-entropy, backward, AdamW) of the three reference models on one
// thread, plus throughput and peak engine memory.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "models/models.h"
#include "ops/ops.h"
#include "optim/adamw.h"

using namespace ht;

namespace {

struct Workload {
  std::string name, description;
  nn::Sequential model;
  Tensor input, labels;
};

Tensor random_images(Rng& rng, Shape shape) {
  std::vector<float> v(numel(shape));
  for (float& x : v) x = rng.normal();
  return Tensor::from_vector(v, shape);
}

Tensor random_ints(Rng& rng, Shape shape, int32_t bound) {
  std::vector<int32_t> v(numel(shape));
  for (int32_t& x : v) x = static_cast<int32_t>(rng.below(bound));
  return Tensor::from_ints(v, shape);
}

std::vector<Workload> workloads(const std::vector<std::string>& names) {
  Rng rng(7);
  std::vector<Workload> out;
  for (const std::string& n : names) {
    if (n == "mlp")
      out.push_back({n, "784-512-512-10 ReLU, batch 256", models::build_mlp({}, 1),
                     random_images(rng, {256, 784}), random_ints(rng, {256}, 10)});
    else if (n == "cnn")
      out.push_back({n, "2x(conv3x3+ReLU+pool) 32/64, fc 128, batch 64", models::build_cnn({}, 1),
                     random_images(rng, {64, 1, 28, 28}), random_ints(rng, {64}, 10)});
    else if (n == "gpt")
      out.push_back({n, "4 layers, 4 heads, d 128, T 128, V 96, untied head, batch 16",
                     models::build_gpt({}, 1), random_ints(rng, {16, 128}, 96),
                     random_ints(rng, {16, 128}, 96)});
    else
      throw CLI::ValidationError("--models", "unknown model '" + n + "'; expected mlp, cnn or gpt");
  }
  return out;
}

double step_ms(Workload& w, optim::AdamW& opt) {
  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = w.model.forward(w.input);
  Tensor loss = cross_entropy(reshape(logits, {-1, logits.shape().back()}), reshape(w.labels, {-1}));
  opt.zero_grad();
  loss.backward();
  opt.step();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time one training step (forward + backward + AdamW) of the reference models"};
  int steps = 20, warmup = 3, threads = 1;
  std::string json_path, models_arg = "mlp,cnn,gpt";
  app.add_option("--steps", steps, "Timed steps per model")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "Compute threads")->check(CLI::PositiveNumber);
  app.add_option("--models", models_arg, "Comma-separated subset of mlp,cnn,gpt");
  app.add_option("--json", json_path, "Write the figures to this file");
  CLI11_PARSE(app, argc, argv);

  set_thread_count(threads);
  std::vector<std::string> names;
  for (size_t start = 0; start <= models_arg.size();) {
    size_t end = models_arg.find(',', start);
    if (end == std::string::npos) end = models_arg.size();
    names.push_back(models_arg.substr(start, end - start));
    start = end + 1;
  }
  std::vector<Workload> ws;
  try {
    ws = workloads(names);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  }

  nlohmann::json report = {{"threads", threads}, {"steps", steps}, {"models", nlohmann::json::object()}};
  std::printf("%-5s %10s %10s %12s %11s  %s\n", "model", "median ms", "min ms", "samples/s",
              "peak MiB", "workload");
  for (Workload& w : ws) {
    optim::AdamW opt(w.model.named_parameters(), {});
    Allocator& alloc = cpu_backend().allocator();
    alloc.reset_peak();
    for (int i = 0; i < warmup; ++i) step_ms(w, opt);
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) times.push_back(step_ms(w, opt));
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    if (times.size() % 2 == 0) median = 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
    double batch = static_cast<double>(w.input.shape()[0]);
    double peak_mib = static_cast<double>(alloc.peak_bytes()) / (1 << 20);
    std::printf("%-5s %10.2f %10.2f %12.0f %11.1f  %s\n", w.name.c_str(), median, times.front(),
                batch / median * 1e3, peak_mib, w.description.c_str());
    report["models"][w.name] = {{"median_ms", median},   {"min_ms", times.front()},
                                {"samples_per_s", batch / median * 1e3},
                                {"peak_mib", peak_mib},  {"workload", w.description}};
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << report.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "bench_engine: cannot write --json file '%s'\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
