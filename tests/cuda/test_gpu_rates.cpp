// The probe on GPU 0: its rates (gpu_rates.h) and its block profile through the CUDA
// backend. The figures are timings, so the checks are what any GPU must give: positive,
// finite, a bf16 rate exactly where the GPU is sm_80 or later, no engine memory kept.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "models/models.h"
#include "probe/gpu_rates.h"
#include "probe/microbench.h"

using namespace ht;

TEST_CASE("gpu rates: GPU 0's rates are positive and finite, bf16 where sm_80 or later") {
  Backend& be = cuda::cuda_backend(0);
  const size_t live = be.allocator().live_bytes();
  probe::GpuInfo own;
  const probe::DeviceRates r = probe::measure_gpu(be, 0, 0.4, &own);
  CHECK(r.gpu_index == 0);
  // The free memory and copy rates of the rank's own GPU, measured there (the listing
  // leaves them 0).
  CHECK(own.memory_free > 0);
  CHECK(own.host_to_device_gb_s > 0);
  CHECK(own.device_to_host_gb_s > 0);
  CHECK(r.sgemm_size == probe::kGpuGemmSize);
  for (double v : {r.sgemm_gflops, r.memory_bandwidth_gb_s, r.launch_overhead_s}) {
    CHECK(std::isfinite(v));
    CHECK(v > 0);
  }
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(std::isfinite(r.bf16_gemm_gflops));
  CHECK((r.bf16_gemm_gflops > 0) == (p.major >= 8));
  CHECK(be.allocator().live_bytes() == live);  // its buffers were its own, and are freed
}

TEST_CASE("gpu rates: blocks are profiled on the GPU; a model left on the host is refused by name") {
  Backend& be = cuda::cuda_backend(0);
  models::MlpSpec spec;
  spec.hidden = {64};
  nn::Sequential model = models::build_mlp(spec, 1);
  std::string refused;
  try {
    probe::profile_blocks(model, 2, 8, 0.05, config::OptimizerConfig{}, be);
  } catch (const Error& e) {
    refused = e.what();
  }
  CHECK(refused.find("lives on cpu but the blocks are profiled on " + be.name()) != std::string::npos);
  for (const auto& [name, t] : model.named_parameters()) t.rehome(be, false);
  const std::vector<probe::BlockTiming> blocks =
      probe::profile_blocks(model, 2, 8, 0.05, config::OptimizerConfig{}, be);
  REQUIRE(blocks.size() == model.size());
  for (const probe::BlockTiming& b : blocks) {
    CAPTURE(b.kind);
    CHECK(std::isfinite(b.fwd_bwd_s_per_sample));
    CHECK(b.fwd_bwd_s_per_sample > 0);
    CHECK(b.fwd_bwd_s_per_call >= 0);
  }
}
