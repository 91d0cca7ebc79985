// Reductions and the row-wise ops built on them: softmax, cross-entropy, layernorm.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/strided_loop.h"
#include "core/error.h"

namespace ht {

namespace {

float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float row_sum(const float* x, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// sum_i exp(x_i - shift), written to y when y is non-null
float exp_sum(const float* x, float* y, int64_t n, float shift) {
  float s = 0.f;
  if (y) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      y[i] = std::exp(x[i] - shift);
      s += y[i];
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - shift);
  }
  return s;
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const float* x, float* y, int32_t* argmax, int64_t outer,
                        int64_t n, int64_t inner) {
  if (outer * inner == 0) return;
  if (op == ReduceOp::sum) {
    if (inner == 1) {
      cpu::parallel_range(outer, n, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) y[o] = row_sum(x + o * n, n);
      });
      return;
    }
    cpu::parallel_range(outer, n * inner, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        float* yo = y + o * inner;
        const float* xo = x + o * n * inner;
        for (int64_t i = 0; i < inner; ++i) yo[i] = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          const float* row = xo + j * inner;
#pragma omp simd
          for (int64_t i = 0; i < inner; ++i) yo[i] += row[i];
        }
      }
    });
    return;
  }
  // max with the first index of the maximum along n
  cpu::parallel_range(outer, n * inner, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const float* xo = x + o * n * inner + i;
        float best = xo[0];
        int32_t at = 0;
        for (int64_t j = 1; j < n; ++j)
          if (xo[j * inner] > best) {
            best = xo[j * inner];
            at = static_cast<int32_t>(j);
          }
        y[o * inner + i] = best;
        if (argmax) argmax[o * inner + i] = at;
      }
  });
}

void CpuBackend::max_backward(const float* gy, const int32_t* argmax, float* gx, int64_t outer,
                              int64_t n, int64_t inner) {
  cpu::parallel_range(outer, n * inner, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      float* go = gx + o * n * inner;
      for (int64_t i = 0; i < n * inner; ++i) go[i] = 0.f;
      for (int64_t i = 0; i < inner; ++i)
        go[argmax[o * inner + i] * inner + i] = gy[o * inner + i];
    }
  });
}

void CpuBackend::softmax(const float* x, float* y, int64_t rows, int64_t n, bool log) {
  cpu::parallel_range(rows, n * 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float m = row_max(xr, n);
      if (log) {
        float lse = m + std::log(exp_sum(xr, nullptr, n, m));
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] - lse;
      } else {
        float inv = 1.f / exp_sum(xr, yr, n, m);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) yr[i] *= inv;
      }
    }
  });
}

void CpuBackend::softmax_backward(const float* y, const float* gy, float* gx, int64_t rows,
                                  int64_t n, bool log) {
  cpu::parallel_range(rows, n * 3, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* yr = y + r * n;
      const float* gr = gy + r * n;
      float* out = gx + r * n;
      if (log) {  // gx = gy - softmax * sum(gy)
        float s = row_sum(gr, n);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) out[i] = gr[i] - std::exp(yr[i]) * s;
      } else {  // gx = y * (gy - sum(gy * y))
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < n; ++i) dot += gr[i] * yr[i];
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) out[i] = yr[i] * (gr[i] - dot);
      }
    }
  });
}

void CpuBackend::cross_entropy(const float* logits, const int32_t* labels, float* loss,
                               float* lse, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r)
    HT_CHECK(labels[r] >= 0 && labels[r] < classes, "cross_entropy: label ", labels[r],
             " at row ", r, " is out of range; expected 0 <= label < ", classes);
  cpu::parallel_range(rows, classes * 2, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = logits + r * classes;
      float m = row_max(xr, classes);
      lse[r] = m + std::log(exp_sum(xr, nullptr, classes, m));
      loss[r] = lse[r] - xr[labels[r]];
    }
  });
}

void CpuBackend::cross_entropy_backward(const float* logits, const float* lse,
                                        const int32_t* labels, const float* gloss,
                                        float* glogits, int64_t rows, int64_t classes) {
  cpu::parallel_range(rows, classes * 2, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = logits + r * classes;
      float* gr = glogits + r * classes;
      float g = gloss[r], l = lse[r];
#pragma omp simd
      for (int64_t i = 0; i < classes; ++i) gr[i] = g * std::exp(xr[i] - l);
      gr[labels[r]] -= g;
    }
  });
}

void CpuBackend::layernorm(const float* x, const float* gamma, const float* beta, float* y,
                           float* mean, float* rstd, int64_t rows, int64_t n, float eps) {
  cpu::parallel_range(rows, n * 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float mu = row_sum(xr, n) / static_cast<float>(n);
      float var = 0.f;
#pragma omp simd reduction(+ : var)
      for (int64_t i = 0; i < n; ++i) var += (xr[i] - mu) * (xr[i] - mu);
      float rs = 1.f / std::sqrt(var / static_cast<float>(n) + eps);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mu) * rs * gamma[i] + beta[i];
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
}

void CpuBackend::layernorm_backward(const float* x, const float* gamma, const float* mean,
                                    const float* rstd, const float* gy, float* gx, float* ggamma,
                                    float* gbeta, int64_t rows, int64_t n) {
  // gamma/beta gradients are sums over rows: each thread sums its rows into its own
  // partial buffers, then the partials are added in thread order (deterministic).
  int threads = (rows * n >= cpu::kParallelGrain) ? pool_threads() : 1;
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * n, 0.f);
  parallel_chunks(threads, [&](int64_t t) {
    float* pg = partial.data() + static_cast<size_t>(t) * 2 * n;
    float* pb = pg + n;
    int64_t lo = rows * t / threads, hi = rows * (t + 1) / threads;
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * n;
      const float* gr = gy + r * n;
      float* out = gx + r * n;
      float mu = mean[r], rs = rstd[r];
      float sum_d = 0.f, sum_dx = 0.f;
#pragma omp simd reduction(+ : sum_d, sum_dx)
      for (int64_t i = 0; i < n; ++i) {
        float xhat = (xr[i] - mu) * rs;
        float d = gr[i] * gamma[i];
        sum_d += d;
        sum_dx += d * xhat;
        pg[i] += gr[i] * xhat;
        pb[i] += gr[i];
      }
      float inv_n = 1.f / static_cast<float>(n);
      float md = sum_d * inv_n, mdx = sum_dx * inv_n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        float xhat = (xr[i] - mu) * rs;
        out[i] = rs * (gr[i] * gamma[i] - md - xhat * mdx);
      }
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    float sg = 0.f, sb = 0.f;
    for (int t = 0; t < threads; ++t) {
      sg += partial[static_cast<size_t>(t) * 2 * n + i];
      sb += partial[static_cast<size_t>(t) * 2 * n + n + i];
    }
    ggamma[i] = sg;
    gbeta[i] = sb;
  }
}

// ---- causal attention, composed from this backend's gemm, scale and softmax

namespace {

// The primitives and arguments ops/ composes attention with (matmul, mul, where with
// -inf, softmax), so that the op's results on the CPU are those of the composition.
struct AttentionGemms {
  Backend& be;
  int64_t bh, t, d;
  // c (bh, m, n) = op(a) @ op(b), row-major operands of their natural widths.
  void run(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t sa, const float* b,
           int64_t sb, float* c) const {
    cpu::batched_gemm(be, ta, tb, m, n, k, a, sa, b, sb, c, m * n, bh);
  }
  // p (bh, t, t) = softmax over j <= i of scale * q k^T; s is scratch of the same size.
  void probabilities(const float* q, const float* k, float scale, float* s, float* p) const {
    run(false, true, t, t, d, q, t * d, k, t * d, s);
    be.unary(UnaryOp::mul_scalar, s, s, bh * t * t, scale);
    mask(s, -std::numeric_limits<float>::infinity());
    be.softmax(s, p, bh * t, t, false);
  }
  void mask(float* s, float value) const {
    cpu::parallel_range(bh * t, t, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t i = r % t;
        for (int64_t j = i + 1; j < t; ++j) s[r * t + j] = value;
      }
    });
  }
};

}  // namespace

void CpuBackend::causal_attention(const float* q, const float* k, const float* v, float* o,
                                  float* lse, int64_t bh, int64_t t, int64_t d, float scale) {
  if (bh == 0 || t == 0) return;
  const AttentionGemms mm{*this, bh, t, d};
  cpu::Scratch s(allocator(), static_cast<size_t>(bh * t * t), "causal_attention");
  cpu::Scratch p(allocator(), static_cast<size_t>(bh * t * t), "causal_attention");
  mm.probabilities(q, k, scale, s.get(), p.get());
  mm.run(false, false, t, d, t, p.get(), t * t, v, t * d, o);
  cpu::parallel_range(bh * t, t, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = s.get() + r * t;
      const int64_t n = r % t + 1;  // the unmasked scores
      const float m = row_max(row, n);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - m);
      lse[r] = m + std::log(sum);
    }
  });
}

// The composition's backward, as autograd runs it: gv = p^T go, gp = go v^T, the softmax
// backward, the mask's zeros, the scale, then gq = gs k and gk = gs^T q. p is recomputed
// exactly as the forward computed it; o and lse are not needed.
void CpuBackend::causal_attention_backward(const float* q, const float* k, const float* v,
                                           const float*, const float*, const float* go,
                                           float* gq, float* gk, float* gv, int64_t bh,
                                           int64_t t, int64_t d, float scale) {
  if (bh == 0 || t == 0) return;
  const AttentionGemms mm{*this, bh, t, d};
  const size_t tt = static_cast<size_t>(bh * t * t);
  cpu::Scratch s(allocator(), tt, "causal_attention_backward");
  cpu::Scratch p(allocator(), tt, "causal_attention_backward");
  mm.probabilities(q, k, scale, s.get(), p.get());
  float* gp = s.get();  // the scores are not needed again
  mm.run(false, true, t, t, d, go, t * d, v, t * d, gp);
  mm.run(true, false, t, d, t, p.get(), t * t, go, t * d, gv);
  cpu::Scratch gs(allocator(), tt, "causal_attention_backward");
  softmax_backward(p.get(), gp, gs.get(), bh * t, t, false);
  mm.mask(gs.get(), 0.f);
  unary(UnaryOp::mul_scalar, gs.get(), gs.get(), bh * t * t, scale);
  mm.run(false, false, t, d, t, gs.get(), t * t, k, t * d, gq);
  mm.run(true, false, t, d, t, gs.get(), t * t, q, t * d, gk);
}

}  // namespace ht
