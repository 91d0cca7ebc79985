// Shapes and strides (in elements) of n-d tensors, and the broadcasting rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
std::string to_string(const Shape& s);

// Normalises a possibly negative axis against `ndim`; `what` names the op for errors.
int64_t normalize_axis(int64_t axis, int64_t ndim, const char* what);

// NumPy broadcasting of two shapes; throws naming `what` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what);

// Strides that read a tensor of shape `s` with `strides` as if it had shape `target`
// (right-aligned; broadcast dimensions get stride 0). `s` must broadcast to `target`.
Strides broadcast_strides(const Shape& s, const Strides& strides, const Shape& target);

}  // namespace ht
