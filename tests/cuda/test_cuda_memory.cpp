// The CUDA backend's memory: the accounting, cap and cache of the device allocator,
// device out-of-memory, pinned staging, copies through it, memory_info.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "tensor/tensor.h"

using namespace ht;

namespace {

cuda::CudaBackend& gpu() { return cuda::cuda_backend(0); }

std::string oom_message(Allocator& a, size_t bytes) {
  try {
    void* p = a.allocate(bytes, "test");
    a.deallocate(p, bytes);
  } catch (const OutOfMemory& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("cuda memory: device blocks are counted, cached and reused") {
  Allocator& a = gpu().allocator();
  gpu().synchronize();
  size_t live = a.live_bytes();
  void* p = a.allocate(1000, "test");
  CHECK(a.live_bytes() == live + 1024);  // rounded up to 64 bytes
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);  // plain cudaMalloc, not managed memory
  a.deallocate(p, 1000);
  CHECK(a.live_bytes() == live);
  size_t held = gpu().device_bytes_held();
  void* q = a.allocate(1000, "test");
  CHECK(q == p);                              // the cached block comes back
  CHECK(gpu().device_bytes_held() == held);  // without a new cudaMalloc
  a.deallocate(q, 1000);
}

TEST_CASE("cuda memory: a request past the cap names the request, the bytes in use and the cap") {
  Allocator& a = gpu().allocator();
  size_t cap = a.live_bytes() + (1 << 20);
  a.set_cap(cap);
  std::string msg = oom_message(a, 2 << 20);
  a.set_cap(0);
  CHECK(contains(msg, "out of memory on cuda:0: requested 2097152 bytes"));
  CHECK(contains(msg, "a cap of " + std::to_string(cap) + " bytes"));
}

TEST_CASE("cuda memory: a request beyond the device is OutOfMemory with its free memory") {
  MemoryInfo info = gpu().memory_info();
  REQUIRE(info.total > 0);
  CHECK(info.available <= info.total);
  size_t huge = info.total * 2;
  std::string msg = oom_message(gpu().allocator(), huge);
  CHECK(contains(msg, "out of memory on cuda:0: cudaMalloc refused " + std::to_string(huge) + " bytes"));
  CHECK(contains(msg, "in use by hetrain"));
  CHECK(contains(msg, "free on the device of " + std::to_string(info.total) + " bytes"));
  // The failure leaves no error behind: the next allocation and kernel work.
  Tensor t = Tensor::full({3}, 2.f, gpu());
  CHECK(t.to_vector() == std::vector<float>{2, 2, 2});
}

TEST_CASE("cuda memory: pinned staging is host memory, counted apart from the device") {
  Allocator& pinned = gpu().pinned_allocator();
  size_t device_live = gpu().allocator().live_bytes();
  size_t live = pinned.live_bytes();
  void* p = pinned.allocate(4096, "test");
  CHECK(pinned.live_bytes() == live + 4096);
  CHECK(gpu().allocator().live_bytes() == device_live);
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  std::memset(p, 7, 4096);  // host-writable
  pinned.deallocate(p, 4096);
}

TEST_CASE("cuda memory: copies round-trip exactly, within and across staging chunks") {
  // 4 MiB staging chunks: sizes below one chunk, at one and across three.
  for (size_t floats : {size_t{1}, size_t{1000}, size_t{1} << 20, (size_t{3} << 20) + 17}) {
    CAPTURE(floats);
    std::vector<float> host(floats);
    std::iota(host.begin(), host.end(), 0.5f);
    Tensor t = Tensor::from_vector(host, {static_cast<int64_t>(floats)}, gpu());
    CHECK(t.to_vector() == host);
    std::vector<float> back(floats, -1.f);
    gpu().copy_to_host(back.data(), t.data(), floats * sizeof(float));
    CHECK(back == host);
  }
}
