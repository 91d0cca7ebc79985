#include <algorithm>

#include "ops/op_support.h"

namespace ht {

using detail::check_f32;

namespace {

std::vector<int64_t> normalized_axes(const Tensor& x, const std::vector<int64_t>& axes,
                                     const char* op) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    for (int64_t i = 0; i < x.dim(); ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(a, x.dim(), op));
  std::sort(out.begin(), out.end());
  HT_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op,
           ": an axis is repeated in the reduction axes of shape ", to_string(x.shape()));
  return out;
}

Shape keepdim_shape(const Shape& s, const std::vector<int64_t>& axes) {
  Shape out = s;
  for (int64_t a : axes) out[a] = 1;
  return out;
}

Shape dropped_shape(const Shape& s, const std::vector<int64_t>& axes) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) out.push_back(s[i]);
  return out;
}

// Sum over `axes` (sorted) of a dense tensor, keeping reduced dimensions as 1. Runs
// of adjacent axes collapse into one (outer, n, inner) pass.
Tensor sum_raw(Tensor t, const std::vector<int64_t>& axes) {
  Backend& be = t.backend();
  size_t i = axes.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && axes[j - 1] == axes[j] - 1) --j;
    int64_t first = axes[j], last = axes[i - 1];
    const Shape& s = t.shape();
    int64_t outer = 1, n = 1, inner = 1;
    for (int64_t d = 0; d < first; ++d) outer *= s[d];
    for (int64_t d = first; d <= last; ++d) n *= s[d];
    for (int64_t d = last + 1; d < static_cast<int64_t>(s.size()); ++d) inner *= s[d];
    Shape out_shape = s;
    for (int64_t d = first; d <= last; ++d) out_shape[d] = 1;
    Tensor out = Tensor::empty(out_shape, DType::f32, be, "sum");
    be.reduce(ReduceOp::sum, t.data(), out.data(), nullptr, outer, n, inner);
    t = out;
    i = j;
  }
  return t;
}

// Max over one axis of a dense tensor, keeping it as 1.
Tensor max_axis(const Tensor& x, int64_t axis) {
  Tensor xc = contiguous(x);
  const Shape& s = xc.shape();
  HT_CHECK(s[axis] > 0, "max: axis ", axis, " of shape ", to_string(s),
           " is empty; expected at least one element to take the maximum of");
  int64_t outer = 1, inner = 1, n = s[axis];
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (int64_t d = axis + 1; d < static_cast<int64_t>(s.size()); ++d) inner *= s[d];
  Shape out_shape = s;
  out_shape[axis] = 1;
  Backend& be = xc.backend();
  Tensor out = Tensor::empty(out_shape, DType::f32, be, "max");
  Tensor argmax = Tensor::empty(out_shape, DType::i32, be, "max");
  be.reduce(ReduceOp::max, xc.data(), out.data(), argmax.data_i32(), outer, n, inner);
  if (any_requires_grad({&x})) {
    Shape in_shape = s;
    record(out, "max", {&x}, [argmax, in_shape, outer, n, inner](const Tensor& g, const Node&) {
      Tensor gc = contiguous(g);
      Tensor gx = Tensor::empty(in_shape, DType::f32, gc.backend(), "max_backward");
      gc.backend().max_backward(gc.data(), argmax.data_i32(), gx.data(), outer, n, inner);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  check_f32(x, "sum", "x");
  std::vector<int64_t> ax = normalized_axes(x, axes, "sum");
  Tensor out = sum_raw(contiguous(x), ax).detach();
  if (!keepdim) {
    Shape dropped = dropped_shape(x.shape(), ax);
    out = out.view_as(dropped, contiguous_strides(dropped), out.offset());
  }
  if (any_requires_grad({&x})) {
    Shape in_shape = x.shape(), kept = keepdim_shape(x.shape(), ax);
    record(out, "sum", {&x}, [in_shape, kept](const Tensor& g, const Node&) {
      return std::vector<Tensor>{expand(reshape(g, kept), in_shape)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  check_f32(x, "mean", "x");
  std::vector<int64_t> ax = normalized_axes(x, axes, "mean");
  int64_t count = 1;
  for (int64_t a : ax) count *= x.shape()[a];
  HT_CHECK(count > 0, "mean: reducing ", to_string(x.shape()),
           " over empty axes; expected at least one element");
  return mul(sum(x, ax, keepdim), 1.f / static_cast<float>(count));
}

Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  check_f32(x, "max", "x");
  std::vector<int64_t> ax = normalized_axes(x, axes, "max");
  Tensor out = x;
  for (size_t i = ax.size(); i-- > 0;) out = max_axis(out, ax[i]);
  return keepdim ? out : reshape(out, dropped_shape(x.shape(), ax));
}

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  size_t lead = g.shape().size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < g.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1))
      axes.push_back(static_cast<int64_t>(i));
  return reshape(sum(g, axes, true), shape);
}

}  // namespace ht
