// Iteration over N operands that share a shape but not strides (broadcasting, views).
// Dimensions are first coalesced (size-1 dimensions dropped, adjacent dimensions
// merged where every operand is dense across them), so the common cases collapse to
// one long inner loop with unit or zero strides that the kernels specialise on.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/shape.h"
#include "core/thread_pool.h"

namespace ht::cpu {

template <size_t N>
struct StridedShape {
  Shape shape;
  std::array<Strides, N> strides;
};

template <size_t N>
StridedShape<N> coalesce(const Shape& shape, const std::array<const Strides*, N>& strides) {
  StridedShape<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out.shape.empty();
    for (size_t k = 0; merge && k < N; ++k)
      merge = out.strides[k].back() == (*strides[k])[d] * shape[d];
    if (merge) {
      out.shape.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) out.strides[k].back() = (*strides[k])[d];
    } else {
      out.shape.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) out.strides[k].push_back((*strides[k])[d]);
    }
  }
  if (out.shape.empty()) {  // a single element
    out.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(1);
  }
  return out;
}

// Elements below which a loop runs on one thread: a parallel region costs a few
// microseconds, more than a small elementwise op.
constexpr int64_t kParallelGrain = 1 << 15;

// Calls body(offsets, count, inner_strides) once per row of the innermost dimension;
// rows run in parallel when the loop is large.
template <size_t N, class Body>
void for_each_row(const StridedShape<N>& s, Body&& body) {
  int64_t nd = static_cast<int64_t>(s.shape.size());
  int64_t inner = s.shape.back();
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= s.shape[d];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = s.strides[k][nd - 1];
  auto row = [&](int64_t r) {
    std::array<int64_t, N> offs{};
    int64_t rem = r;
    for (int64_t d = nd - 2; d >= 0; --d) {
      int64_t idx = rem % s.shape[d];
      rem /= s.shape[d];
      for (size_t k = 0; k < N; ++k) offs[k] += idx * s.strides[k][d];
    }
    body(offs, inner, inner_strides);
  };
  int threads = pool_threads();
  if (rows == 1 && inner >= 2 * kParallelGrain && threads > 1) {
    // One long row: split it into chunks instead.
    int64_t chunks = threads * 4;
    int64_t step = (inner + chunks - 1) / chunks;
    parallel_chunks(chunks, [&](int64_t c) {
      int64_t begin = c * step, end = std::min(inner, begin + step);
      if (begin >= end) return;
      std::array<int64_t, N> offs;
      for (size_t k = 0; k < N; ++k) offs[k] = begin * inner_strides[k];
      body(offs, end - begin, inner_strides);
    });
    return;
  }
  if (rows * inner < kParallelGrain || rows == 1 || threads == 1) {
    for (int64_t r = 0; r < rows; ++r) row(r);
    return;
  }
  int64_t chunks = std::min<int64_t>(rows, threads * 4);
  parallel_chunks(chunks, [&](int64_t c) {
    for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) row(r);
  });
}

// Runs fn(begin, end) over [0, n) split across threads when n * cost is large.
template <class Fn>
void parallel_range(int64_t n, int64_t cost_per_item, Fn&& fn) {
  int threads = pool_threads();
  if (n * cost_per_item < kParallelGrain || threads == 1 || n < 2) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(n, threads);
  parallel_chunks(chunks, [&](int64_t c) { fn(n * c / chunks, n * (c + 1) / chunks); });
}

}  // namespace ht::cpu
