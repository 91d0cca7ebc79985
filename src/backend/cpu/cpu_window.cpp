// Embedding lookups and the sliding-window kernels behind conv2d and maxpool2d.
#include <algorithm>
#include <cstring>
#include <utility>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
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

namespace {
// The index within its plane of window (yo, xo)'s maximum: the first in window order.
inline int64_t window_argmax(const float* xp, const Window2d& g, int64_t yo, int64_t xo,
                             float& best) {
  best = -std::numeric_limits<float>::infinity();
  int64_t at = (yo * g.stride) * g.w + xo * g.stride;
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      int64_t idx = (yo * g.stride + ki) * g.w + xo * g.stride + kj;
      if (xp[idx] > best) {
        best = xp[idx];
        at = idx;
      }
    }
  return at;
}
}  // namespace

void CpuBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g) {
  int64_t oh = g.out_h(), ow = g.out_w();
  cpu::parallel_range(g.n * g.c, oh * ow * g.kh * g.kw, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* xp = x + p * g.h * g.w;
      float* yp = y + p * oh * ow;
      int32_t* ap = argmax ? argmax + p * oh * ow : nullptr;
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo) {
          float best;
          int64_t at = window_argmax(xp, g, yo, xo, best);
          yp[yo * ow + xo] = best;
          if (ap) ap[yo * ow + xo] = static_cast<int32_t>(at);
        }
    }
  });
}

// Without argmax the maximum is found again in x, by the forward's rule, so both ways
// route the gradient identically; y is not needed for that.
void CpuBackend::maxpool2d_backward(const float* x, const float*, const float* gy,
                                    const int32_t* argmax, float* gx, const Window2d& g) {
  int64_t oh = g.out_h(), ow = g.out_w();
  cpu::parallel_range(g.n * g.c, g.h * g.w, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* xp = gx + p * g.h * g.w;
      for (int64_t i = 0; i < g.h * g.w; ++i) xp[i] = 0.f;
      const float* gp = gy + p * oh * ow;
      if (argmax) {
        const int32_t* ap = argmax + p * oh * ow;
        for (int64_t i = 0; i < oh * ow; ++i) xp[ap[i]] += gp[i];
        continue;
      }
      const float* in = x + p * g.h * g.w;
      float best;
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo)
          xp[window_argmax(in, g, yo, xo, best)] += gp[yo * ow + xo];
    }
  });
}

// ---- convolution as im2col and gemm

void cpu::batched_gemm(Backend& be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t sa,
                       const float* b, int64_t sb, float* c, int64_t sc, int64_t batch, float beta) {
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.beta = beta;
  g.a = a;
  g.lda = ta ? m : k;
  g.stride_a = sa;
  g.b = b;
  g.ldb = tb ? k : n;
  g.stride_b = sb;
  g.c = c;
  g.ldc = n;
  g.stride_c = sc;
  g.batch = batch;
  be.gemm(g);
}

namespace {

// The columns of a convolution are unfolded a chunk of samples at a time, each chunk's
// columns within kColumnsBudget bytes (one sample at least): im2col's output is then
// still in this core's cache when the gemm reads it, and the scratch no longer grows with
// the batch. The CNN's second convolution unfolds 221 KiB a sample (14 MiB at 64
// samples); a training step of the CNN at 64 samples took 32.3 ms unfolding whole
// batches and 28.1 ms in chunks (medians of 6 interleaved runs of tools/bench-engine),
// with budgets from 256 KiB to 2 MiB alike, and its peak memory fell from 43 to 34 MiB.
constexpr int64_t kColumnsBudget = 512 << 10;

struct ConvShape {
  int64_t ck, hw, chunk, in_size;
};
ConvShape conv_shape(const Window2d& g) {
  ConvShape s;
  s.ck = g.c * g.kh * g.kw;
  s.hw = g.out_h() * g.out_w();
  s.chunk = std::clamp<int64_t>(kColumnsBudget / std::max<int64_t>(s.ck * s.hw * 4, 1), 1,
                                std::max<int64_t>(g.n, 1));
  s.in_size = g.c * g.h * g.w;
  return s;
}

// Samples [s, s + chunk) of g, clipped to the batch.
Window2d chunk_of(const Window2d& g, int64_t s, int64_t chunk) {
  Window2d part = g;
  part.n = std::min(chunk, g.n - s);
  return part;
}

}  // namespace

void CpuBackend::conv2d(const float* x, const float* w, float* y, const Window2d& g,
                        int64_t out_ch) {
  const ConvShape cs = conv_shape(g);
  if (g.n == 0 || out_ch == 0 || cs.hw == 0) return;
  cpu::Scratch cols(allocator(), static_cast<size_t>(cs.chunk * cs.ck * cs.hw), "conv2d");
  for (int64_t s = 0; s < g.n; s += cs.chunk) {
    const Window2d part = chunk_of(g, s, cs.chunk);
    im2col(x + s * cs.in_size, cols.get(), part);
    cpu::batched_gemm(*this, false, false, out_ch, cs.hw, cs.ck, w, 0, cols.get(), cs.ck * cs.hw,
                 y + s * out_ch * cs.hw, out_ch * cs.hw, part.n, 0.f);
  }
}

void CpuBackend::conv2d_backward_data(const float* gy, const float* w, float* gx,
                                      const Window2d& g, int64_t out_ch) {
  const ConvShape cs = conv_shape(g);
  fill(gx, 0.f, g.n * cs.in_size);
  if (g.n == 0 || cs.hw == 0) return;
  cpu::Scratch gcols(allocator(), static_cast<size_t>(cs.chunk * cs.ck * cs.hw),
                     "conv2d_backward");
  for (int64_t s = 0; s < g.n; s += cs.chunk) {
    const Window2d part = chunk_of(g, s, cs.chunk);
    cpu::batched_gemm(*this, true, false, cs.ck, cs.hw, out_ch, w, 0, gy + s * out_ch * cs.hw,
                 out_ch * cs.hw, gcols.get(), cs.ck * cs.hw, part.n, 0.f);
    col2im(gcols.get(), gx + s * cs.in_size, part);
  }
}

// gw = sum over samples of gy_i cols_i^T, the first sample's product overwriting gw.
void CpuBackend::conv2d_backward_filter(const float* x, const float* gy, float* gw,
                                        const Window2d& g, int64_t out_ch) {
  const ConvShape cs = conv_shape(g);
  if (g.n == 0 || cs.hw == 0) {
    fill(gw, 0.f, out_ch * cs.ck);
    return;
  }
  cpu::Scratch cols(allocator(), static_cast<size_t>(cs.chunk * cs.ck * cs.hw),
                    "conv2d_backward");
  for (int64_t s = 0; s < g.n; s += cs.chunk) {
    const Window2d part = chunk_of(g, s, cs.chunk);
    im2col(x + s * cs.in_size, cols.get(), part);
    for (int64_t i = 0; i < part.n; ++i)
      cpu::batched_gemm(*this, false, true, out_ch, cs.ck, cs.hw, gy + (s + i) * out_ch * cs.hw, 0,
                   cols.get() + i * cs.ck * cs.hw, 0, gw, 0, 1, s + i == 0 ? 0.f : 1.f);
  }
}

}  // namespace ht
