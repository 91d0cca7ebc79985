#include "core/shape.h"

#include "core/error.h"

namespace ht {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

std::string to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t normalize_axis(int64_t axis, int64_t ndim, const char* what) {
  HT_CHECK(axis >= -ndim && axis < ndim, what, ": axis ", axis,
           " is out of range for a tensor with ", ndim, " dimensions; expected -", ndim,
           " <= axis < ", ndim);
  return axis < 0 ? axis + ndim : axis;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    HT_CHECK(da == db || da == 1 || db == 1, what, ": shapes ", to_string(a), " and ",
             to_string(b), " do not broadcast (dimension ", i, ": ", da, " vs ", db,
             "); expected equal sizes or 1");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Strides broadcast_strides(const Shape& s, const Strides& strides, const Shape& target) {
  size_t n = target.size(), lead = n - s.size();
  Strides out(n, 0);
  for (size_t i = lead; i < n; ++i)
    out[i] = s[i - lead] == 1 && target[i] != 1 ? 0 : strides[i - lead];
  return out;
}

}  // namespace ht
