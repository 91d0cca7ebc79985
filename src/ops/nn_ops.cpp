#include <cmath>

#include "ops/op_support.h"

namespace ht {

using detail::check_f32;
using detail::check_i32;

namespace {

Tensor softmax_last(const Tensor& x, bool log, const char* name) {
  Tensor xc = contiguous(x);
  int64_t n = x.dim() == 0 ? 1 : x.shape().back();
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor out = Tensor::empty(x.shape(), DType::f32, x.backend(), name);
  x.backend().softmax(xc.data(), out.data(), rows, n, log);
  if (any_requires_grad({&x})) {
    Tensor y = out.detach();
    record(out, name, {&x}, [y, rows, n, log, name](const Tensor& g, const Node&) {
      Tensor gc = contiguous(g);
      Tensor gx = Tensor::empty(y.shape(), DType::f32, y.backend(), name);
      y.backend().softmax_backward(y.data(), gc.data(), gx.data(), rows, n, log);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor softmax_axis(const Tensor& x, int64_t axis, bool log, const char* name) {
  check_f32(x, name, "x");
  HT_CHECK(x.dim() >= 1, name, ": a 0-d tensor has no axis to normalise over");
  int64_t a = normalize_axis(axis, x.dim(), name);
  if (a == x.dim() - 1) return softmax_last(x, log, name);
  return transpose(softmax_last(transpose(x, a, -1), log, name), a, -1);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_axis(x, axis, false, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_axis(x, axis, true, "log_softmax");
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction) {
  check_f32(logits, "cross_entropy", "logits");
  check_i32(labels, "cross_entropy", "labels");
  detail::check_same_backend(logits, labels, "cross_entropy");
  detail::check_rank(logits, 2, "cross_entropy", "logits");
  HT_CHECK(labels.dim() == 1 && labels.shape()[0] == logits.shape()[0],
           "cross_entropy: labels of shape ", to_string(labels.shape()), " for logits of shape ",
           to_string(logits.shape()), "; expected labels of shape [", logits.shape()[0], "]");
  int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  HT_CHECK(rows > 0 && classes > 0, "cross_entropy: empty logits of shape ",
           to_string(logits.shape()), "; expected at least one row and one class");
  Tensor lc = contiguous(logits), yc = contiguous(labels);
  Backend& be = logits.backend();
  Tensor loss = Tensor::empty({rows}, DType::f32, be, "cross_entropy");
  Tensor lse = Tensor::empty({rows}, DType::f32, be, "cross_entropy");
  be.cross_entropy(lc.data(), yc.data_i32(), loss.data(), lse.data(), rows, classes);
  if (any_requires_grad({&logits})) {
    Tensor keep_logits = lc.detach();
    record(loss, "cross_entropy", {&logits},
           [keep_logits, lse, yc, rows, classes](const Tensor& g, const Node&) {
             Tensor gc = contiguous(g);
             Tensor gx = Tensor::empty({rows, classes}, DType::f32, gc.backend(), "cross_entropy");
             gc.backend().cross_entropy_backward(keep_logits.data(), lse.data(), yc.data_i32(),
                                                 gc.data(), gx.data(), rows, classes);
             return std::vector<Tensor>{gx};
           });
  }
  return reduction == Reduction::sum ? sum(loss) : mean(loss);
}

Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  check_f32(x, "layernorm", "x");
  check_f32(gamma, "layernorm", "gamma");
  check_f32(beta, "layernorm", "beta");
  detail::check_same_backend(x, gamma, "layernorm");
  detail::check_same_backend(x, beta, "layernorm");
  HT_CHECK(x.dim() >= 1, "layernorm: a 0-d input has no axis to normalise");
  int64_t n = x.shape().back();
  HT_CHECK(gamma.shape() == Shape{n} && beta.shape() == Shape{n}, "layernorm: gamma ",
           to_string(gamma.shape()), " and beta ", to_string(beta.shape()), " for input ",
           to_string(x.shape()), "; expected both of shape [", n, "]");
  HT_CHECK(eps > 0.f, "layernorm: eps ", eps, "; expected a positive value");
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor xc = contiguous(x), gc = contiguous(gamma), bc = contiguous(beta);
  Backend& be = x.backend();
  Tensor y = Tensor::empty(x.shape(), DType::f32, be, "layernorm");
  Tensor mu = Tensor::empty({rows}, DType::f32, be, "layernorm");
  Tensor rstd = Tensor::empty({rows}, DType::f32, be, "layernorm");
  be.layernorm(xc.data(), gc.data(), bc.data(), y.data(), mu.data(), rstd.data(), rows, n, eps);
  if (any_requires_grad({&x, &gamma, &beta})) {
    Tensor kx = xc.detach(), kg = gc.detach();
    record(y, "layernorm", {&x, &gamma, &beta},
           [kx, kg, mu, rstd, rows, n](const Tensor& g, const Node&) {
             Tensor gy = contiguous(g);
             Backend& b = gy.backend();
             Tensor gx = Tensor::empty(kx.shape(), DType::f32, b, "layernorm_backward");
             Tensor ggamma = Tensor::empty({n}, DType::f32, b, "layernorm_backward");
             Tensor gbeta = Tensor::empty({n}, DType::f32, b, "layernorm_backward");
             b.layernorm_backward(kx.data(), kg.data(), mu.data(), rstd.data(), gy.data(),
                                  gx.data(), ggamma.data(), gbeta.data(), rows, n);
             return std::vector<Tensor>{gx, ggamma, gbeta};
           });
  }
  return y;
}

Tensor embedding(const Tensor& table, const Tensor& ids) {
  check_f32(table, "embedding", "table");
  check_i32(ids, "embedding", "ids");
  detail::check_same_backend(table, ids, "embedding");
  detail::check_rank(table, 2, "embedding", "table");
  int64_t vocab = table.shape()[0], dim = table.shape()[1];
  Tensor tc = contiguous(table), ic = contiguous(ids);
  Shape shape = ids.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, DType::f32, table.backend(), "embedding");
  table.backend().embedding(tc.data(), ic.data_i32(), out.data(), ids.numel(), vocab, dim);
  if (any_requires_grad({&table})) {
    record(out, "embedding", {&table}, [ic, vocab, dim](const Tensor& g, const Node&) {
      Tensor gc = contiguous(g);
      Tensor gt = Tensor::zeros({vocab, dim}, gc.backend());
      gc.backend().embedding_backward(ic.data_i32(), gc.data(), gt.data(), ic.numel(), vocab, dim);
      return std::vector<Tensor>{gt};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  check_f32(x, "dropout", "x");
  HT_CHECK(p >= 0.f && p < 1.f, "dropout: probability ", p, "; expected 0 <= p < 1");
  if (p == 0.f) return x;
  Tensor mask = Tensor::empty(x.shape(), DType::f32, x.backend(), "dropout");
  x.backend().dropout_mask(mask.data(), mask.numel(), p, seed, offset);
  return mul(x, mask);
}

}  // namespace ht
