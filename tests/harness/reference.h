// Plain double-precision reference implementations: the oracle for every op. They are
// written for clarity (nested loops over row-major arrays), never for speed.
#pragma once

#include <functional>
#include <vector>

#include "core/shape.h"

namespace ht::harness::ref {

using Values = std::vector<double>;

Values map(const Values& x, const std::function<double(double)>& f);
// NumPy-broadcast elementwise op; the result has the broadcast shape.
Values broadcast(const Values& a, const Shape& sa, const Values& b, const Shape& sb,
                 const std::function<double(double, double)>& f);
// Reads x (shape s) broadcast to `target`.
Values expand(const Values& x, const Shape& s, const Shape& target);
// out[...] = x[...] with axes reordered: out axis i is x axis order[i].
Values permute(const Values& x, const Shape& s, const std::vector<int64_t>& order);
// Sum or max over `axes`; the result is in row-major order of the remaining axes.
Values reduce(const Values& x, const Shape& s, const std::vector<int64_t>& axes, bool take_max);
// (batch, m, k) @ (batch or 1, k, n)
Values matmul(const Values& a, const Values& b, int64_t batch, int64_t m, int64_t k, int64_t n,
              bool shared_b);
Values softmax_rows(const Values& x, int64_t rows, int64_t n, bool log);
Values cross_entropy_rows(const Values& logits, const Values& labels, int64_t rows,
                          int64_t classes);
Values layernorm(const Values& x, const Values& gamma, const Values& beta, int64_t rows,
                 int64_t n, double eps);
// x (N, C, H, W), w (O, C, k, k), b (O) or empty
Values conv2d(const Values& x, const Values& w, const Values& b, int64_t n, int64_t c, int64_t h,
              int64_t wd, int64_t o, int64_t k, int64_t stride, int64_t pad);
Values maxpool2d(const Values& x, int64_t n, int64_t c, int64_t h, int64_t wd, int64_t k,
                 int64_t stride);
// q, k, v (B*H, T, D)
Values causal_attention(const Values& q, const Values& k, const Values& v, int64_t bh,
                        int64_t t, int64_t d);

}  // namespace ht::harness::ref
