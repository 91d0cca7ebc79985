// Tensor::to: a device copy recorded for autograd. It lives here, above the tensor
// library, because it records a Node (as set_requires_grad and backward in graph.cpp).
#include "autograd/graph.h"
#include "backend/registry.h"
#include "core/error.h"

namespace ht {

Tensor Tensor::to(Backend& device) const {
  HT_CHECK(defined(), "to(", device.name(), "): the tensor is undefined");
  Backend& home = backend();
  if (&device == &home) return *this;
  const Tensor dense = is_contiguous() ? *this : dense_copy();
  Tensor out = empty(shape(), dtype(), device, "to");
  copy_between(device, out.raw(), home, dense.raw(),
               static_cast<size_t>(numel()) * dtype_size(dtype()));
  if (any_requires_grad({this}))
    record(out, "to", {this}, [&home](const Tensor& g, const Node&) {
      return std::vector<Tensor>{g.to(home)};
    });
  return out;
}

}  // namespace ht
