#include "probe/microbench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "autograd/graph.h"
#include "backend/backend.h"
#include "core/cpu_time.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/stats.h"
#include "core/wall_time.h"
#include "ops/ops.h"
#include "optim/make_optimizer.h"
#include "probe/probe.h"

namespace ht::probe {

namespace {

using Clock = std::chrono::steady_clock;

// Runs each of `fns` in turn, round after round, until `budget` seconds have passed (at
// least `min_rounds` rounds), and returns each one's median seconds a call. Under a CPU
// quota q a call's seconds are its CPU seconds / q: a call that fits in one burst of the
// quota's period goes at a whole core's speed, which the process cannot sustain (a quick
// probe's blocks on the 0.8 rank measured about 0.5 ms a sample against the 0.6 it
// sustained in the job), while a call's wall time depends on where in the period it
// started. In turn, because this host slows down in bursts and a burst that fell on one
// batch size's calls alone put 4-9 ms into the CNN's fitted fixed parts; the median,
// because a call now and then runs beside another process's burst.
std::vector<double> run_for(double budget, int64_t min_rounds, const std::vector<std::function<void()>>& fns) {
  static const double quota = cgroup_cpu_quota().fraction;
  const bool quota_bound = quota > 0 && quota < 1;
  for (const auto& fn : fns) fn();  // warm-up: first-touch page faults and cache state
  const auto t0 = Clock::now();
  std::vector<std::vector<double>> calls(fns.size());
  for (int64_t round = 0; round < min_rounds || seconds_since(t0) < budget; ++round)
    for (size_t i = 0; i < fns.size(); ++i) {
      const auto start = Clock::now();
      const double cpu0 = process_cpu_seconds();
      fns[i]();
      calls[i].push_back(quota_bound ? (process_cpu_seconds() - cpu0) / quota : seconds_since(start));
    }
  std::vector<double> out;
  for (auto& c : calls) out.push_back(median(std::move(c)));
  return out;
}

double run_for(double budget, int64_t min_calls, const std::function<void()>& fn) {
  return run_for(budget, min_calls, std::vector<std::function<void()>>{fn})[0];
}

Tensor random_tensor(const Shape& shape, Rng& rng, Backend& be) {
  std::vector<float> v(numel(shape));
  for (float& x : v) x = rng.normal();
  return Tensor::from_vector(v, shape, be);
}

}  // namespace

DeviceRates measure_device(double seconds) {
  DeviceRates r;
  Rng rng(11);
  Backend& be = cpu_backend();
  // 1024^3 is the scale of the models' larger products; smaller sizes measure
  // call overhead more than the arithmetic units.
  r.sgemm_size = 1024;
  int64_t n = r.sgemm_size;
  Tensor a = random_tensor({n, n}, rng, be), b = random_tensor({n, n}, rng, be);
  Tensor c = Tensor::empty({n, n}, DType::f32, be);
  const GemmArgs g = GemmArgs::square(a.data(), b.data(), c.data(), n);
  r.sgemm_gflops = 2.0 * n * n * n / run_for(seconds / 2, 3, [&] { be.gemm(g); }) / 1e9;

  r.memory_bandwidth_gb_s = triad_gb_s(kStreamFloats, seconds / 2);
  return r;
}

double triad_gb_s(size_t floats, double seconds) {
  HT_CHECK(floats > 0, "triad_gb_s: no floats to pass over");
  std::vector<float> x(floats, 1.f), y(floats, 2.f), z(floats, 0.f);
  const double pass = run_for(seconds, 3, [&] {
    float* __restrict zp = z.data();
    const float* __restrict xp = x.data();
    const float* __restrict yp = y.data();
#pragma omp simd
    for (size_t i = 0; i < floats; ++i) zp[i] = xp[i] + 0.5f * yp[i];
  });
  return 3.0 * static_cast<double>(floats) * sizeof(float) / pass / 1e9;
}

std::vector<BlockTiming> profile_blocks(const nn::Sequential& model, int64_t small, int64_t large,
                                        double seconds_per_block,
                                        const config::OptimizerConfig& opt, Backend& be) {
  HT_CHECK(small >= 1 && large >= small, "profile_blocks: batches ", small, " and ", large,
           "; expected 1 <= small <= large");
  for (size_t i = 0; i < model.size(); ++i)
    for (const auto& [name, p] : model.block(i).named_parameters())
      HT_CHECK(&p.backend() == &be, "probe: block ", i, " (", model.block(i).kind(), ") parameter '", name,
               "' lives on ", p.backend().name(), " but the blocks are profiled on ", be.name(),
               "; expected the model built on the device it is profiled on");
  std::vector<BlockTiming> out;
  Rng rng(12);
  for (size_t i = 0; i < model.size(); ++i) {
    nn::Block& block = model.block(i);
    auto call_at = [&](int64_t batch) -> std::function<void()> {
      Shape shape = block.sample_input_shape();
      shape.insert(shape.begin(), batch);
      // Token ids of 0 are valid for any vocabulary; values do not change the timing.
      Tensor x = block.input_dtype() == DType::i32
                     ? Tensor::from_ints(std::vector<int32_t>(numel(shape), 0), shape, be)
                     : random_tensor(shape, rng, be);
      // Training passes the gradient back through every block but the model's first
      // (whose input is the data): leaving it out timed the MLP's step 20% short.
      if (i > 0 && x.dtype() == DType::f32) x.set_requires_grad();
      return [&block, &be, x] {
        Tensor y = block.forward(x);
        y.backward(Tensor::full(y.shape(), 1.f, be));
        x.zero_grad();  // as in training, each call's input gradient is a new tensor
        be.synchronize();
      };
    };
    const std::vector<double> at = run_for(seconds_per_block, 2, {call_at(small), call_at(large)});
    const double at_small = at[0], at_large = at[1];
    const auto s = static_cast<double>(small), l = static_cast<double>(large);
    BlockTiming t{block.kind(), at_large / l};
    if (large > small) {
      // The line through both points; where it would cross zero above no samples (per
      // sample dearer at the larger batch, or the two points' noise) a fixed part is not
      // seen, and the two batches' per-sample times are averaged.
      const double slope = (at_large - at_small) / (l - s), call = at_small - slope * s;
      if (slope > 0 && call >= 0) {
        t.fwd_bwd_s_per_sample = slope;
        t.fwd_bwd_s_per_call = call;
      } else {
        t.fwd_bwd_s_per_sample = (at_small / s + at_large / l) / 2;
      }
    }
    if (auto params = block.named_parameters(); !params.empty()) {
      auto optimizer = optim::make_optimizer(opt, std::move(params));
      t.optimizer_step_s = run_for(seconds_per_block / 4, 2, [&] {
        optimizer->step();
        be.synchronize();
      });
    }
    block.zero_grad();
    out.push_back(t);
  }
  return out;
}

}  // namespace ht::probe
