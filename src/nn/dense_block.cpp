#include "nn/dense_block.h"

#include "nn/block_input.h"
#include "nn/cost_model.h"
#include "ops/ops.h"

namespace ht::nn {

DenseBlock::DenseBlock(Shape in_shape, int64_t out_features, bool relu, bool flatten, Rng& rng)
    : in_shape_(std::move(in_shape)),
      relu_(relu),
      flatten_(flatten),
      linear_(numel(in_shape_), out_features, true, Init::torch_default, rng) {}

Tensor DenseBlock::forward(const Tensor& x) {
  int64_t in = linear_.in_features();
  if (flatten_) {
    bool ok = x.defined() && x.dim() >= 2 && x.shape()[0] >= 1 && x.numel() == x.shape()[0] * in;
    check_block_input(*this, x, ok,
                      batched_shape_text(in_shape_) + " or any (B, ...) with " +
                          std::to_string(in) + " values per sample");
  } else {
    check_block_input(*this, x);
  }
  Tensor flat = x.dim() == 2 ? x : reshape(x, {x.shape()[0], in});  // (B, in), a view if dense
  Tensor y = linear_.forward(flat);                                 // (B, out)
  return relu_ ? relu(y) : y;
}

// FLOPs: 2*in*out (multiply-adds) + out (bias) [+ out (ReLU)].
int64_t DenseBlock::flops_per_sample() const {
  int64_t out = linear_.out_features();
  return cost::linear_flops(1, linear_.in_features(), out, true) + (relu_ ? out : 0);
}

// Kept: matmul's input (in floats; the block input itself, or its flattened copy
// when it was not dense) and, with ReLU, the ReLU output (out floats). The bias add's
// output is not kept: ReLU keeps its output, not its input.
int64_t DenseBlock::activation_bytes_per_sample() const {
  int64_t out = linear_.out_features();
  return (linear_.in_features() + (relu_ ? out : 0)) * cost::kFloatBytes;
}

std::vector<NamedTensor> DenseBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "linear", linear_.named_parameters());
  return out;
}

}  // namespace ht::nn
