#include "tests/harness/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ht::harness::ref {

namespace {
// Offset into a row-major array of shape `s` for a multi-index of `target` rank,
// where dimensions of size 1 in `s` broadcast.
int64_t broadcast_offset(const std::vector<int64_t>& idx, const Shape& s, const Shape& target) {
  size_t lead = target.size() - s.size();
  int64_t off = 0;
  for (size_t d = 0; d < s.size(); ++d) off = off * s[d] + (s[d] == 1 ? 0 : idx[lead + d]);
  return off;
}

std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = std::max(da, db);
  }
  return out;
}
}  // namespace

Values map(const Values& x, const std::function<double(double)>& f) {
  Values y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
  return y;
}

Values broadcast(const Values& a, const Shape& sa, const Values& b, const Shape& sb,
                 const std::function<double(double, double)>& f) {
  Shape out = broadcast_shape(sa, sb);
  Values y(numel(out));
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
    auto idx = unravel(i, out);
    y[i] = f(a[broadcast_offset(idx, sa, out)], b[broadcast_offset(idx, sb, out)]);
  }
  return y;
}

Values expand(const Values& x, const Shape& s, const Shape& target) {
  Values y(numel(target));
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i)
    y[i] = x[broadcast_offset(unravel(i, target), s, target)];
  return y;
}

Values permute(const Values& x, const Shape& s, const std::vector<int64_t>& order) {
  Shape out(order.size());
  for (size_t i = 0; i < order.size(); ++i) out[i] = s[order[i]];
  Strides st = contiguous_strides(s);
  Values y(x.size());
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
    auto idx = unravel(i, out);
    int64_t off = 0;
    for (size_t d = 0; d < order.size(); ++d) off += idx[d] * st[order[d]];
    y[i] = x[off];
  }
  return y;
}

Values reduce(const Values& x, const Shape& s, const std::vector<int64_t>& axes, bool take_max) {
  Shape kept;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) kept.push_back(s[d]);
  Values y(numel(kept), take_max ? -std::numeric_limits<double>::infinity() : 0.0);
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    auto idx = unravel(i, s);
    int64_t off = 0, k = 0;
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) off = off * kept[k++] + idx[d];
    y[off] = take_max ? std::max(y[off], x[i]) : y[off] + x[i];
  }
  return y;
}

Values matmul(const Values& a, const Values& b, int64_t batch, int64_t m, int64_t k, int64_t n,
              bool shared_b) {
  Values c(batch * m * n, 0.0);
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q)
          s += a[(p * m + i) * k + q] * b[((shared_b ? 0 : p) * k + q) * n + j];
        c[(p * m + i) * n + j] = s;
      }
  return c;
}

Values softmax_rows(const Values& x, int64_t rows, int64_t n, bool log) {
  Values y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[r * n + i]);
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[r * n + i] - m);
    for (int64_t i = 0; i < n; ++i)
      y[r * n + i] = log ? x[r * n + i] - m - std::log(s) : std::exp(x[r * n + i] - m) / s;
  }
  return y;
}

Values cross_entropy_rows(const Values& logits, const Values& labels, int64_t rows,
                          int64_t classes) {
  Values lsm = softmax_rows(logits, rows, classes, true);
  Values loss(rows);
  for (int64_t r = 0; r < rows; ++r)
    loss[r] = -lsm[r * classes + static_cast<int64_t>(labels[r])];
  return loss;
}

Values layernorm(const Values& x, const Values& gamma, const Values& beta, int64_t rows,
                 int64_t n, double eps) {
  Values y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mu += x[r * n + i];
    mu /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mu) * (x[r * n + i] - mu);
    var /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i)
      y[r * n + i] = (x[r * n + i] - mu) / std::sqrt(var + eps) * gamma[i] + beta[i];
  }
  return y;
}

Values conv2d(const Values& x, const Values& w, const Values& b, int64_t n, int64_t c, int64_t h,
              int64_t wd, int64_t o, int64_t k, int64_t stride, int64_t pad) {
  int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (wd + 2 * pad - k) / stride + 1;
  Values y(n * o * oh * ow, 0.0);
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t yy = 0; yy < oh; ++yy)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double s = b.empty() ? 0.0 : b[oc];
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t ki = 0; ki < k; ++ki)
              for (int64_t kj = 0; kj < k; ++kj) {
                int64_t iy = yy * stride - pad + ki, ix = xx * stride - pad + kj;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += x[((in * c + ic) * h + iy) * wd + ix] * w[((oc * c + ic) * k + ki) * k + kj];
              }
          y[((in * o + oc) * oh + yy) * ow + xx] = s;
        }
  return y;
}

Values maxpool2d(const Values& x, int64_t n, int64_t c, int64_t h, int64_t wd, int64_t k,
                 int64_t stride) {
  int64_t oh = (h - k) / stride + 1, ow = (wd - k) / stride + 1;
  Values y(n * c * oh * ow);
  for (int64_t p = 0; p < n * c; ++p)
    for (int64_t yy = 0; yy < oh; ++yy)
      for (int64_t xx = 0; xx < ow; ++xx) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t ki = 0; ki < k; ++ki)
          for (int64_t kj = 0; kj < k; ++kj)
            m = std::max(m, x[(p * h + yy * stride + ki) * wd + xx * stride + kj]);
        y[(p * oh + yy) * ow + xx] = m;
      }
  return y;
}

Values causal_attention(const Values& q, const Values& k, const Values& v, int64_t bh,
                        int64_t t, int64_t d) {
  Values out(bh * t * d, 0.0);
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t p = 0; p < bh; ++p)
    for (int64_t i = 0; i < t; ++i) {
      Values s(i + 1);
      double m = -std::numeric_limits<double>::infinity(), z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += q[(p * t + i) * d + e] * k[(p * t + j) * d + e];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t e = 0; e < d; ++e)
          out[(p * t + i) * d + e] += std::exp(s[j] - m) / z * v[(p * t + j) * d + e];
    }
  return out;
}

}  // namespace ht::harness::ref
