#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "backend/cpu/strided_loop.h"

namespace ht {

namespace {
// 64-byte alignment: whole cache lines, and AVX-512 loads never split.
void* aligned_raw_alloc(size_t bytes) { return std::aligned_alloc(64, bytes); }
}  // namespace

const char* op_kind_name(OpKind k) {
  static const char* names[] = {
      "fill", "copy", "unary", "unary_backward", "binary", "where", "reduce", "max_backward",
      "gemm", "softmax", "softmax_backward", "cross_entropy", "cross_entropy_backward",
      "layernorm", "layernorm_backward", "embedding", "embedding_backward", "im2col", "col2im",
      "maxpool2d", "maxpool2d_backward", "dropout_mask", "adamw", "sgd", "conv2d",
      "conv2d_backward_data", "conv2d_backward_filter", "causal_attention",
      "causal_attention_backward", "adamw_multi", "sgd_multi", "axpy"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(OpKind::count_));
  return names[static_cast<int>(k)];
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

CpuBackend::CpuBackend()
    : Backend(new Allocator("cpu", aligned_raw_alloc, [](void* p) { std::free(p); })) {
  // Host-side staging buffers (batches built on the host, values copied out) come and
  // go every step. Above glibc's default mmap threshold each one would be mapped and
  // unmapped anew, page-faulting on every step; keep such blocks in the heap instead.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

void CpuBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

MemoryInfo CpuBackend::memory_info() const {
  MemoryInfo info;
  info.total = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") {
      info.available = kib * 1024;
      break;
    }
  return info;
}

void CpuBackend::fill(float* y, float value, int64_t n) {
  cpu::parallel_range(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = value;
  });
}

void CpuBackend::copy(const void* src, const Strides& ss, void* dst, const Strides& ds,
                      const Shape& shape) {
  if (numel(shape) == 0) return;
  auto s = cpu::coalesce<2>(shape, {&ss, &ds});
  const uint32_t* in = static_cast<const uint32_t*>(src);
  uint32_t* out = static_cast<uint32_t*>(dst);
  cpu::for_each_row(s, [&](auto offs, int64_t n, auto st) {
    const uint32_t* a = in + offs[0];
    uint32_t* b = out + offs[1];
    if (st[0] == 1 && st[1] == 1) {
      std::memcpy(b, a, n * sizeof(uint32_t));
    } else {
      for (int64_t i = 0; i < n; ++i) b[i * st[1]] = a[i * st[0]];
    }
  });
}

void CpuBackend::gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  for (int64_t i = 0; i < g.batch; ++i) {
    float* c = g.c + i * g.stride_c;
    if (g.k == 0) {  // an empty sum: C = beta * C
      for (int64_t r = 0; r < g.m; ++r)
        for (int64_t col = 0; col < g.n; ++col)
          c[r * g.ldc + col] = g.beta == 0.f ? 0.f : c[r * g.ldc + col] * g.beta;
      continue;
    }
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(g.m),
                static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, g.a + i * g.stride_a,
                static_cast<int>(g.lda), g.b + i * g.stride_b, static_cast<int>(g.ldb), g.beta, c,
                static_cast<int>(g.ldc));
  }
}

}  // namespace ht
