// Embedding lookups and the sliding-window kernels behind conv2d and maxpool2d.
#include <cstring>
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
          for (int64_t y = 0; y < oh; ++y) {
            int64_t iy = y * g.stride - g.pad + ki;
            float* out = row + y * ow;
            if (iy < 0 || iy >= g.h) {
              for (int64_t xo = 0; xo < ow; ++xo) out[xo] = 0.f;
              continue;
            }
            const float* in = xp + iy * g.w;
            for (int64_t xo = 0; xo < ow; ++xo) {
              int64_t ix = xo * g.stride - g.pad + kj;
              out[xo] = (ix >= 0 && ix < g.w) ? in[ix] : 0.f;
            }
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
          for (int64_t y = 0; y < oh; ++y) {
            int64_t iy = y * g.stride - g.pad + ki;
            if (iy < 0 || iy >= g.h) continue;
            float* out = xp + iy * g.w;
            const float* in = row + y * ow;
            for (int64_t xo = 0; xo < ow; ++xo) {
              int64_t ix = xo * g.stride - g.pad + kj;
              if (ix >= 0 && ix < g.w) out[ix] += in[xo];
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
