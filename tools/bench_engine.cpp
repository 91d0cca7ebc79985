// tools/bench-engine's timing program: median time of one full training step of the
// three reference models, timed two ways on the same workload.
//
// training path: what `hetrain train` runs in one process, the Executor with the plan of
//   one rank (single_process_plan): the graph cut at block boundaries, the loss summed
//   over the batch and scaled by 1 / predictions, AdamW over the executor's parameters.
// model path: the plain loop, Sequential::forward, mean cross-entropy, backward, AdamW,
//   as a hand-written training loop would do it.
//
// Both take the same fixed batch every step (no data loading, as in the PyTorch script),
// AdamW with PyTorch's defaults (lr 1e-3, weight decay 0.01), no clipping.
//
// --device cuda runs both on the GPU: the model is built in host memory and moved, the
// batch made there, and each timed step ends with the backend's synchronize(). Besides
// samples/s it reports tokens/s and the model FLOP utilisation (3 x the forward FLOPs of
// nn::cost_model a sample, over the step's time) against the GPU's bf16 dense peak from
// the catalogue and against its GEMM rates measured here (probe/gpu_rates.h, in fp32 mode
// before any step). --precision bf16 runs both paths' products on bf16 tensor cores
// (train.precision bf16; sm_80+), everything else in fp32; the default is fp32. Where no
// GPU is usable it exits 77 (skipped) with a line saying why.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/blas_kernels.h"
#include "backend/cuda/device_select.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "models/models.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "plan/cluster_model.h"
#include "probe/gpu_query.h"
#include "probe/gpu_rates.h"
#include "probe/microbench.h"
#include "runtime/executor.h"
#include "runtime/task.h"

using namespace ht;

namespace {

constexpr float kLr = 1e-3f;
constexpr float kWeightDecay = 1e-2f;  // torch.optim.AdamW's default, which the baseline uses

struct Workload {
  std::string name, description;
  std::function<nn::Sequential()> build;
  Tensor input, labels;
  int64_t predictions_per_sample = 1;
};

Tensor random_images(Rng& rng, Shape shape, Backend& be) {
  std::vector<float> v(numel(shape));
  for (float& x : v) x = rng.normal();
  return Tensor::from_vector(v, shape, be);
}

Tensor random_ints(Rng& rng, Shape shape, int32_t bound, Backend& be) {
  std::vector<int32_t> v(numel(shape));
  for (int32_t& x : v) x = static_cast<int32_t>(rng.below(bound));
  return Tensor::from_ints(v, shape, be);
}

// GPT-2 small's shape (124M parameters with its 50,257-token vocabulary, untied here), at
// a batch that keeps a large GPU's arithmetic units busy: tools/bench_engine_torch.py's
// gpt-large is the same model.
models::GptSpec gpt_large() {
  models::GptSpec g;
  g.vocab = 50257;
  g.context = 1024;
  g.layers = 12;
  g.heads = 12;
  g.d_model = 768;
  return g;
}
constexpr int64_t kGptLargeBatch = 8;

// The batches are made on `be`, where both paths compute.
std::vector<Workload> workloads(const std::vector<std::string>& names, Backend& be) {
  Rng rng(7);
  std::vector<Workload> out;
  for (const std::string& n : names) {
    if (n == "mlp")
      out.push_back({n, "784-512-512-10 ReLU, batch 256", [] { return models::build_mlp({}, 1); },
                     random_images(rng, {256, 784}, be), random_ints(rng, {256}, 10, be), 1});
    else if (n == "cnn")
      out.push_back({n, "2x(conv3x3+ReLU+pool) 32/64, fc 128, batch 64", [] { return models::build_cnn({}, 1); },
                     random_images(rng, {64, 1, 28, 28}, be), random_ints(rng, {64}, 10, be), 1});
    else if (n == "gpt")
      out.push_back({n, "4 layers, 4 heads, d 128, T 128, V 96, untied head, batch 16",
                     [] { return models::build_gpt({}, 1); }, random_ints(rng, {16, 128}, 96, be),
                     random_ints(rng, {16, 128}, 96, be), 128});
    else if (n == "gpt-large") {
      const models::GptSpec g = gpt_large();
      out.push_back({n, "12 layers, 12 heads, d 768, T 1024, V 50257, untied head, batch 8",
                     [g] { return models::build_gpt(g, 1); }, random_ints(rng, {kGptLargeBatch, g.context}, 50257, be),
                     random_ints(rng, {kGptLargeBatch, g.context}, 50257, be), g.context});
    } else
      throw CLI::ValidationError("--models", "unknown model '" + n + "'; expected mlp, cnn, gpt or gpt-large");
  }
  return out;
}

// Forward FLOPs of one sample (nn::cost_model's count), for the utilisation figures.
double forward_flops_per_sample(const nn::Sequential& model) {
  double f = 0;
  for (const nn::BlockShape& b : nn::shape_of(model).blocks) f += static_cast<double>(b.flops_per_sample);
  return f;
}

// The executor's data source: the workload's one batch at every stream position.
class FixedBatchTask final : public runtime::TrainingOnlyTask {
 public:
  explicit FixedBatchTask(const Workload& w) : TrainingOnlyTask(w.input.backend()), w_(w) {}
  nn::Sequential build_model(uint64_t) const override { return w_.build(); }
  int64_t train_size() const override { return w_.input.shape()[0]; }
  int64_t predictions_per_sample() const override { return w_.predictions_per_sample; }
  runtime::Batch train_batch(int64_t, int64_t count) override {
    HT_CHECK(count == w_.input.shape()[0], "bench_engine: the executor asked for ", count,
             " samples; the workload's batch is ", w_.input.shape()[0]);
    return {w_.input, w_.labels};
  }

 private:
  const Workload& w_;
};

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

struct Timing {
  std::vector<double> ms;
  long faults = 0;
  double median_ms() const {
    std::vector<double> t = ms;
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  }
  double min_ms() const { return *std::min_element(ms.begin(), ms.end()); }
  double faults_per_step() const { return static_cast<double>(faults) / static_cast<double>(ms.size()); }
  double peak_mib = 0;  // engine memory of this path alone: its model, state and step
};

void timed(Timing& t, const std::function<void()>& one_step) {
  const long f0 = minor_faults();
  const auto t0 = Clock::now();
  one_step();
  t.ms.push_back(ms_since(t0));
  t.faults += minor_faults() - f0;
}

// The engine memory a path adds over what is live before it: set up in `setup`, then one
// step (its peak; the rest repeat it).
double peak_mib_of(Backend& be, const std::function<void()>& setup, const std::function<void()>& one_step) {
  Allocator& alloc = be.allocator();
  const size_t before = alloc.live_bytes();
  alloc.reset_peak();
  setup();
  one_step();
  return static_cast<double>(alloc.peak_bytes() - before) / (1 << 20);
}

// The two paths step by step in turn (which goes first alternates), after `warmup` untimed
// steps of each: both see the same seconds of this host, whose speed drifts.
std::pair<Timing, Timing> time_both(const Workload& w, int warmup, int steps, Precision precision) {
  const int64_t batch = w.input.shape()[0];
  Backend& be = w.input.backend();
  Timing training, plain;
  // The training path: the executor over the plan of one rank, fed by a task.
  FixedBatchTask task(w);
  nn::Sequential exec_model;
  plan::Plan plan;
  std::unique_ptr<runtime::Executor> ex;
  int64_t position = 0;
  // Each step ends when the device is done with it, not when its last launch returns.
  auto training_step = [&] {
    ex->step(position++ * batch, kLr, false);
    be.synchronize();
  };
  training.peak_mib = peak_mib_of(be, [&] {
    exec_model = task.build_model(1);
    plan = runtime::single_process_plan(static_cast<int>(exec_model.size()), batch, 1);
    config::TrainConfig train;
    train.batch_size = batch;
    train.optimizer.lr = kLr;
    train.optimizer.weight_decay = kWeightDecay;
    train.precision = precision_name(precision);  // the executor sets the backend's mode
    // One process: its plan waits on no peer, so the bound is the config's default.
    ex = std::make_unique<runtime::Executor>(plan, exec_model, task, comm::world(), train,
                                             comm::Timeout(config::ParallelConfig{}.peer_timeout_s));
  }, training_step);
  // The model path: forward, mean cross-entropy, backward, AdamW.
  nn::Sequential model;
  std::unique_ptr<optim::AdamW> opt;
  auto model_step = [&] {
    Tensor logits = model.forward(w.input);
    Tensor loss = cross_entropy(reshape(logits, {-1, logits.shape().back()}), reshape(w.labels, {-1}));
    opt->zero_grad();
    loss.backward();
    opt->step();
    be.synchronize();
  };
  plain.peak_mib = peak_mib_of(be, [&] {
    be.set_precision(precision);  // as the executor did: the model path in the same mode
    model = w.build();
    for (const auto& [name, p] : model.named_parameters()) p.rehome(be, false);
    optim::AdamWOptions o;
    o.lr = kLr;
    o.weight_decay = kWeightDecay;
    opt = std::make_unique<optim::AdamW>(model.named_parameters(), o);
  }, model_step);
  for (int i = 1; i < warmup; ++i) {  // one step of each ran above
    training_step();
    model_step();
  }
  for (int i = 0; i < steps; ++i) {
    if (i % 2 == 0) {
      timed(training, training_step);
      timed(plain, model_step);
    } else {
      timed(plain, model_step);
      timed(training, training_step);
    }
  }
  return {training, plain};
}

}  // namespace

int main(int argc, char** argv) {
  ht::prefer_blas_kernels(argv);  // the kernels hetrain runs on (blas_kernels.h)
  CLI::App app{"Time one training step of the reference models: the executor's training path and the plain model path"};
  int steps = 20, warmup = 3, threads = 1;
  std::string json_path, models_arg = "mlp,cnn,gpt", device_text = "cpu", precision_text = "fp32";
  app.add_option("--steps", steps, "Timed steps per model and path")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed steps of each path first (the first also gives the peak memory)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--threads", threads, "Compute threads")->check(CLI::PositiveNumber);
  app.add_option("--models", models_arg, "Comma-separated subset of mlp,cnn,gpt,gpt-large");
  app.add_option("--json", json_path, "Write the figures to this file");
  app.add_option("--device", device_text, "cpu, cuda (GPU 0), cuda:N or auto")->capture_default_str();
  app.add_option("--precision", precision_text,
                 "fp32, or bf16 (products on bf16 tensor cores, sm_80+) as train.precision")
      ->check(CLI::IsMember(precision_names()))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  DeviceChoice device;
  DeviceRequest request;
  try {
    request = parse_device(device_text);
    const GpuAvailability gpus = query_gpus();
    if (request.kind == DeviceRequest::Kind::cuda && (!gpus.backend_built || gpus.count == 0)) {
      std::printf("bench_engine: --device %s: no GPU (%s); skipped\n", device_text.c_str(),
                  gpus.backend_built ? gpus.why_none.c_str() : "this build has no CUDA backend");
      return 77;
    }
    device = choose_device(request, 0, gpus);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_engine: --device: %s\n", e.what());
    return 2;
  }
  if (!device.note.empty()) std::printf("%s\n", device.note.c_str());
  Backend& be = backend_for(device);
  const bool gpu = device.kind == DeviceKind::cuda;
  Precision precision = Precision::fp32;
  try {
    const Precision wanted = parse_precision(precision_text);
    const PrecisionChoice p = choose_precision(wanted, request, device.kind,
                                               gpu ? be.precision_refusal(wanted) : std::string());
    if (!p.note.empty()) std::printf("%s\n", p.note.c_str());
    precision = p.precision;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_engine: --precision: %s\n", e.what());
    return 2;
  }

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
    ws = workloads(names, be);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  }

  nlohmann::json report = {{"threads", threads}, {"steps", steps}, {"device", be.name()},
                            {"models", nlohmann::json::object()}};
  // The rates the utilisation is measured against: on a GPU, its GEMMs as the probe times
  // them and the catalogue's bf16 dense peak for its name; on the CPU, the probe's sgemm.
  double fp32_gemm = 0, bf16_gemm = 0, bf16_peak = 0;
  std::string peak_source = "no catalogue entry";
  if (gpu) {
    const probe::DeviceRates r = probe::measure_gpu(be, device.index, 2.0);
    fp32_gemm = r.sgemm_gflops * 1e9;
    bf16_gemm = r.bf16_gemm_gflops * 1e9;
    std::string note;
    const std::vector<probe::GpuInfo> gpus = probe::query_gpus(note);
    for (const probe::GpuInfo& g : gpus) {
      if (g.index != device.index) continue;
      report["gpu"] = g.name;
      const plan::Catalogue cat = plan::read_catalogue(plan::default_catalogue_path());
      if (const plan::CatalogueDevice* d = plan::match_catalogue(cat, g.name, static_cast<double>(g.memory_total))) {
        bf16_peak = d->bf16_tflops * 1e12;
        peak_source = "catalogue " + d->id;
      }
    }
    std::printf("%s: fp32 GEMM %.1f TFLOP/s, bf16 GEMM %.1f TFLOP/s (measured, n = %lld); bf16 dense peak %.1f TFLOP/s (%s)\n",
                be.name().c_str(), fp32_gemm / 1e12, bf16_gemm / 1e12, static_cast<long long>(r.sgemm_size),
                bf16_peak / 1e12, peak_source.c_str());
  } else {
    fp32_gemm = probe::measure_device(1.0).sgemm_gflops * 1e9;
    std::printf("cpu: fp32 GEMM %.1f GFLOP/s (measured, n = 1024; %s)\n", fp32_gemm / 1e9, ht::blas_kernels_text().c_str());
  }
  report["rates"] = {{"fp32_gemm_flops", fp32_gemm}, {"bf16_gemm_flops", bf16_gemm}, {"bf16_peak_flops", bf16_peak},
                     {"bf16_peak_source", peak_source}, {"step_precision", precision_name(precision)}};
  auto share = [](double flops, double rate) { return rate > 0 ? flops / rate : 0.0; };
  std::printf("%-9s %-13s %10s %10s %11s %11s %8s %8s %8s %9s %11s  %s\n", "model", "path", "median ms", "min ms",
              "samples/s", "tokens/s", "MFU pk", "MFU bf16", "MFU fp32", "peak MiB", "faults/step", "workload");
  for (const Workload& w : ws) {
    const double batch = static_cast<double>(w.input.shape()[0]);
    const double tokens = batch * static_cast<double>(w.predictions_per_sample);
    const double step_flops = 3 * forward_flops_per_sample(w.build()) * batch;
    const auto [training, plain] = time_both(w, warmup, steps, precision);
    nlohmann::json entry = {{"workload", w.description}, {"flops_per_step", step_flops}};
    for (const auto& [path, t] : {std::pair{"training", &training}, std::pair{"model", &plain}}) {
      const double median = t->median_ms();
      const double achieved = step_flops / (median / 1e3);
      const double mfu_peak = share(achieved, bf16_peak), mfu_bf16 = share(achieved, bf16_gemm),
                   mfu_fp32 = share(achieved, fp32_gemm);
      std::printf("%-9s %-13s %10.2f %10.2f %11.0f %11.0f %7.1f%% %7.1f%% %7.1f%% %9.1f %11.1f  %s\n", w.name.c_str(),
                  std::string(path) == "training" ? "training path" : "model path", median, t->min_ms(),
                  batch / median * 1e3, tokens / median * 1e3, 100 * mfu_peak, 100 * mfu_bf16, 100 * mfu_fp32,
                  t->peak_mib, t->faults_per_step(), w.description.c_str());
      entry[path] = {{"median_ms", median},
                     {"min_ms", t->min_ms()},
                     {"samples_per_s", batch / median * 1e3},
                     {"tokens_per_s", tokens / median * 1e3},
                     {"mfu_vs_bf16_peak", mfu_peak},
                     {"mfu_vs_measured_bf16_gemm", mfu_bf16},
                     {"mfu_vs_measured_fp32_gemm", mfu_fp32},
                     {"peak_mib", t->peak_mib},
                     {"minor_faults_per_step", t->faults_per_step()}};
    }
    report["models"][w.name] = entry;
  }
  std::printf("MFU = 3 x forward FLOPs x batch / step time; pk: against the bf16 dense peak, bf16 and fp32: "
              "against the GEMM rates measured above (0 where not known). The step runs in %s%s.\n",
              precision_name(precision),
              precision == Precision::bf16 ? " (products on bf16 tensor cores, fp32 accumulation, "
                                             "weights and every other op)" : "");
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
