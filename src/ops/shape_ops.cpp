#include <numeric>

#include "ops/op_support.h"

namespace ht {

using detail::check_f32;

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.backend(), "clone");
  x.backend().copy(x.raw(), x.strides(), out.raw(), out.strides(), x.shape());
  if (any_requires_grad({&x}))
    record(out, "clone", {&x}, [](const Tensor& g, const Node&) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor reshape(const Tensor& x, Shape shape) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      HT_CHECK(infer < 0, "reshape: more than one -1 in target shape ", to_string(shape));
      infer = static_cast<int64_t>(i);
    } else {
      HT_CHECK(shape[i] >= 0, "reshape: negative size in target shape ", to_string(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    HT_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 in ",
             to_string(shape), " for ", x.numel(), " elements of shape ", to_string(x.shape()));
    shape[infer] = x.numel() / known;
  }
  HT_CHECK(numel(shape) == x.numel(), "reshape: shape ", to_string(x.shape()), " (", x.numel(),
           " elements) cannot become ", to_string(shape), " (", numel(shape), " elements)");
  Tensor base = contiguous(x).detach();
  Tensor out = base.view_as(shape, contiguous_strides(shape), base.offset());
  if (any_requires_grad({&x})) {
    Shape in_shape = x.shape();
    record(out, "reshape", {&x}, [in_shape](const Tensor& g, const Node&) {
      return std::vector<Tensor>{reshape(g, in_shape)};
    });
  }
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& order) {
  int64_t n = x.dim();
  HT_CHECK(static_cast<int64_t>(order.size()) == n, "permute: order has ", order.size(),
           " axes for a tensor of shape ", to_string(x.shape()), "; expected ", n);
  std::vector<int64_t> inverse(n, -1);
  Shape shape(n);
  Strides strides(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t a = normalize_axis(order[i], n, "permute");
    HT_CHECK(inverse[a] < 0, "permute: axis ", a, " appears twice in the order");
    inverse[a] = i;
    shape[i] = x.shape()[a];
    strides[i] = x.strides()[a];
  }
  Tensor out = x.view_as(shape, strides, x.offset());
  if (any_requires_grad({&x}))
    record(out, "permute", {&x}, [inverse](const Tensor& g, const Node&) {
      return std::vector<Tensor>{permute(g, inverse)};
    });
  return out;
}

Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1) {
  std::vector<int64_t> order(x.dim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[normalize_axis(axis0, x.dim(), "transpose")],
            order[normalize_axis(axis1, x.dim(), "transpose")]);
  return permute(x, order);
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end) {
  int64_t a = normalize_axis(axis, x.dim(), "slice");
  int64_t len = x.shape()[a];
  HT_CHECK(0 <= start && start <= end && end <= len, "slice: range [", start, ", ", end,
           ") on axis ", a, " of shape ", to_string(x.shape()), "; expected 0 <= start <= end <= ",
           len);
  Shape shape = x.shape();
  shape[a] = end - start;
  Tensor out = x.view_as(shape, x.strides(), x.offset() + start * x.strides()[a]);
  if (any_requires_grad({&x})) {
    Shape in_shape = x.shape();
    record(out, "slice", {&x}, [in_shape, a, start, end](const Tensor& g, const Node&) {
      Tensor gx = Tensor::zeros(in_shape, g.backend());
      Tensor dst = slice(gx, a, start, end);
      g.backend().copy(g.raw(), g.strides(), dst.raw(), dst.strides(), g.shape());
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  HT_CHECK(shape.size() >= x.shape().size(), "expand: cannot expand shape ",
           to_string(x.shape()), " to fewer dimensions ", to_string(shape));
  size_t lead = shape.size() - x.shape().size();
  for (size_t i = 0; i < x.shape().size(); ++i)
    HT_CHECK(x.shape()[i] == shape[lead + i] || x.shape()[i] == 1, "expand: shape ",
             to_string(x.shape()), " cannot expand to ", to_string(shape),
             "; expected each dimension to match or be 1");
  Tensor out = x.view_as(shape, broadcast_strides(x.shape(), x.strides(), shape), x.offset());
  if (any_requires_grad({&x})) {
    Shape in_shape = x.shape();
    record(out, "expand", {&x}, [in_shape](const Tensor& g, const Node&) {
      return std::vector<Tensor>{sum_to_shape(g, in_shape)};
    });
  }
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  HT_CHECK(!xs.empty(), "concat: no tensors given; expected at least one");
  int64_t a = normalize_axis(axis, xs[0].dim(), "concat");
  Shape shape = xs[0].shape();
  shape[a] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    check_f32(xs[i], "concat", "input");
    detail::check_same_backend(xs[0], xs[i], "concat");
    bool ok = xs[i].dim() == xs[0].dim();
    for (int64_t d = 0; ok && d < xs[0].dim(); ++d)
      ok = d == a || xs[i].shape()[d] == xs[0].shape()[d];
    HT_CHECK(ok, "concat: input ", i, " has shape ", to_string(xs[i].shape()),
             ", incompatible with ", to_string(xs[0].shape()), " along axis ", a,
             "; expected equal sizes on every other axis");
    shape[a] += xs[i].shape()[a];
  }
  Tensor out = Tensor::empty(shape, DType::f32, xs[0].backend(), "concat");
  std::vector<int64_t> bounds{0};
  for (const Tensor& x : xs) {
    int64_t start = bounds.back(), end = start + x.shape()[a];
    Tensor dst = out.view_as(x.shape(), out.strides(), start * out.strides()[a]);
    x.backend().copy(x.raw(), x.strides(), dst.raw(), dst.strides(), x.shape());
    bounds.push_back(end);
  }
  bool needs = false;
  for (const Tensor& x : xs) needs = needs || any_requires_grad({&x});
  if (needs) {
    std::vector<const Tensor*> ptrs;
    for (const Tensor& x : xs) ptrs.push_back(&x);
    record(out, "concat", ptrs, [bounds, a](const Tensor& g, const Node&) {
      std::vector<Tensor> grads;
      for (size_t i = 0; i + 1 < bounds.size(); ++i)
        grads.push_back(slice(g, a, bounds[i], bounds[i + 1]));
      return grads;
    });
  }
  return out;
}

}  // namespace ht
