// Strided loops over up to kMaxDims dimensions: the host merges the dense dimensions
// of every operand (as the CPU backend's loops do) and passes the rest by value; each
// thread turns its linear index into one element offset per operand.
// Device code: included by the .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "core/error.h"
#include "core/shape.h"

namespace ht::kernels::detail {

constexpr int kMaxDims = 8;

// The dimensions and per-operand element strides of a strided loop, passed by value
// to the kernel. Operand N-1 is conventionally the output.
template <int N>
struct StridedDims {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};
  int64_t count() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
  // Whether every linear index and every operand's offset fits in int32, so that the
  // kernel may take its index apart with 32-bit divisions (64-bit ones cost several
  // times more on the GPU).
  bool fits_int32() const {
    constexpr int64_t kMax = INT32_MAX;
    if (count() > kMax) return false;
    for (int k = 0; k < N; ++k) {
      int64_t reach = 0;
      for (int d = 0; d < ndim; ++d)
        reach += (size[d] - 1) * (stride[k][d] < 0 ? -stride[k][d] : stride[k][d]);
      if (reach > kMax) return false;
    }
    return true;
  }
};

inline bool has_zero_extent(const Shape& shape) {
  for (int64_t d : shape)
    if (d == 0) return true;
  return false;
}

// Drops size-1 dimensions and merges adjacent ones where every operand is dense across
// them (as the CPU backend's loops do), so that most calls become one dimension and
// the per-element index arithmetic stays short. Throws when more than kMaxDims remain.
template <int N>
StridedDims<N> coalesce(const Shape& shape, const std::array<const Strides*, N>& strides,
                        const char* op) {
  StridedDims<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    int last = out.ndim - 1;
    bool merge = out.ndim > 0;
    for (int k = 0; merge && k < N; ++k) merge = out.stride[k][last] == (*strides[k])[d] * shape[d];
    if (merge) {
      out.size[last] *= shape[d];
      for (int k = 0; k < N; ++k) out.stride[k][last] = (*strides[k])[d];
      continue;
    }
    HT_CHECK(out.ndim < kMaxDims, op, ": a strided view of ", shape.size(),
             " dimensions keeps more than ", kMaxDims,
             " after merging the dense ones; expected at most ", kMaxDims, " on CUDA");
    out.size[out.ndim] = shape[d];
    for (int k = 0; k < N; ++k) out.stride[k][out.ndim] = (*strides[k])[d];
    ++out.ndim;
  }
  if (out.ndim == 0) {  // a single element
    out.ndim = 1;
    out.size[0] = 1;
    for (int k = 0; k < N; ++k) out.stride[k][0] = 1;
  }
  return out;
}

// The element offsets of every operand at linear (row-major) index i, computed in
// Index arithmetic (int32_t only where fits_int32() holds).
template <class Index, int N>
__device__ __forceinline__ void strided_offsets(const StridedDims<N>& s, int64_t linear,
                                                int64_t (&off)[N]) {
  Index o[N] = {};
  auto i = static_cast<Index>(linear);
  for (int d = s.ndim - 1; d >= 0; --d) {
    auto size = static_cast<Index>(s.size[d]);
    Index idx = i % size;
    i /= size;
    for (int k = 0; k < N; ++k) o[k] += idx * static_cast<Index>(s.stride[k][d]);
  }
  for (int k = 0; k < N; ++k) off[k] = o[k];
}

}  // namespace ht::kernels::detail
