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
    for (int k = 0; merge && k < N; ++k)
      merge = out.stride[k][last] == (*strides[k])[d] * shape[d];
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

// Row-major strides of a dense tensor of `shape` (the outputs of binary and where).
inline Strides dense_strides(const Shape& shape) {
  Strides s(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = step;
    step *= shape[d];
  }
  return s;
}

// The element offsets of every operand at linear (row-major) index i.
template <int N>
__device__ __forceinline__ void strided_offsets(const StridedDims<N>& s, int64_t i,
                                                int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    int64_t idx = i % s.size[d];
    i /= s.size[d];
    for (int k = 0; k < N; ++k) off[k] += idx * s.stride[k][d];
  }
}

}  // namespace ht::kernels::detail
