// The probe's GPU side (probe/gpu_query.h, probe/gpu_rates.h call it through the module):
// the GPUs the runtime sees with their pinned host copy rates, and a GPU's rates for the
// planner's cost model: the engine's fp32 product and elementwise bandwidth through the
// rank's Backend (what its ops will get), the launch overhead of one small kernel, and
// cuBLAS's bf16 product (what mixed precision could reach).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_module.h"
#include "core/error.h"
#include "core/stats.h"
#include "core/wall_time.h"

namespace ht::cuda {

namespace {

// Copy rates between pinned host memory and the current device: the path activations
// take between a GPU rank and the (host-staged) MPI layer. Best of a few 64 MiB copies.
void measure_copies(double& host_to_device_gb_s, double& device_to_host_gb_s) {
  const size_t bytes = size_t{64} << 20;
  void *host = nullptr, *dev = nullptr;
  // A failure tolerated here (no room for the buffers: the rates stay 0) is cleared from
  // the runtime's last error, else the next kernel's launch check reports it as its own.
  if (cudaMallocHost(&host, bytes) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (cudaMalloc(&dev, bytes) == cudaSuccess) {
    auto rate = [&](cudaMemcpyKind kind) {
      double best = 0;
      for (int i = 0; i < 4; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        bool ok = (kind == cudaMemcpyHostToDevice ? cudaMemcpy(dev, host, bytes, kind)
                                                  : cudaMemcpy(host, dev, bytes, kind)) == cudaSuccess &&
                  cudaDeviceSynchronize() == cudaSuccess;
        double s = seconds_since(t0);
        if (ok && i > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
      }
      return best;
    };
    host_to_device_gb_s = rate(cudaMemcpyHostToDevice);
    device_to_host_gb_s = rate(cudaMemcpyDeviceToHost);
    cudaFree(dev);
  }
  cudaFreeHost(host);
  cudaGetLastError();  // a failed cudaMalloc or copy above, tolerated (a rate of 0)
}

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail("probe: ", call, " failed: ", cudaGetErrorString(e), "; expected a usable GPU");
}

void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("probe: ", call, " failed: ", cublasGetStatusString(s), "; expected a usable GPU and cuBLAS");
}

// A device buffer freed on scope exit: the benchmarks' buffers come from cudaMalloc,
// outside the engine's allocator, so an emulated cap does not hold them.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      cudaGetLastError();
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      cudaGetLastError();
      fail("probe: cudaMalloc of ", bytes, " bytes for a benchmark buffer failed: ", cudaGetErrorString(e), " (",
           free, " of the device's ", total, " bytes free); expected a GPU with that much free memory");
    }
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

// Median seconds of one `fn`, from rounds of `calls` calls each ended by `sync`, for about
// `budget` seconds (at least 3 rounds) after one untimed round. A round of several calls
// keeps the synchronisation's own cost small beside short kernels.
double per_call(double budget, int calls, const std::function<void()>& fn, const std::function<void()>& sync) {
  for (int i = 0; i < calls; ++i) fn();
  sync();
  std::vector<double> rounds;
  const auto t0 = std::chrono::steady_clock::now();
  while (rounds.size() < 3 || seconds_since(t0) < budget) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) fn();
    sync();
    rounds.push_back(seconds_since(start) / calls);
  }
  return median(std::move(rounds));
}

}  // namespace

std::vector<GpuFacts> list_gpus(std::string& note) {
  std::vector<GpuFacts> gpus;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // cudaErrorInsufficientDriver / NoDevice: a machine without a usable GPU.
    cudaGetLastError();
    note = std::string("no GPU: ") + cudaGetErrorString(err);
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();  // skipped, not carried into the next call's error check
      continue;
    }
    GpuFacts g;
    g.index = i;
    g.name = p.name;
    g.compute_major = p.major;
    g.compute_minor = p.minor;
    g.sm_count = p.multiProcessorCount;
    g.memory_total = p.totalGlobalMem;
    // Properties only: cudaGetDeviceProperties opens no context. The free memory and the
    // copy rates are the training rank's to measure on its own GPU (time_gpu).
    gpus.push_back(g);
  }
  if (gpus.empty()) note = "no GPU visible";
  return gpus;
}

GpuTimings time_gpu(Backend& be, int device, double seconds) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  GpuTimings r;
  {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    r.memory_free = free_b;
  }
  measure_copies(r.host_to_device_gb_s, r.device_to_host_gb_s);
  const auto sync = [&] { be.synchronize(); };
  const double share = seconds / 4;

  // fp32 product through the backend, 3 x 64 MiB.
  const int64_t n = kGpuGemmSize;
  r.sgemm_size = n;
  {
    const size_t bytes = static_cast<size_t>(n * n) * sizeof(float);
    DeviceBuffer a(bytes), b(bytes), c(bytes);
    // Values of a normal scale; zeros could let a library skip work, denormals slow it.
    be.fill(a.f(), 0.5f, n * n);
    be.fill(b.f(), 0.25f, n * n);
    const GemmArgs g = GemmArgs::square(a.f(), b.f(), c.f(), n);
    r.sgemm_gflops = 2.0 * n * n * n / per_call(share, 4, [&] { be.gemm(g); }, sync) / 1e9;
  }

  // Memory bandwidth: c = a + b over 3 arrays of 256 MiB (far beyond any L2), or an
  // eighth of the free memory each on a small GPU.
  {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const size_t len = std::min<size_t>(size_t{64} << 20, free_b / 8 / sizeof(float));
    DeviceBuffer a(len * sizeof(float)), b(len * sizeof(float)), c(len * sizeof(float));
    be.fill(a.f(), 1.f, static_cast<int64_t>(len));
    be.fill(b.f(), 2.f, static_cast<int64_t>(len));
    const Shape shape{static_cast<int64_t>(len)};
    const Strides dense{1};
    const double s = per_call(share, 10, [&] { be.binary(BinaryOp::add, a.f(), dense, b.f(), dense, c.f(), shape); },
                              sync);
    r.memory_bandwidth_gb_s = 3.0 * static_cast<double>(len * sizeof(float)) / s / 1e9;
  }

  // Launch overhead: one-element fills back to back, the engine's dispatch and the
  // launch itself; the GPU finishes each long before the next is issued.
  {
    DeviceBuffer one(sizeof(float));
    r.launch_overhead_s = per_call(share, 1000, [&] { be.fill(one.f(), 0.f, 1); }, sync);
  }

  // bf16 product with fp32 accumulation, where tensor cores run it (sm_80 and later).
  if (prop.major >= 8) {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    struct Handle {
      cublasHandle_t h;
      ~Handle() { cublasDestroy(h); }
    } keep{h};
    const size_t bytes = static_cast<size_t>(n * n) * 2;
    DeviceBuffer a(bytes), b(bytes), c(bytes);
    // Bytes of 0x3c make every bf16 0x3c3c (about 0.0115): normal values.
    check(cudaMemset(a.p, 0x3c, bytes), "cudaMemset");
    check(cudaMemset(b.p, 0x3c, bytes), "cudaMemset");
    const float alpha = 1.f, beta = 0.f;
    const int ni = static_cast<int>(n);
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    const double s = per_call(share, 4, [&] {
      if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a.p, CUDA_R_16BF, ni, b.p,
                              CUDA_R_16BF, ni, &beta, c.p, CUDA_R_16BF, ni, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT);
    }, [] { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the bf16 product"); });
    check(status, "cublasGemmEx (bf16)");
    r.bf16_gemm_gflops = 2.0 * n * n * n / s / 1e9;
  }
  return r;
}

}  // namespace ht::cuda
