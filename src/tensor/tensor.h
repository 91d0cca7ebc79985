// n-d tensors: a shared Storage on one backend, viewed through shape, strides and an
// offset. Views (reshape, transpose, slice, expand, ...) share storage; ops that need
// dense input call contiguous(), which copies only when the view is not dense.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace ht {

struct Node;

struct Storage {
  Storage(Backend& backend, size_t bytes, const char* what);
  // `bytes` at `data` in memory that `keeper` keeps alive (shared memory, see
  // Tensor::move_to): the allocator neither counts nor frees them.
  Storage(Backend& backend, void* data, size_t bytes, std::shared_ptr<void> keeper);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Backend& backend;
  void* data;
  size_t bytes;
  std::shared_ptr<void> keeper;  // set for memory from outside the allocator
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;

  // autograd
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;       // set on op outputs
  std::shared_ptr<Node> grad_acc;      // leaves: accumulates into `grad`, made on first use
  std::shared_ptr<TensorImpl> grad;
  bool released = false;  // Tensor::release: the shape stays, the values are gone
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation. Every factory takes the backend the tensor lives on: there is no
  // default device (backend/registry.h has the run's device for the place a run starts).
  static Tensor empty(const Shape& shape, DType dtype, Backend& be, const char* what = "tensor");
  static Tensor zeros(const Shape& shape, Backend& be);
  static Tensor full(const Shape& shape, float value, Backend& be);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, Backend& be);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape, Backend& be);

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t axis) const;
  int64_t numel() const { return ht::numel(impl_->shape); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Backend& backend() const { return impl_->storage->backend; }
  bool is_contiguous() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }
  // Moves this tensor's values, in place for every handle of it, onto `device` (another
  // backend, or the same one) into a dense buffer of host staging (Allocator::HostStaging:
  // outside the device's cap and counts) or of the device's own memory; nothing happens
  // where they already are (views made before keep the old buffer). An accumulated
  // gradient moves with it. A model is built in host memory and each rank moves the
  // blocks it computes with onto its device.
  void rehome(Backend& device, bool host_staging) const;
  // Likewise into numel() elements at `at`, host memory that `keeper` keeps alive (and
  // the allocator does not count), copying the values there with `copy`, else taking
  // the values already there. Ranks of one host hand tensors over this way, mapping the
  // same shared memory (comm/shared_memory.h). CPU tensors only.
  void move_to(void* at, std::shared_ptr<void> keeper, bool copy) const;
  // Frees this tensor's values (and its gradient), in place for every handle of it; its
  // shape and dtype stay. A rank drops the weights of the blocks outside its pipeline
  // stage this way as the model is built (runtime/trainer.cpp): reading or writing them
  // afterwards is an error naming the shape, not a read of freed memory.
  void release() const;
  bool released() const { return impl_->released; }

  // Device pointers to the first element of this view.
  float* data() const;
  int32_t* data_i32() const;
  void* raw() const;  // either dtype, for dtype-agnostic copies
  // A fresh dense tensor holding this view's values, outside autograd (ops' clone() is
  // the recorded one).
  Tensor dense_copy() const;

  // A copy of this tensor's values on `device`, recorded for autograd: its backward
  // copies the gradient back to this tensor's device. On this tensor's own device it is
  // this tensor (no copy, the graph unchanged). Host to device and back go through the
  // device's copies from and to the host, GPU to GPU through the peer copy
  // (backend/registry.h). Defined in autograd/tensor_to.cpp, beside the other members
  // that record.
  Tensor to(Backend& device) const;

  // ---- host transfer (copies; works on any view)
  std::vector<float> to_vector() const;
  std::vector<int32_t> to_ints() const;
  float item() const;

  // ---- autograd
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool on = true);  // defined in autograd/graph.cpp, as backward()
  Tensor grad() const;               // undefined until a backward pass reaches this leaf
  void zero_grad() const;            // drops the accumulated gradient
  void set_grad(const Tensor& g) const;
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  Tensor detach() const;             // shares storage, no history
  // Both defined in autograd/graph.cpp, the library above this one that owns the sweep:
  // a caller that runs backward links autograd.
  void backward() const;             // from a one-element tensor
  void backward(const Tensor& grad_output) const;

  // A view of the same storage with new geometry (no autograd; ops build on this).
  Tensor view_as(const Shape& shape, const Strides& strides, int64_t offset) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace ht
