#include <algorithm>

#include "ops/op_support.h"

namespace ht {

using detail::check_f32;

namespace {

Window2d window_of(const Tensor& x, int64_t kh, int64_t kw, int64_t stride, int64_t pad,
                   const char* op) {
  detail::check_rank(x, 4, op, "input");
  HT_CHECK(stride >= 1, op, ": stride ", stride, "; expected at least 1");
  HT_CHECK(pad >= 0, op, ": padding ", pad, "; expected 0 or more");
  Window2d g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], kh, kw, stride, pad};
  HT_CHECK(kh >= 1 && kw >= 1 && g.h + 2 * pad >= kh && g.w + 2 * pad >= kw, op, ": window ",
           kh, "x", kw, " does not fit input ", to_string(x.shape()), " with padding ", pad,
           "; expected a window no larger than the padded image");
  return g;
}

// gemm over the batch: C[i] = op(A[i]) @ op(B[i]) with per-operand batch strides.
void batched_gemm(Backend& be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  const float* a, int64_t sa, const float* b, int64_t sb, float* c, int64_t sc,
                  int64_t batch, float beta) {
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

// The columns of a convolution are unfolded a chunk of samples at a time, each chunk's
// columns within kColumnsBudget bytes (one sample at least): im2col's output is then
// still in this core's cache when the gemm reads it, and the scratch no longer grows with
// the batch. The CNN's second convolution unfolds 221 KiB a sample (14 MiB at 64
// samples); a training step of the CNN at 64 samples took 32.3 ms unfolding whole
// batches and 28.1 ms in chunks (medians of 6 interleaved runs of tools/bench-engine),
// with budgets from 256 KiB to 2 MiB alike, and its peak memory fell from 43 to 34 MiB.
constexpr int64_t kColumnsBudget = 512 << 10;

int64_t samples_per_chunk(const Window2d& g, int64_t cols_per_sample) {
  return std::clamp<int64_t>(kColumnsBudget / (cols_per_sample * 4), 1, std::max<int64_t>(g.n, 1));
}

// Samples [s, s + chunk) of g, clipped to the batch.
Window2d chunk_of(const Window2d& g, int64_t s, int64_t chunk) {
  Window2d part = g;
  part.n = std::min(chunk, g.n - s);
  return part;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride,
              int64_t padding) {
  check_f32(x, "conv2d", "input");
  check_f32(weight, "conv2d", "weight");
  detail::check_same_backend(x, weight, "conv2d");
  detail::check_rank(weight, 4, "conv2d", "weight");
  const Shape& ws = weight.shape();
  Window2d g = window_of(x, ws[2], ws[3], stride, padding, "conv2d");
  HT_CHECK(ws[1] == g.c, "conv2d: weight ", to_string(ws), " expects ", ws[1],
           " input channels but the input ", to_string(x.shape()), " has ", g.c);
  int64_t out_ch = ws[0];
  if (bias.defined()) {
    check_f32(bias, "conv2d", "bias");
    HT_CHECK(bias.shape() == Shape{out_ch}, "conv2d: bias ", to_string(bias.shape()),
             "; expected shape [", out_ch, "]");
  }
  int64_t oh = g.out_h(), ow = g.out_w(), ck = g.c * g.kh * g.kw, hw = oh * ow;
  Backend& be = x.backend();
  Tensor xc = contiguous(x), wc = contiguous(weight);
  Tensor out = Tensor::empty({g.n, out_ch, oh, ow}, DType::f32, be, "conv2d");
  const int64_t chunk = samples_per_chunk(g, ck * hw), in_size = g.c * g.h * g.w;
  {
    Tensor cols = Tensor::empty({chunk, ck, hw}, DType::f32, be, "conv2d");
    for (int64_t s = 0; s < g.n; s += chunk) {
      const Window2d part = chunk_of(g, s, chunk);
      be.im2col(xc.data() + s * in_size, cols.data(), part);
      batched_gemm(be, false, false, out_ch, hw, ck, wc.data(), 0, cols.data(), ck * hw,
                   out.data() + s * out_ch * hw, out_ch * hw, part.n, 0.f);
    }
  }
  if (bias.defined()) {
    Tensor bc = contiguous(bias);
    be.binary(BinaryOp::add, out.data(), out.strides(), bc.data(), {0, 1, 0, 0}, out.data(),
              out.shape());
  }
  if (any_requires_grad({&x, &weight, &bias})) {
    // Keep the input, not its columns: they are kh*kw times larger, and rebuilding
    // them in backward costs one pass over memory.
    Tensor kx = xc.detach(), kw = wc.detach();
    record(out, "conv2d", {&x, &weight, &bias},
           [kx, kw, g, out_ch, ck, hw, chunk, in_size](const Tensor& gy_in, const Node& n) {
             Tensor gy = contiguous(gy_in);
             Backend& b = gy.backend();
             std::vector<Tensor> grads(3);
             Tensor cols, gcols;
             if (n.needs(1)) {
               cols = Tensor::empty({chunk, ck, hw}, DType::f32, b, "conv2d_backward");
               grads[1] = Tensor::empty(kw.shape(), DType::f32, b, "conv2d_backward");
             }
             if (n.needs(0)) {
               gcols = Tensor::empty({chunk, ck, hw}, DType::f32, b, "conv2d_backward");
               grads[0] = Tensor::zeros(kx.shape(), b);
             }
             for (int64_t s = 0; s < g.n && (cols.defined() || gcols.defined()); s += chunk) {
               const Window2d part = chunk_of(g, s, chunk);
               const float* gys = gy.data() + s * out_ch * hw;
               if (cols.defined()) {  // gw = sum over samples of gy_i cols_i^T
                 b.im2col(kx.data() + s * in_size, cols.data(), part);
                 for (int64_t i = 0; i < part.n; ++i)
                   batched_gemm(b, false, true, out_ch, ck, hw, gys + i * out_ch * hw, 0,
                                cols.data() + i * ck * hw, 0, grads[1].data(), 0, 1,
                                s + i == 0 ? 0.f : 1.f);
               }
               if (gcols.defined()) {
                 batched_gemm(b, true, false, ck, hw, out_ch, kw.data(), 0, gys, out_ch * hw,
                              gcols.data(), ck * hw, part.n, 0.f);
                 b.col2im(gcols.data(), grads[0].data() + s * in_size, part);
               }
             }
             if (n.needs(2)) grads[2] = sum(gy, {0, 2, 3});
             return grads;
           });
  }
  return out;
}

Tensor maxpool2d(const Tensor& x, int64_t kernel, int64_t stride) {
  check_f32(x, "maxpool2d", "input");
  Window2d g = window_of(x, kernel, kernel, stride, 0, "maxpool2d");
  Backend& be = x.backend();
  Tensor xc = contiguous(x);
  Shape shape{g.n, g.c, g.out_h(), g.out_w()};
  Tensor out = Tensor::empty(shape, DType::f32, be, "maxpool2d");
  Tensor argmax = Tensor::empty(shape, DType::i32, be, "maxpool2d");
  be.maxpool2d(xc.data(), out.data(), argmax.data_i32(), g);
  if (any_requires_grad({&x})) {
    Shape in_shape = x.shape();
    record(out, "maxpool2d", {&x}, [argmax, in_shape, g](const Tensor& gy_in, const Node&) {
      Tensor gy = contiguous(gy_in);
      Tensor gx = Tensor::empty(in_shape, DType::f32, gy.backend(), "maxpool2d_backward");
      gy.backend().maxpool2d_backward(gy.data(), argmax.data_i32(), gx.data(), g);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace ht
