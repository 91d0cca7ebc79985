#include "autograd/graph.h"
#include "backend/registry.h"
#include "core/error.h"
#include "nn/block.h"

namespace ht::nn {

namespace {

thread_local const std::function<bool(size_t)>* t_keep = nullptr;

}  // namespace

Sequential::KeepOnly::KeepOnly(std::function<bool(size_t)> keep) : keep_(std::move(keep)), outer_(t_keep) {
  t_keep = &keep_;
}

Sequential::KeepOnly::~KeepOnly() { t_keep = outer_; }

void Sequential::add(std::unique_ptr<Block> block) {
  if (t_keep && !(*t_keep)(blocks_.size()))
    for (const auto& [name, p] : block->named_parameters()) p.release();
  blocks_.push_back(std::move(block));
}

Tensor Sequential::forward(const Tensor& x) const { return forward_range(x, 0, blocks_.size()); }

Tensor Sequential::forward_range(const Tensor& x, size_t begin, size_t end) const {
  HT_CHECK(begin <= end && end <= blocks_.size(), "Sequential: block range [", begin, ", ", end,
           ") is outside the model's ", blocks_.size(), " blocks");
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) h = stream_to_ ? forward_streamed(i, h) : blocks_[i]->forward(h);
  return h;
}

namespace {

// A parameter's own storage, put back when the block's forward is done (or has thrown).
struct Lent {
  TensorImpl* impl;
  std::shared_ptr<Storage> storage;
  Strides strides;
  int64_t offset;
};

class Restore {
 public:
  ~Restore() {
    for (Lent& l : lent) {
      l.impl->storage = std::move(l.storage);
      l.impl->strides = std::move(l.strides);
      l.impl->offset = l.offset;
    }
  }
  std::vector<Lent> lent;
};

}  // namespace

Tensor Sequential::forward_streamed(size_t block, const Tensor& h) const {
  HT_CHECK(!grad_enabled(), "Sequential: weights streamed to ", stream_to_->name(),
           " for a forward with autograd on; expected an evaluation (a graph would hold the copies)");
  Restore restore;
  for (const auto& [name, p] : blocks_[block]->named_parameters()) {
    if (&p.backend() == stream_to_) continue;
    const Tensor dense = p.is_contiguous() ? p : p.dense_copy();
    const Tensor copy = Tensor::empty(p.shape(), p.dtype(), *stream_to_, "streamed parameter");
    copy_between(*stream_to_, copy.raw(), p.backend(), dense.raw(), static_cast<size_t>(p.numel()) * dtype_size(p.dtype()));
    TensorImpl* impl = p.impl();
    restore.lent.push_back({impl, impl->storage, impl->strides, impl->offset});
    impl->storage = copy.impl()->storage;
    impl->strides = copy.strides();
    impl->offset = 0;
  }
  return blocks_[block]->forward(h);
}

std::vector<NamedTensor> Sequential::named_parameters() const {
  return named_parameters(0, blocks_.size());
}

std::vector<NamedTensor> Sequential::named_parameters(size_t begin, size_t end) const {
  HT_CHECK(begin <= end && end <= blocks_.size(), "Sequential: block range [", begin, ", ", end,
           ") is outside the model's ", blocks_.size(), " blocks");
  std::vector<NamedTensor> out;
  for (size_t i = begin; i < end; ++i)
    append(out, "blocks." + std::to_string(i), blocks_[i]->named_parameters());
  return out;
}

void Sequential::set_training(bool on) {
  Module::set_training(on);
  for (auto& b : blocks_) b->set_training(on);
}

}  // namespace ht::nn
