// Embedding lookups and the sliding-window kernels behind conv2d and maxpool2d.
#include <algorithm>
#include <cstring>
#include <utility>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/strided_loop.h"
#include "core/error.h"

namespace ht {

namespace {
void check_ids(const int32_t* ids, int64_t count, int64_t vocab, const char* op) {
  for (int64_t i = 0; i < count; ++i)
    HT_CHECK(ids[i] >= 0 && ids[i] < vocab, op, ": id ", ids[i], " at position ", i,
             " is out of range; expected 0 <= id < ", vocab, " (the table's rows)");
}
// Output columns [lo, hi) whose input column xo * stride - pad + kj lies inside the
// image; the loops then run without a bounds test per element.
std::pair<int64_t, int64_t> valid_columns(const Window2d& g, int64_t kj, int64_t ow) {
  int64_t first = g.pad - kj;  // input column 0 is reached at xo * stride == first
  int64_t lo = first <= 0 ? 0 : (first + g.stride - 1) / g.stride;
  int64_t last = g.w - 1 + g.pad - kj;  // the last input column
  int64_t hi = last < 0 ? 0 : last / g.stride + 1;
  lo = std::min(lo, ow);
  hi = std::clamp(hi, lo, ow);
  return {lo, hi};
}

}  // namespace

void CpuBackend::embedding(const float* table, const int32_t* ids, float* out, int64_t count,
                           int64_t vocab, int64_t dim) {
  check_ids(ids, count, vocab, "embedding");
  cpu::parallel_range(count, dim, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      std::memcpy(out + i * dim, table + static_cast<int64_t>(ids[i]) * dim, dim * sizeof(float));
  });
}

void CpuBackend::embedding_backward(const int32_t* ids, const float* gout, float* gtable,
                                    int64_t count, int64_t vocab, int64_t dim) {
  check_ids(ids, count, vocab, "embedding_backward");
  // Sequential: several positions may share an id.
  for (int64_t i = 0; i < count; ++i) {
    float* row = gtable + static_cast<int64_t>(ids[i]) * dim;
    const float* g = gout + i * dim;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) row[j] += g[j];
  }
}

void CpuBackend::im2col(const float* x, float* cols, const Window2d& g) {
  int64_t oh = g.out_h(), ow = g.out_w();
  int64_t planes = g.n * g.c;
  cpu::parallel_range(planes, g.kh * g.kw * oh * ow, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      int64_t n = p / g.c, c = p % g.c;
      const float* xp = x + p * g.h * g.w;
      float* base = cols + (n * g.c * g.kh * g.kw + c * g.kh * g.kw) * oh * ow;
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          float* row = base + (ki * g.kw + kj) * oh * ow;
          auto [lo, hi] = valid_columns(g, kj, ow);
          int64_t shift = kj - g.pad;
          for (int64_t y = 0; y < oh; ++y) {
            int64_t iy = y * g.stride - g.pad + ki;
            float* out = row + y * ow;
            if (iy < 0 || iy >= g.h) {
              std::fill(out, out + ow, 0.f);
              continue;
            }
            const float* in = xp + iy * g.w;  // output column xo reads in[xo * stride + shift]
            std::fill(out, out + lo, 0.f);
            if (g.stride == 1)
              std::copy(in + lo + shift, in + hi + shift, out + lo);
            else
              for (int64_t xo = lo; xo < hi; ++xo) out[xo] = in[xo * g.stride + shift];
            std::fill(out + hi, out + ow, 0.f);
          }
        }
    }
  });
}

void CpuBackend::col2im(const float* gcols, float* gx, const Window2d& g) {
  int64_t oh = g.out_h(), ow = g.out_w();
  int64_t planes = g.n * g.c;
  // Each (n, c) plane of gx is written by one thread only.
  cpu::parallel_range(planes, g.kh * g.kw * oh * ow, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      int64_t n = p / g.c, c = p % g.c;
      float* xp = gx + p * g.h * g.w;
      const float* base = gcols + (n * g.c * g.kh * g.kw + c * g.kh * g.kw) * oh * ow;
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          const float* row = base + (ki * g.kw + kj) * oh * ow;
          auto [lo, hi] = valid_columns(g, kj, ow);
          int64_t shift = kj - g.pad;
          for (int64_t y = 0; y < oh; ++y) {
            int64_t iy = y * g.stride - g.pad + ki;
            if (iy < 0 || iy >= g.h) continue;
            float* out = xp + iy * g.w;  // column xo adds into out[xo * stride + shift]
            const float* in = row + y * ow;
            if (g.stride == 1) {
#pragma omp simd
              for (int64_t xo = lo; xo < hi; ++xo) out[xo + shift] += in[xo];
            } else {
              for (int64_t xo = lo; xo < hi; ++xo) out[xo * g.stride + shift] += in[xo];
            }
          }
        }
    }
  });
}

void CpuBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g) {
  int64_t oh = g.out_h(), ow = g.out_w();
  cpu::parallel_range(g.n * g.c, oh * ow * g.kh * g.kw, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* xp = x + p * g.h * g.w;
      float* yp = y + p * oh * ow;
      int32_t* ap = argmax + p * oh * ow;
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo) {
          float best = -std::numeric_limits<float>::infinity();
          int64_t at = (yo * g.stride) * g.w + xo * g.stride;
          for (int64_t ki = 0; ki < g.kh; ++ki)
            for (int64_t kj = 0; kj < g.kw; ++kj) {
              int64_t idx = (yo * g.stride + ki) * g.w + xo * g.stride + kj;
              if (xp[idx] > best) {
                best = xp[idx];
                at = idx;
              }
            }
          yp[yo * ow + xo] = best;
          ap[yo * ow + xo] = static_cast<int32_t>(at);
        }
    }
  });
}

void CpuBackend::maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                                    const Window2d& g) {
  int64_t oh = g.out_h(), ow = g.out_w();
  cpu::parallel_range(g.n * g.c, g.h * g.w, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* xp = gx + p * g.h * g.w;
      for (int64_t i = 0; i < g.h * g.w; ++i) xp[i] = 0.f;
      const float* gp = gy + p * oh * ow;
      const int32_t* ap = argmax + p * oh * ow;
      for (int64_t i = 0; i < oh * ow; ++i) xp[ap[i]] += gp[i];
    }
  });
}

}  // namespace ht
