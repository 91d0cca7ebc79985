// train.precision on the host: bf16 rounding bit for bit, the key's names, the choice
// against the device (every message), the CPU backend's refusal, and the dynamic loss
// scale on synthetic gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_select.h"
#include "backend/precision.h"
#include "config/config.h"
#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/planner.h"
#include "plan/policy_plan.h"
#include "probe/fingerprint.h"
#include "runtime/loss_scale.h"
#include "tensor/tensor.h"
#include "tests/unit/error_message.h"
#include "tests/unit/plan_fixtures.h"
#include "tests/unit/source_root.h"
#include "tests/unit/temp_dir.h"

#include <fstream>
#include <nlohmann/json.hpp>

using namespace ht;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::string config_with_precision(const std::string& p) {
  return R"({"model": {"type": "mlp"}, "data": {"dataset": "fashion_mnist"},
             "train": {"steps": 10, "optimizer": {"lr": 0.01}, "precision": )" + p + "}}";
}

// A cluster file of one H200 rank probed at 50 TFLOP/s fp32 and 700 TFLOP/s bf16, and one
// sm_75 rank (bf16 rate 0) and a CPU rank: round figures, so every expectation is hand-made.
nlohmann::json cluster_file() {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  auto gpu = [&](const char* name, const char* cc) {
    return nlohmann::json{{"index", 0}, {"name", name}, {"compute_capability", cc}, {"sm_count", 132},
                          {"memory_total_bytes", static_cast<uint64_t>(140 * kGiB)},
                          {"memory_free_bytes", static_cast<uint64_t>(100 * kGiB)},
                          {"host_to_device_gb_s", 50.0}, {"device_to_host_gb_s", 40.0}};
  };
  auto host = [&](const char* name, nlohmann::json gpus) {
    return nlohmann::json{{"host", name}, {"cpu_model", "Xeon"}, {"physical_cores", 16},
                          {"hardware_threads", 32}, {"memory_total_bytes", static_cast<uint64_t>(64 * kGiB)},
                          {"memory_available_bytes", static_cast<uint64_t>(60 * kGiB)}, {"gpus", gpus}};
  };
  auto rank = [&](int r, nlohmann::json h, nlohmann::json device) {
    return nlohmann::json{{"rank", r}, {"local_rank", 0}, {"host", h}, {"device", device},
                          {"memory_cap_bytes", 0}, {"blocks", nlohmann::json::array()},
                          {"emulation", nlohmann::json::array()}};
  };
  auto gpu_device = [](double sgemm, double bf16) {
    return nlohmann::json{{"kind", "cuda"}, {"threads", 1}, {"sgemm_gflops", sgemm}, {"sgemm_size", 4096},
                          {"memory_bandwidth_gb_s", 4000.0}, {"gpu_index", 0},
                          {"bf16_gemm_gflops", bf16}, {"launch_overhead_s", 4e-6}};
  };
  const nlohmann::json cpu_device = {{"kind", "cpu"}, {"threads", 16}, {"sgemm_gflops", 1000.0},
                                     {"sgemm_size", 1024}, {"memory_bandwidth_gb_s", 100.0}};
  nlohmann::json links = {{"latency_s", {{0, 1e-5, 1e-5}, {1e-5, 0, 1e-5}, {1e-5, 1e-5, 0}}},
                          {"bandwidth_bytes_per_s", {{0, 1e9, 1e9}, {1e9, 0, 1e9}, {1e9, 1e9, 0}}}};
  return {{"format", probe::kClusterFormat}, {"world_size", 3}, {"model", ""},
          {"ranks", {rank(0, host("a", {gpu("NVIDIA H200", "9.0")}), gpu_device(50000, 700000)),
                     rank(1, host("b", {gpu("Tesla T4", "7.5")}), gpu_device(8000, 0)),
                     rank(2, host("c", nlohmann::json::array()), cpu_device)}},
          {"links", links}};
}

}  // namespace

TEST_CASE("precision: bf16 rounding, to nearest and ties to even, bit for bit") {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1 is exact"},
      {0xbfc00000u, 0xbfc0, "-1.5 is exact"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f807fffu, 0x3f80, "just below half an ulp: down"},
      {0x3f808001u, 0x3f81, "just above half an ulp: up"},
      {0x3f808000u, 0x3f80, "a tie with an even last bit: stays"},
      {0x3f818000u, 0x3f82, "a tie with an odd last bit: up to even"},
      {0xbf818000u, 0xbf82, "ties to even by magnitude when negative"},
      {0x3fffffffu, 0x4000, "the carry runs into the exponent"},
      {0x7f7f7fffu, 0x7f7f, "below half an ulp under the largest bf16"},
      {0x7f7fffffu, 0x7f80, "the largest float rounds to infinity"},
      {0x7f800000u, 0x7f80, "+infinity"},
      {0xff800000u, 0xff80, "-infinity"},
      {0x7fc00000u, 0x7fc0, "a quiet NaN"},
      {0x7f800001u, 0x7fc0, "a NaN whose payload sits in the lost bits stays a NaN"},
      {0xff800001u, 0xffc0, "a negative NaN keeps its sign"},
      {0x00000001u, 0x0000, "the smallest subnormal rounds to zero"},
      {0x00008000u, 0x0000, "a subnormal tie to even zero"},
      {0x00018000u, 0x0002, "a subnormal tie up to even"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    CHECK(bf16_bits(from_bits(c.in)) == c.out);
  }
  CHECK(bf16_to_float(0x3f80) == 1.f);
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // 1 + 2^-7 is bf16's next value after 1; 1 + 2^-8 + 2^-9 rounds up to it.
  CHECK(round_to_bf16(1.f + 0x1p-8f + 0x1p-9f) == 1.f + 0x1p-7f);
}

namespace {

// Checks |round(x) - x| <= bound |x| for x = (1 + m 2^-23) 2^e over the exponents
// [e_lo, e_hi] in steps of e_step and the mantissas in steps of m_step, those that round
// to infinity left out; returns how many were checked.
int sweep_roundoff(float (*round)(float), double bound, int e_lo, int e_hi, int e_step, uint32_t m_step) {
  int checked = 0;
  for (int e = e_lo; e <= e_hi; e += e_step)
    for (uint32_t m = 0; m < (1u << 23); m += m_step) {
      const float x = std::ldexp(1.f + static_cast<float>(m) * 0x1p-23f, e);
      const float r = round(x);
      if (std::isinf(r)) continue;
      CHECK(std::fabs(static_cast<double>(r) - x) <= bound * std::fabs(x));
      ++checked;
    }
  return checked;
}

}  // namespace

TEST_CASE("precision: bf16 rounding stays within 2^-8 relative over the normal range") {
  // A sweep over mantissas and exponents: |round(x) - x| <= 2^-8 |x| for every normal x
  // that does not overflow (the bound is half of bf16's ulp 2^-7 at 1).
  CHECK(sweep_roundoff(round_to_bf16, kBf16Roundoff, -126, 127, 7, 77773) > 3000);
}

TEST_CASE("precision: fp16 rounding, to nearest and ties to even, with subnormals and overflow") {
  struct Case {
    float in, out;
    const char* what;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {1.f, 1.f, "1 is exact"},
      {-1.5f, -1.5f, "-1.5 is exact"},
      {0.f, 0.f, "+0"},
      {1.f + 0x1p-11f, 1.f, "a tie at 1 with an even last bit: stays"},
      {1.f + 0x1p-11f + 0x1p-20f, 1.f + 0x1p-10f, "just above half an ulp: up"},
      {1.f + 0x1p-10f + 0x1p-11f, 1.f + 0x1p-9f, "a tie with an odd last bit: up to even"},
      {-(1.f + 0x1p-10f + 0x1p-11f), -(1.f + 0x1p-9f), "ties to even by magnitude when negative"},
      {2.f - 0x1p-12f, 2.f, "the carry runs into the exponent"},
      {65504.f, 65504.f, "the largest half"},
      {65519.f, 65504.f, "below half an ulp past it: stays"},
      {65520.f, inf, "halfway past it: infinity"},
      {-1e6f, -inf, "far past it, negative: -infinity"},
      {inf, inf, "+infinity"},
      {0x1p-14f, 0x1p-14f, "the smallest normal"},
      {0x1p-24f, 0x1p-24f, "the smallest subnormal"},
      {0x1p-25f, 0.f, "half of it: a tie to even zero"},
      {0x1p-25f + 0x1p-30f, 0x1p-24f, "just above half of it: up"},
      {3 * 0x1p-25f, 2 * 0x1p-24f, "a subnormal tie up to even"},
      {0x1p-30f, 0.f, "far below: zero"},
      {1e-5f, std::round(1e-5f * 0x1p24f) * 0x1p-24f, "a small gradient keeps only its subnormal steps"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    CHECK(round_to_fp16(c.in) == c.out);
  }
  CHECK(std::signbit(round_to_fp16(-0x1p-30f)));  // -0 keeps its sign
  CHECK(std::isnan(round_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  // The sweep of bf16's test: within 2^-11 relative over fp16's normal range.
  CHECK(sweep_roundoff(round_to_fp16, kFp16Roundoff, -14, 15, 1, 7773) > 30000);
}

TEST_CASE("precision: train.loss_scale reads, defaults by precision and refuses bad settings") {
  auto cfg = [](const std::string& train_extra, const std::string& parallel = "") {
    return R"({"model": {"type": "mlp"}, "data": {"dataset": "fashion_mnist"},
               "train": {"steps": 10, "optimizer": {"lr": 0.01})" + train_extra + "}" +
           (parallel.empty() ? "" : ", \"parallel\": " + parallel) + "}";
  };
  const config::Config plain = config::parse_config(cfg(""), "p.json");
  CHECK(plain.train.loss_scale.mode == "auto");
  CHECK_FALSE(config::dynamic_loss_scale(plain.train));
  CHECK(config::dynamic_loss_scale(config::parse_config(cfg(R"(, "precision": "fp16")"), "p.json").train));
  CHECK_FALSE(config::dynamic_loss_scale(config::parse_config(cfg(R"(, "precision": "bf16")"), "p.json").train));
  const config::Config dyn = config::parse_config(
      cfg(R"(, "loss_scale": {"mode": "dynamic", "initial": 1024, "growth_interval": 5, "min": 0.5, "max": 4096})"),
      "p.json");
  CHECK(config::dynamic_loss_scale(dyn.train));
  CHECK(dyn.train.loss_scale.initial == 1024);
  CHECK(dyn.train.loss_scale.min == 0.5);
  CHECK(dyn.train.loss_scale.growth_interval == 5);
  // What to_json writes reads back the same.
  const config::Config again = config::parse_config(config::to_json(dyn), "p.json");
  CHECK(again.train.loss_scale.max == 4096);
  CHECK(again.train.loss_scale.mode == "dynamic");
  auto err = [&](const std::string& train_extra, const std::string& parallel = "") {
    return error_of([&] { config::parse_config(cfg(train_extra, parallel), "p.json"); });
  };
  CHECK(err(R"(, "loss_scale": {"initial": 1000})") ==
        "train.loss_scale.initial: 1000 is not a power of two; expected one, such as 65536 (2^16), so that scaling "
        "by it is exact");
  CHECK(err(R"(, "loss_scale": {"initial": 0})") == "train.loss_scale.initial: 0 is out of range; expected a number > 0");
  CHECK(contains(err(R"(, "loss_scale": {"mode": "static"})"), "train.loss_scale.mode: \"static\" is not a known choice"));
  CHECK(contains(err(R"(, "loss_scale": {"growth_interval": 0})"), "train.loss_scale.growth_interval: 0"));
  CHECK(contains(err(R"(, "loss_scale": {"initaal": 2})"), "train.loss_scale.initaal"));
  CHECK(err(R"(, "loss_scale": {"min": 8, "max": 4})") ==
        "train.loss_scale.min: 8 is above train.loss_scale.max 4; expected min <= initial <= max");
  CHECK(err(R"(, "loss_scale": {"initial": 2, "min": 4})") ==
        "train.loss_scale.initial: 2 is outside [4, 16777216] (min, max); expected min <= initial <= max");
  CHECK(contains(err(R"(, "precision": "fp16", "loss_scale": {"mode": "none"})"),
                 "train.loss_scale.mode: \"none\" under precision \"fp16\" would flush small gradients to zero"));
  CHECK(contains(err(R"(, "precision": "fp16")", R"({"strategy": "pipeline"})"),
                 "parallel.strategy: \"pipeline\" with precision \"fp16\" (whose loss scale is dynamic) is not built"));
  // Without a loss scale the pipeline stays as it was; deadline takes one either way.
  CHECK(config::parse_config(cfg("", R"({"sync": "deadline"})"), "p.json").parallel.sync == config::SyncPolicy::deadline);
  CHECK(config::parse_config(cfg(R"(, "loss_scale": {"mode": "dynamic"})", R"({"sync": "deadline"})"), "p.json")
            .parallel.sync == config::SyncPolicy::deadline);
}

TEST_CASE("precision: the names, and train.precision reads exactly them") {
  CHECK(precision_names() == std::vector<std::string>{"fp32", "bf16", "fp16"});
  for (const std::string& n : precision_names()) {
    CHECK(precision_name(parse_precision(n)) == n);
    CHECK(config::parse_config(config_with_precision("\"" + n + "\""), "p.json").train.precision == n);
  }
  CHECK(config::parse_config(config_with_precision("\"fp32\""), "p.json").train.precision == "fp32");
  const std::string defaulted = R"({"model": {"type": "mlp"}, "data": {"dataset": "fashion_mnist"},
                                   "train": {"steps": 10, "optimizer": {"lr": 0.01}}})";
  const config::Config c = config::parse_config(defaulted, "p.json");
  CHECK(c.train.precision == "fp32");
  CHECK(contains(config::to_json(c), "\"precision\": \"fp32\""));
  CHECK(error_of([] { config::parse_config(config_with_precision("\"fp8\""), "p.json"); }) ==
        "train.precision: \"fp8\" is not a known choice; expected one of \"fp32\", \"bf16\" or \"fp16\"");
  CHECK(contains(error_of([] { config::parse_config(config_with_precision("16"), "p.json"); }),
                 "train.precision: 16 is not a string"));
  CHECK(error_of([] { parse_precision("half"); }) ==
        "precision \"half\" is not a precision; expected \"fp32\", \"bf16\" or \"fp16\"");
}

TEST_CASE("precision: the choice against the run's device") {
  const DeviceRequest cpu = parse_device("cpu"), cuda = parse_device("cuda"), autod = parse_device("auto");
  SUBCASE("fp32 anywhere, with no note") {
    for (const DeviceRequest& r : {cpu, cuda, autod}) {
      const PrecisionChoice c = choose_precision(Precision::fp32, r, DeviceKind::cpu, "");
      CHECK(c.precision == Precision::fp32);
      CHECK(c.note.empty());
    }
  }
  SUBCASE("a reduced precision on a CPU asked for by name is refused in one line") {
    CHECK(error_of([&] { choose_precision(Precision::bf16, cpu, DeviceKind::cpu, ""); }) ==
          "train.precision bf16 needs a CUDA device (sm_80+); this run's device is cpu");
    CHECK(error_of([&] { choose_precision(Precision::fp16, cpu, DeviceKind::cpu, ""); }) ==
          "train.precision fp16 needs a CUDA device; this run's device is cpu");
  }
  SUBCASE("auto that fell back to the CPU falls back to fp32, saying why") {
    const PrecisionChoice c = choose_precision(Precision::bf16, autod, DeviceKind::cpu, "");
    CHECK(c.precision == Precision::fp32);
    CHECK(c.note == "train.precision bf16: device \"auto\" chose the CPU, which computes in fp32 "
                    "only; training in fp32");
  }
  SUBCASE("on a GPU the backend's refusal is the message, and acceptance keeps the mode") {
    CHECK(error_of([&] {
            choose_precision(Precision::bf16, cuda, DeviceKind::cuda, "sm_75 has no bf16 tensor cores");
          }) == "train.precision bf16: sm_75 has no bf16 tensor cores");
    const PrecisionChoice c = choose_precision(Precision::bf16, autod, DeviceKind::cuda, "");
    CHECK(c.precision == Precision::bf16);
    CHECK(c.note.empty());
  }
}

TEST_CASE("precision: the CPU backend computes in fp32 only") {
  Backend& be = cpu_backend();
  CHECK(be.precision() == Precision::fp32);
  CHECK(be.precision_refusal(Precision::fp32).empty());
  CHECK(be.precision_refusal(Precision::bf16) == "cpu computes in fp32 only (no bf16 products)");
  CHECK(error_of([&] { be.set_precision(Precision::bf16); }) ==
        "precision bf16 on cpu: cpu computes in fp32 only (no bf16 products)");
  CHECK(be.precision() == Precision::fp32);
  be.set_precision(Precision::fp32);
  CHECK(select_device("cpu", 0, "fp32").precision == Precision::fp32);
  CHECK(error_of([] { select_device("cpu", 0, "bf16"); }) ==
        "train.precision bf16 needs a CUDA device (sm_80+); this run's device is cpu");
  if (query_gpus().count == 0) {  // where no GPU is usable, auto trains on the CPU in fp32
    const SelectedDevice d = select_device("auto", 0, "bf16");
    CHECK(d.backend == &cpu_backend());
    CHECK(d.precision == Precision::fp32);
    CHECK(contains(d.note, "; train.precision bf16: device \"auto\" chose the CPU"));
  }
}

TEST_CASE("loss scale: unscale divides in place, views where they lie") {
  Backend& be = cpu_backend();
  runtime::DynamicLossScale ls({.initial = 1024, .growth_interval = 3, .min_scale = 1, .max_scale = 4096});
  Tensor a = Tensor::from_vector({1024.f, -2048.f, 512.f}, {3}, be);
  Tensor b = Tensor::from_vector({4096.f, 0.f, 1.f, 3.f}, {2, 2}, be);
  runtime::unscale_gradients({a, b}, ls.scale());
  // Powers of two divide exactly.
  CHECK(a.to_vector() == std::vector<float>{1.f, -2.f, 0.5f});
  CHECK(b.to_vector() == std::vector<float>{4.f, 0.f, 1.f / 1024, 3.f / 1024});

  // A strided view (a column) is unscaled where it lies, the other column untouched.
  Tensor m = Tensor::from_vector({1024.f, 7.f, 2048.f, 9.f}, {2, 2}, be);
  Tensor column = m.view_as({2}, {2}, 0);
  runtime::unscale_gradients({column}, ls.scale());
  CHECK(m.to_vector() == std::vector<float>{1.f, 7.f, 2.f, 9.f});
}

TEST_CASE("loss scale: halve on overflow, double after N clean steps, within bounds; restore") {
  runtime::DynamicLossScale ls({.initial = 1024, .growth_interval = 3, .min_scale = 256, .max_scale = 4096});
  CHECK(ls.scale() == 1024);
  ls.update(false);
  ls.update(false);
  CHECK(ls.scale() == 1024);  // two clean steps: not yet
  ls.update(false);
  CHECK(ls.scale() == 2048);  // the third doubles it
  CHECK(ls.clean_steps() == 0);
  ls.update(false);
  ls.update(false);
  ls.update(true);  // an overflow: halve, count afresh
  CHECK(ls.scale() == 1024);
  CHECK(ls.clean_steps() == 0);
  CHECK(ls.overflow_steps() == 1);
  for (int i = 0; i < 9; ++i) ls.update(false);
  CHECK(ls.scale() == 4096);  // 1024 -> 2048 -> 4096, then held at max_scale
  for (int i = 0; i < 5; ++i) ls.update(true);
  CHECK(ls.scale() == 256);  // 4096 halved 4 times, the fifth held at min_scale
  CHECK(ls.overflow_steps() == 6);

  ls.restore(2048, 2);
  CHECK(ls.scale() == 2048);
  CHECK(ls.log2_scale() == 11);
  ls.update(false);
  CHECK(ls.scale() == 4096);  // the restored 2 clean steps count
  ls.restore(512, 99);        // more clean steps than the interval: the next clean step doubles
  ls.update(false);
  CHECK(ls.scale() == 1024);
  CHECK(error_of([&] { ls.restore(128, 0); }) ==
        "loss scale: 128 is outside [256, 4096]; expected a scale within train.loss_scale's min and max");
  CHECK(contains(error_of([&] { ls.restore(512, -1); }), "loss scale: -1 clean steps"));

  const runtime::DynamicLossScale defaults;
  CHECK(defaults.scale() == 65536);
  CHECK(error_of([] { runtime::DynamicLossScale({.initial = 0.5}); }) ==
        "loss scale: initial 0.5 is out of range; expected a number in [1, 1.67772e+07]");
  CHECK(contains(error_of([] { runtime::DynamicLossScale({.growth_interval = 0}); }),
                 "loss scale: growth_interval 0 is out of range"));
  CHECK(contains(error_of([] { runtime::DynamicLossScale({.min_scale = 0}); }),
                 "loss scale: min_scale 0 is out of range"));
}

TEST_CASE("precision: under bf16 the planner prices a GPU rank's products at its bf16 rate") {
  test_fixtures::TempDir dir("ht-precision");
  const std::string path = dir / "cluster.json";
  std::ofstream(path) << cluster_file().dump(2);
  const plan::ClusterModel c = plan::load_cluster_model(path, "/nonexistent/devices.json", 3);
  REQUIRE(c.ranks.size() == 3);
  CHECK(c.ranks[0].bf16_flops == doctest::Approx(700000e9));
  CHECK(c.ranks[1].bf16_flops == 0);  // sm_75: measured, none
  CHECK(c.ranks[2].bf16_flops == 0);  // the CPU
  CHECK(plan::gemm_rate(c.ranks[0], "bf16") == doctest::Approx(700000e9));
  CHECK(plan::gemm_rate(c.ranks[0], "fp32") == doctest::Approx(50000e9));
  CHECK(plan::gemm_rate(c.ranks[1], "bf16") == doctest::Approx(8000e9));  // no bf16: fp32's
  CHECK(plan::gemm_rate(c.ranks[2], "bf16") == doctest::Approx(1000e9));

  // Two dense blocks of 1e10 forward FLOPs a sample and few parameters: GEMM-bound.
  nn::ModelShape model;
  for (int b = 0; b < 2; ++b)
    model.blocks.push_back({"dense", 1000, 10'000'000'000, 4096, 0, 0, 0, {1024}, {1024}, DType::f32});
  const plan::BlockCosts fp32 = plan::block_costs(model, c, config::OptimizerConfig{}, "fp32");
  const plan::BlockCosts bf16 = plan::block_costs(model, c, config::OptimizerConfig{}, "bf16");
  for (size_t b = 0; b < 2; ++b) {
    CHECK(fp32.seconds_per_sample[0][b] == doctest::Approx(3 * 1e10 / 50000e9));
    CHECK(fp32.seconds_per_sample[0][b] / bf16.seconds_per_sample[0][b] == doctest::Approx(14.0));
    CHECK(bf16.seconds_per_sample[1][b] == fp32.seconds_per_sample[1][b]);
    CHECK(bf16.seconds_per_sample[2][b] == fp32.seconds_per_sample[2][b]);
  }

  // The H200 alone, 64 samples: the step is the products (64 x 2 x 3e10 / rate) plus a
  // fixed part the precision does not change, at most the calls of every micro-batch and
  // the optimiser steps (bounded by 64 micro-batches' calls).
  nlohmann::json alone = cluster_file();
  alone["world_size"] = 1;
  alone["ranks"] = {alone["ranks"][0]};
  alone["links"] = {{"latency_s", {{0}}}, {"bandwidth_bytes_per_s", {{0}}}};
  const std::string alone_path = dir / "alone.json";
  std::ofstream(alone_path) << alone.dump(2);
  const plan::ClusterModel one = plan::load_cluster_model(alone_path, "/nonexistent/devices.json", 1);
  auto step = [&](const char* precision) {
    const plan::BlockCosts k = plan::block_costs(model, one, config::OptimizerConfig{}, precision);
    return plan::make_plan(plan::fixtures::input(one, k, 64, "data")).predicted.step_seconds;
  };
  const double fixed_bound = 64 * 2 * 12 * 4e-6 + 2 * 1000 * 28 / 4000e9;
  const double products32 = 64 * 2 * 3e10 / 50000e9, products16 = products32 / 14;
  const double s32 = step("fp32"), s16 = step("bf16");
  CHECK(s32 >= products32);
  CHECK(s32 <= products32 + fixed_bound);
  CHECK(s16 >= products16);
  CHECK(s16 <= products16 + fixed_bound);
  CHECK(s32 / s16 > 13.0);  // 14 less what the fixed part takes off

  // The planner's input takes the config's train.precision.
  config::Config cfg = config::parse_config(config_with_precision("\"bf16\""), "p.json");
  const plan::PlannerInput in16 = plan::planner_input_for(cfg, model, one);
  cfg.train.precision = "fp32";
  const plan::PlannerInput in32 = plan::planner_input_for(cfg, model, one);
  CHECK(in32.costs.seconds_per_sample[0][0] / in16.costs.seconds_per_sample[0][0] == doctest::Approx(14.0));
  // fp16 is priced at fp32's rate (no fp16 product is probed), and its dynamic loss
  // scale asks for plans of one stage.
  CHECK_FALSE(in32.one_stage);
  cfg.train.precision = "fp16";
  const plan::PlannerInput in_half = plan::planner_input_for(cfg, model, one);
  CHECK(in_half.costs.seconds_per_sample[0][0] == in32.costs.seconds_per_sample[0][0]);
  CHECK(in_half.one_stage);

  // Without a probed bf16 figure, the datasheet's bf16 peak x the catalogue's efficiency.
  const std::string catalogue = (test_fixtures::source_root() / "configs" / "devices.json").string();
  const plan::Catalogue cat = plan::read_catalogue(catalogue);
  const plan::ClusterModel synth = plan::cluster_from_synth("synth:1xh200,1xv100-16g", catalogue);
  const plan::CatalogueDevice* h200 = plan::match_catalogue(cat, "NVIDIA H200", 141 * 1024.0 * 1024 * 1024);
  REQUIRE(h200 != nullptr);
  CHECK(synth.ranks[0].bf16_flops == doctest::Approx(989.4e12 * h200->efficiency));
  CHECK(synth.ranks[1].bf16_flops == 0);  // V100: no bf16 in its datasheet
}
