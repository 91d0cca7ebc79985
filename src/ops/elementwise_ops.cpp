#include "ops/op_support.h"

namespace ht {

using detail::check_f32;

namespace {

Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  check_f32(a, name, "a");
  check_f32(b, name, "b");
  detail::check_same_backend(a, b, name);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, DType::f32, a.backend(), name);
  a.backend().binary(op, a.data(), broadcast_strides(a.shape(), a.strides(), shape), b.data(),
                     broadcast_strides(b.shape(), b.strides(), shape), out.data(), shape);
  return out;
}

Tensor unary_forward(UnaryOp op, const Tensor& x, float alpha, const char* name) {
  check_f32(x, name, "x");
  Tensor xc = contiguous(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, x.backend(), name);
  x.backend().unary(op, xc.data(), out.data(), out.numel(), alpha);
  return out;
}

// Records a unary op whose derivative the backend computes from the saved input
// and/or output (whichever the op needs; the other stays undefined and unsaved).
void record_unary(Tensor& out, const Tensor& x, UnaryOp op, float alpha, const char* name,
                  bool keep_input, bool keep_output) {
  Tensor saved_x = keep_input ? contiguous(x).detach() : Tensor();
  Tensor saved_y = keep_output ? out.detach() : Tensor();
  record(out, name, {&x}, [=](const Tensor& g, const Node&) {
    Tensor gc = contiguous(g);
    Tensor gx = Tensor::empty(gc.shape(), DType::f32, gc.backend(), name);
    gc.backend().unary_backward(op, saved_x.defined() ? saved_x.data() : nullptr,
                                saved_y.defined() ? saved_y.data() : nullptr, gc.data(),
                                gx.data(), gx.numel(), alpha);
    return std::vector<Tensor>{gx};
  });
}

Tensor unary_op(UnaryOp op, const Tensor& x, float alpha, const char* name, bool keep_input,
                bool keep_output) {
  Tensor out = unary_forward(op, x, alpha, name);
  if (any_requires_grad({&x})) record_unary(out, x, op, alpha, name, keep_input, keep_output);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::add, a, b, "add");
  if (any_requires_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    record(out, "add", {&a, &b}, [sa, sb](const Tensor& g, const Node& n) {
      return std::vector<Tensor>{n.needs(0) ? sum_to_shape(g, sa) : Tensor(),
                                 n.needs(1) ? sum_to_shape(g, sb) : Tensor()};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::sub, a, b, "sub");
  if (any_requires_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    record(out, "sub", {&a, &b}, [sa, sb](const Tensor& g, const Node& n) {
      return std::vector<Tensor>{n.needs(0) ? sum_to_shape(g, sa) : Tensor(),
                                 n.needs(1) ? sum_to_shape(neg(g), sb) : Tensor()};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::mul, a, b, "mul");
  if (any_requires_grad({&a, &b})) {
    // Each side's gradient needs the other side's values: keep only what is needed.
    Tensor keep_a = b.requires_grad() ? a.detach() : Tensor();
    Tensor keep_b = a.requires_grad() ? b.detach() : Tensor();
    Shape sa = a.shape(), sb = b.shape();
    record(out, "mul", {&a, &b}, [keep_a, keep_b, sa, sb](const Tensor& g, const Node& n) {
      return std::vector<Tensor>{n.needs(0) ? sum_to_shape(mul(g, keep_b), sa) : Tensor(),
                                 n.needs(1) ? sum_to_shape(mul(g, keep_a), sb) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::div, a, b, "div");
  if (any_requires_grad({&a, &b})) {
    // d(a/b)/db = -(a/b)/b: keep the output instead of a.
    Tensor keep_b = b.detach();
    Tensor keep_out = b.requires_grad() ? out.detach() : Tensor();
    Shape sa = a.shape(), sb = b.shape();
    record(out, "div", {&a, &b}, [keep_b, keep_out, sa, sb](const Tensor& g, const Node& n) {
      return std::vector<Tensor>{
          n.needs(0) ? sum_to_shape(div(g, keep_b), sa) : Tensor(),
          n.needs(1) ? sum_to_shape(neg(div(mul(g, keep_out), keep_b)), sb) : Tensor()};
    });
  }
  return out;
}

Tensor add(const Tensor& x, float s) {
  Tensor out = unary_forward(UnaryOp::add_scalar, x, s, "add_scalar");
  if (any_requires_grad({&x}))
    record(out, "add_scalar", {&x}, [](const Tensor& g, const Node&) {
      return std::vector<Tensor>{g};
    });
  return out;
}

Tensor sub(const Tensor& x, float s) { return add(x, -s); }

Tensor mul(const Tensor& x, float s) {
  Tensor out = unary_forward(UnaryOp::mul_scalar, x, s, "mul_scalar");
  if (any_requires_grad({&x}))
    record(out, "mul_scalar", {&x}, [s](const Tensor& g, const Node&) {
      return std::vector<Tensor>{mul(g, s)};
    });
  return out;
}

Tensor div(const Tensor& x, float s) {
  HT_CHECK(s != 0.f, "div: division of a tensor of shape ", to_string(x.shape()),
           " by the scalar 0; expected a nonzero divisor");
  return mul(x, 1.f / s);
}

Tensor pow(const Tensor& x, float e) { return unary_op(UnaryOp::pow_scalar, x, e, "pow", true, false); }
Tensor neg(const Tensor& x) { return mul(x, -1.f); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::exp, x, 0, "exp", false, true); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::log, x, 0, "log", true, false); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::sqrt, x, 0, "sqrt", false, true); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::tanh, x, 0, "tanh", false, true); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::relu, x, 0, "relu", false, true); }
Tensor gelu(const Tensor& x) { return unary_op(UnaryOp::gelu, x, 0, "gelu", true, false); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_f32(cond, "where", "cond");
  check_f32(a, "where", "a");
  check_f32(b, "where", "b");
  detail::check_same_backend(cond, a, "where");
  detail::check_same_backend(a, b, "where");
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(),
                                 "where");
  Tensor out = Tensor::empty(shape, DType::f32, a.backend(), "where");
  a.backend().where(cond.data(), broadcast_strides(cond.shape(), cond.strides(), shape),
                    a.data(), broadcast_strides(a.shape(), a.strides(), shape), b.data(),
                    broadcast_strides(b.shape(), b.strides(), shape), out.data(), shape);
  if (any_requires_grad({&a, &b})) {
    Tensor keep_cond = cond.detach();
    Shape sa = a.shape(), sb = b.shape();
    record(out, "where", {&a, &b}, [keep_cond, sa, sb](const Tensor& g, const Node& n) {
      Tensor zero = Tensor::zeros({}, g.backend());
      return std::vector<Tensor>{
          n.needs(0) ? sum_to_shape(where(keep_cond, g, zero), sa) : Tensor(),
          n.needs(1) ? sum_to_shape(where(keep_cond, zero, g), sb) : Tensor()};
    });
  }
  return out;
}

void add_(Tensor& acc, const Tensor& x) {
  check_f32(acc, "add_", "acc");
  check_f32(x, "add_", "x");
  detail::check_same_backend(acc, x, "add_");
  HT_CHECK(acc.is_contiguous(), "add_: the accumulator of shape ", to_string(acc.shape()),
           " is a strided view; expected a dense tensor");
  Shape shape = broadcast_shapes(acc.shape(), x.shape(), "add_");
  HT_CHECK(shape == acc.shape(), "add_: cannot accumulate shape ", to_string(x.shape()),
           " into ", to_string(acc.shape()), "; expected it to broadcast to the accumulator");
  acc.backend().binary(BinaryOp::add, acc.data(), acc.strides(), x.data(),
                       broadcast_strides(x.shape(), x.strides(), shape), acc.data(), shape);
}

}  // namespace ht
