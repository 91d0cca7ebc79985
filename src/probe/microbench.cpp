#include "probe/microbench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "autograd/graph.h"
#include "backend/backend.h"
#include "core/cpu_time.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "optim/make_optimizer.h"
#include "probe/probe.h"

namespace ht::probe {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs `fn` until `budget` seconds have passed (at least `min_calls` times); returns
// the calls made and the elapsed seconds. Under a CPU quota q, at least the CPU seconds
// / q: a run that fits in one burst of the quota's period goes at a whole core's speed,
// which the process cannot sustain (a quick probe's blocks on the 0.8 rank measured about 0.5
// ms a sample against the 0.6 it sustained in the job).
template <class Fn>
std::pair<int64_t, double> run_for(double budget, int64_t min_calls, Fn&& fn) {
  static const double quota = cgroup_cpu_quota().fraction;
  fn();  // warm-up: first-touch page faults and cache state
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  int64_t calls = 0;
  while (calls < min_calls || since(t0) < budget) {
    fn();
    ++calls;
  }
  double secs = since(t0);
  if (quota > 0 && quota < 1) secs = std::max(secs, (process_cpu_seconds() - cpu0) / quota);
  return {calls, secs};
}

Tensor random_tensor(const Shape& shape, Rng& rng) {
  std::vector<float> v(numel(shape));
  for (float& x : v) x = rng.normal();
  return Tensor::from_vector(v, shape);
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
  Tensor a = random_tensor({n, n}, rng), b = random_tensor({n, n}, rng);
  Tensor c = Tensor::empty({n, n});
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data();
  g.lda = n;
  g.b = b.data();
  g.ldb = n;
  g.c = c.data();
  g.ldc = n;
  auto [calls, secs] = run_for(seconds / 2, 3, [&] { be.gemm(g); });
  r.sgemm_gflops = 2.0 * n * n * n * calls / secs / 1e9;

  // 3 x 32 MiB: far beyond any last-level cache.
  const size_t len = size_t{8} << 20;
  std::vector<float> x(len, 1.f), y(len, 2.f), z(len, 0.f);
  auto [passes, t] = run_for(seconds / 2, 3, [&] {
    float* __restrict zp = z.data();
    const float* __restrict xp = x.data();
    const float* __restrict yp = y.data();
#pragma omp simd
    for (size_t i = 0; i < len; ++i) zp[i] = xp[i] + 0.5f * yp[i];
  });
  r.memory_bandwidth_gb_s = 3.0 * len * sizeof(float) * passes / t / 1e9;
  return r;
}

std::vector<BlockTiming> profile_blocks(const nn::Sequential& model, int64_t small, int64_t large,
                                        double seconds_per_block,
                                        const config::OptimizerConfig& opt) {
  HT_CHECK(small >= 1 && large >= small, "profile_blocks: batches ", small, " and ", large,
           "; expected 1 <= small <= large");
  std::vector<BlockTiming> out;
  Rng rng(12);
  for (size_t i = 0; i < model.size(); ++i) {
    nn::Block& block = model.block(i);
    auto seconds_per_call = [&](int64_t batch) {
      Shape shape = block.sample_input_shape();
      shape.insert(shape.begin(), batch);
      // Token ids of 0 are valid for any vocabulary; values do not change the timing.
      Tensor x = block.input_dtype() == DType::i32
                     ? Tensor::from_ints(std::vector<int32_t>(numel(shape), 0), shape)
                     : random_tensor(shape, rng);
      auto [calls, secs] = run_for(seconds_per_block / 2, 2, [&] {
        Tensor y = block.forward(x);
        y.backward(Tensor::full(y.shape(), 1.f));
      });
      return secs / calls;
    };
    const double at_small = seconds_per_call(small), at_large = seconds_per_call(large);
    BlockTiming t{block.kind(), at_large / static_cast<double>(large)};
    // A noisy pair (the larger batch no slower) keeps the large batch's average.
    if (large > small && at_large > at_small) {
      t.fwd_bwd_s_per_sample = (at_large - at_small) / static_cast<double>(large - small);
      t.fwd_bwd_s_per_call = std::max(0.0, at_small - t.fwd_bwd_s_per_sample * static_cast<double>(small));
    }
    if (auto params = block.named_parameters(); !params.empty()) {
      auto optimizer = optim::make_optimizer(opt, std::move(params));
      auto [steps, step_secs] = run_for(seconds_per_block / 4, 2, [&] { optimizer->step(); });
      t.optimizer_step_s = step_secs / static_cast<double>(steps);
    }
    block.zero_grad();
    out.push_back(t);
  }
  return out;
}

}  // namespace ht::probe
