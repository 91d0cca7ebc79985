#include "core/error.h"
#include "nn/block.h"

namespace ht::nn {

Tensor Sequential::forward(const Tensor& x) const { return forward_range(x, 0, blocks_.size()); }

Tensor Sequential::forward_range(const Tensor& x, size_t begin, size_t end) const {
  HT_CHECK(begin <= end && end <= blocks_.size(), "Sequential: block range [", begin, ", ", end,
           ") is outside the model's ", blocks_.size(), " blocks");
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) h = blocks_[i]->forward(h);
  return h;
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
