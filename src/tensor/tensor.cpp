#include "tensor/tensor.h"

#include <optional>

#include "backend/registry.h"
#include "core/error.h"

namespace ht {

Storage::Storage(Backend& be, size_t n, const char* what)
    : backend(be), data(be.allocator().allocate(n, what)), bytes(n) {}

Storage::Storage(Backend& be, void* at, size_t n, std::shared_ptr<void> keep)
    : backend(be), data(at), bytes(n), keeper(std::move(keep)) {}

Storage::~Storage() {
  if (!keeper) backend.allocator().deallocate(data, bytes);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Backend& be, const char* what) {
  for (int64_t d : shape)
    HT_CHECK(d >= 0, what, ": shape ", to_string(shape), " has a negative dimension");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(be, ht::numel(shape) * dtype_size(dtype), what);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, Backend& be) { return full(shape, 0.f, be); }

Tensor Tensor::full(const Shape& shape, float value, Backend& be) {
  Tensor t = empty(shape, DType::f32, be);
  be.fill(t.data(), value, t.numel());
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Backend& be) {
  HT_CHECK(static_cast<int64_t>(values.size()) == ht::numel(shape), "from_vector: ",
           values.size(), " values cannot fill shape ", to_string(shape), "; expected ",
           ht::numel(shape));
  Tensor t = empty(shape, DType::f32, be);
  be.copy_from_host(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape, Backend& be) {
  HT_CHECK(static_cast<int64_t>(values.size()) == ht::numel(shape), "from_ints: ",
           values.size(), " values cannot fill shape ", to_string(shape), "; expected ",
           ht::numel(shape));
  Tensor t = empty(shape, DType::i32, be);
  be.copy_from_host(t.data_i32(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

int64_t Tensor::size(int64_t axis) const {
  return impl_->shape[normalize_axis(axis, dim(), "size")];
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expect) return false;
    expect *= impl_->shape[i];
  }
  return true;
}

namespace {

void check_not_released(const TensorImpl& t) {
  HT_CHECK(!t.released, "a tensor of shape ", to_string(t.shape),
           " was released (a weight of a block outside this rank's stage, which it does not keep)");
}

}  // namespace

float* Tensor::data() const {
  HT_CHECK(impl_->dtype == DType::f32, "data(): tensor of shape ", to_string(shape()), " is ",
           dtype_name(dtype()), "; expected float32");
  check_not_released(*impl_);
  return static_cast<float*>(impl_->storage->data) + impl_->offset;
}

int32_t* Tensor::data_i32() const {
  HT_CHECK(impl_->dtype == DType::i32, "data_i32(): tensor of shape ", to_string(shape()),
           " is ", dtype_name(dtype()), "; expected int32");
  check_not_released(*impl_);
  return static_cast<int32_t*>(impl_->storage->data) + impl_->offset;
}

void Tensor::release() const {
  // Memory of no allocator's (a keeper of nothing), so that nothing frees it again.
  impl_->storage = std::make_shared<Storage>(backend(), nullptr, 0, std::make_shared<int>(0));
  impl_->strides = contiguous_strides(impl_->shape);
  impl_->offset = 0;
  impl_->grad.reset();
  impl_->released = true;
}

void Tensor::rehome(Backend& device, bool host_staging) const {
  if (&device == &backend() && backend().allocator().staged(impl_->storage->data) == host_staging)
    return;
  Tensor moved;
  {
    std::optional<Allocator::HostStaging> staging;
    if (host_staging) staging.emplace();
    moved = empty(shape(), dtype(), device, "parameter");
  }
  if (&device == &backend()) {
    backend().copy(raw(), strides(), moved.raw(), moved.strides(), shape());
  } else {
    const Tensor dense = is_contiguous() ? *this : dense_copy();
    copy_between(device, moved.raw(), backend(), dense.raw(),
                 static_cast<size_t>(numel()) * dtype_size(dtype()));
  }
  impl_->storage = moved.impl_->storage;
  impl_->strides = moved.impl_->strides;
  impl_->offset = 0;
  if (impl_->grad) Tensor(impl_->grad).rehome(device, host_staging);
}

void* Tensor::raw() const {
  check_not_released(*impl_);
  return static_cast<char*>(impl_->storage->data) + impl_->offset * dtype_size(impl_->dtype);
}

Tensor Tensor::dense_copy() const {
  Tensor out = empty(shape(), dtype(), backend(), "copy");
  backend().copy(raw(), strides(), out.raw(), out.strides(), shape());
  return out;
}

std::vector<float> Tensor::to_vector() const {
  Tensor c = is_contiguous() ? *this : dense_copy();
  std::vector<float> out(c.numel());
  backend().copy_to_host(out.data(), c.data(), out.size() * sizeof(float));
  return out;
}

std::vector<int32_t> Tensor::to_ints() const {
  HT_CHECK(dtype() == DType::i32, "to_ints(): tensor is ", dtype_name(dtype()),
           "; expected int32");
  Tensor c = is_contiguous() ? *this : dense_copy();
  std::vector<int32_t> out(c.numel());
  backend().copy_to_host(out.data(), c.data_i32(), out.size() * sizeof(int32_t));
  return out;
}

float Tensor::item() const {
  HT_CHECK(numel() == 1, "item(): tensor of shape ", to_string(shape()),
           " has ", numel(), " elements; expected exactly 1");
  return to_vector()[0];
}

Tensor Tensor::grad() const { return impl_->grad ? Tensor(impl_->grad) : Tensor(); }

void Tensor::zero_grad() const { impl_->grad.reset(); }

void Tensor::set_grad(const Tensor& g) const {
  HT_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient shape ",
           to_string(g.shape()), " does not match tensor shape ", to_string(shape()));
  impl_->grad = g.defined() ? g.impl_ptr() : nullptr;
}

void Tensor::move_to(void* at, std::shared_ptr<void> keeper, bool copy) const {
  HT_CHECK(backend().kind() == DeviceKind::cpu, "move_to: the tensor of shape ", to_string(shape()),
           " is on ", backend().name(), "; expected one in host memory");
  HT_CHECK(at != nullptr && keeper != nullptr, "move_to: no memory to move the tensor of shape ",
           to_string(shape()), " into");
  auto moved = std::make_shared<Storage>(backend(), at, static_cast<size_t>(numel()) * dtype_size(dtype()),
                                         std::move(keeper));
  if (copy) backend().copy(raw(), strides(), at, contiguous_strides(shape()), shape());
  impl_->storage = std::move(moved);
  impl_->strides = contiguous_strides(shape());
  impl_->offset = 0;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::view_as(const Shape& shape, const Strides& strides, int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

}  // namespace ht
