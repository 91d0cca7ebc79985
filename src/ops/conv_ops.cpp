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
  // The backend unfolds and multiplies (the CPU, in chunks of samples) or calls its own
  // convolution (cuDNN on a GPU).
  Backend& be = x.backend();
  Tensor xc = contiguous(x), wc = contiguous(weight);
  Tensor out = Tensor::empty({g.n, out_ch, g.out_h(), g.out_w()}, DType::f32, be, "conv2d");
  be.conv2d(xc.data(), wc.data(), out.data(), g, out_ch);
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
           [kx, kw, g, out_ch](const Tensor& gy_in, const Node& n) {
             Tensor gy = contiguous(gy_in);
             Backend& b = gy.backend();
             std::vector<Tensor> grads(3);
             if (n.needs(1)) {
               grads[1] = Tensor::empty(kw.shape(), DType::f32, b, "conv2d_backward");
               b.conv2d_backward_filter(kx.data(), gy.data(), grads[1].data(), g, out_ch);
             }
             if (n.needs(0)) {
               grads[0] = Tensor::empty(kx.shape(), DType::f32, b, "conv2d_backward");
               b.conv2d_backward_data(gy.data(), kw.data(), grads[0].data(), g, out_ch);
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
  // The CPU routes the gradient through the argmax it records; cuDNN's pooling has none
  // and finds each maximum again from the input and the output, which it then keeps.
  const bool by_argmax = be.maxpool2d_keeps_argmax();
  Tensor argmax = by_argmax ? Tensor::empty(shape, DType::i32, be, "maxpool2d") : Tensor();
  be.maxpool2d(xc.data(), out.data(), by_argmax ? argmax.data_i32() : nullptr, g);
  if (any_requires_grad({&x})) {
    Tensor kx = by_argmax ? Tensor() : xc.detach(), ky = by_argmax ? Tensor() : out.detach();
    record(out, "maxpool2d", {&x}, [argmax, kx, ky, g](const Tensor& gy_in, const Node&) {
      Tensor gy = contiguous(gy_in);
      Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, DType::f32, gy.backend(),
                                "maxpool2d_backward");
      gy.backend().maxpool2d_backward(kx.defined() ? kx.data() : nullptr,
                                      ky.defined() ? ky.data() : nullptr, gy.data(),
                                      argmax.defined() ? argmax.data_i32() : nullptr,
                                      gx.data(), g);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace ht
