#include "ops/op_support.h"

namespace ht {

using detail::check_f32;

namespace {

// A stack of matrices as gemm sees them: base pointer, transposition, leading
// dimension and the stride between consecutive matrices. Transposed views (from
// transpose()) are passed as a transposition flag instead of being copied.
struct MatrixStack {
  Tensor hold;  // keeps a dense copy alive when one was needed
  const float* ptr = nullptr;
  bool trans = false;
  int64_t ld = 0, batch_stride = 0;
};

MatrixStack as_matrix_stack(const Tensor& t) {
  auto fits = [](const Tensor& x, MatrixStack& m) {
    int64_t r = x.dim();
    const Strides& st = x.strides();
    const Shape& sh = x.shape();
    int64_t rows = sh[r - 2], cols = sh[r - 1];
    if (st[r - 1] == 1 && (st[r - 2] >= std::max<int64_t>(cols, 1) || rows == 1)) {
      m.trans = false;
      m.ld = rows == 1 ? std::max<int64_t>(cols, 1) : st[r - 2];
    } else if (st[r - 2] == 1 && (st[r - 1] >= std::max<int64_t>(rows, 1) || cols == 1)) {
      m.trans = true;
      m.ld = cols == 1 ? std::max<int64_t>(rows, 1) : st[r - 1];
    } else {
      return false;
    }
    // Leading (batch) dimensions must collapse into one uniform stride.
    m.batch_stride = r > 2 ? st[r - 3] : 0;
    for (int64_t d = r - 3; d > 0; --d)
      if (sh[d] != 1 && st[d - 1] != st[d] * sh[d]) return false;
    m.ptr = x.data();
    return true;
  };
  MatrixStack m;
  if (fits(t, m)) return m;
  m.hold = contiguous(t);
  bool ok = fits(m.hold, m);
  HT_CHECK(ok, "matmul: internal error laying out shape ", to_string(t.shape()));
  return m;
}

// Runs the product without recording: the caller records the whole matmul.
// True when the last two axes are stored transposed (column-major), as transpose()
// leaves them: the gradient is then produced in that layout too, so that it reaches
// the underlying (dense) tensor without a transposing copy.
bool column_major(const Tensor& t) {
  int64_t r = t.dim();
  return t.strides()[r - 2] == 1 && t.strides()[r - 1] != 1;
}

void gemm_into(const Tensor& a, const Tensor& b, Tensor& out, int64_t batch) {
  NoGradGuard raw;
  MatrixStack ma = as_matrix_stack(a), mb = as_matrix_stack(b);
  GemmArgs g;
  g.m = a.shape()[a.dim() - 2];
  g.k = a.shape()[a.dim() - 1];
  g.n = b.shape()[b.dim() - 1];
  g.trans_a = ma.trans;
  g.trans_b = mb.trans;
  g.a = ma.ptr;
  g.lda = ma.ld;
  g.stride_a = ma.batch_stride;
  g.b = mb.ptr;
  g.ldb = mb.ld;
  g.stride_b = mb.batch_stride;
  g.c = out.data();
  g.ldc = g.n;
  g.stride_c = g.m * g.n;
  g.batch = batch;
  out.backend().gemm(g);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_f32(a, "matmul", "a");
  check_f32(b, "matmul", "b");
  detail::check_same_backend(a, b, "matmul");
  HT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: shapes ", to_string(a.shape()), " and ",
           to_string(b.shape()), "; expected at least 2 dimensions each");
  int64_t k = a.shape().back();
  HT_CHECK(b.shape()[b.dim() - 2] == k, "matmul: inner dimensions differ: ",
           to_string(a.shape()), " @ ", to_string(b.shape()), "; expected a's last (", k,
           ") to equal b's second to last (", b.shape()[b.dim() - 2], ")");

  if (b.dim() == 2) {
    // (..., M, K) @ (K, N): one gemm over all rows of a.
    Tensor a2 = a.dim() == 2 ? a : reshape(a.detach(), {-1, k});
    Shape out_shape = a.shape();
    out_shape.back() = b.shape()[1];
    Tensor out = Tensor::empty({a2.shape()[0], b.shape()[1]}, DType::f32, a.backend(), "matmul");
    gemm_into(a2, b, out, 1);
    out = out.view_as(out_shape, contiguous_strides(out_shape), 0);
    if (any_requires_grad({&a, &b})) {
      Tensor keep_a = b.requires_grad() ? a.detach() : Tensor();
      Tensor keep_b = a.requires_grad() ? b.detach() : Tensor();
      bool b_col = column_major(b);
      record(out, "matmul", {&a, &b}, [keep_a, keep_b, b_col, k](const Tensor& g, const Node& n) {
        int64_t cols = g.shape().back();
        Tensor g2 = reshape(g, {-1, cols});
        Tensor ga, gb;
        if (n.needs(0)) ga = reshape(matmul(g2, transpose(keep_b, 0, 1)), [&] {
            Shape s = g.shape();
            s.back() = k;
            return s;
          }());
        if (n.needs(1)) {
          Tensor a2 = reshape(keep_a, {-1, k});
          gb = b_col ? transpose(matmul(transpose(g2, 0, 1), a2), 0, 1)
                                    : matmul(transpose(a2, 0, 1), g2);
        }
        return std::vector<Tensor>{ga, gb};
      });
    }
    return out;
  }

  HT_CHECK(a.dim() == b.dim() &&
               std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin()),
           "matmul: batch dimensions differ: ", to_string(a.shape()), " @ ",
           to_string(b.shape()), "; expected equal leading dimensions (or a 2-d right operand)");
  Shape out_shape = a.shape();
  out_shape.back() = b.shape().back();
  Tensor out = Tensor::empty(out_shape, DType::f32, a.backend(), "matmul");
  int64_t batch = 1;
  for (int64_t d = 0; d < a.dim() - 2; ++d) batch *= a.shape()[d];
  gemm_into(a, b, out, batch);
  if (any_requires_grad({&a, &b})) {
    Tensor keep_a = b.requires_grad() ? a.detach() : Tensor();
    Tensor keep_b = a.requires_grad() ? b.detach() : Tensor();
    bool b_col = column_major(b);
    record(out, "batched_matmul", {&a, &b}, [keep_a, keep_b, b_col](const Tensor& g, const Node& n) {
      Tensor ga, gb;
      if (n.needs(0)) ga = matmul(g, transpose(keep_b, -1, -2));
      if (n.needs(1))
        gb = b_col ? transpose(matmul(transpose(g, -1, -2), keep_a), -1, -2)
                 : matmul(transpose(keep_a, -1, -2), g);
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

}  // namespace ht
