#include "nn/dense_block.h"

#include "nn/block_input.h"
#include "nn/cost_model.h"
#include "ops/ops.h"

namespace ht::nn {

DenseBlock::DenseBlock(Shape in_shape, int64_t out_features, bool relu, bool flatten, Rng& rng)
    : shape_(describe(in_shape, out_features, relu)),
      relu_(relu),
      flatten_(flatten),
      linear_(numel(in_shape), out_features, true, Init::torch_default, rng) {}

Tensor DenseBlock::forward(const Tensor& x) {
  int64_t in = linear_.in_features();
  if (flatten_) {
    bool ok = x.defined() && x.dim() >= 2 && x.shape()[0] >= 1 && x.numel() == x.shape()[0] * in;
    check_block_input(*this, x, ok,
                      batched_shape_text(shape_.sample_input_shape) + " or any (B, ...) with " +
                          std::to_string(in) + " values per sample");
  } else {
    check_block_input(*this, x);
  }
  Tensor flat = x.dim() == 2 ? x : reshape(x, {x.shape()[0], in});  // (B, in), a view if dense
  Tensor y = linear_.forward(flat);                                 // (B, out)
  return relu_ ? relu(y) : y;
}

// FLOPs: 2*in*out (multiply-adds) + out (bias) [+ out (ReLU)].
// Kept: matmul's input (in floats; the block input itself, or its flattened copy
// when it was not dense) and, with ReLU, the ReLU output (out floats). The bias add's
// output is not kept: ReLU keeps its output, not its input.
BlockShape DenseBlock::describe(const Shape& in_shape, int64_t out_features, bool relu) {
  const int64_t in = numel(in_shape), out = out_features;
  BlockShape s;
  s.kind = relu ? "dense_relu" : "dense";
  s.params = cost::linear_params(in, out, true);
  s.flops_per_sample = cost::linear_flops(1, in, out, true) + (relu ? out : 0);
  s.activation_bytes_per_sample = (in + (relu ? out : 0)) * cost::kFloatBytes;
  // Backward: the output's gradient (out), ReLU's input gradient (out) and the matmul's
  // input gradient (in).
  s.workspace_bytes_per_sample = ((relu ? 2 * out : out) + in) * cost::kFloatBytes;
  // Evaluation: the product beside the bias add's output; with ReLU, that beside ReLU's.
  s.eval_bytes_per_sample = 2 * out * cost::kFloatBytes;
  s.eval_fused_bytes_per_sample = s.eval_bytes_per_sample;
  s.sample_input_shape = in_shape;
  s.sample_output_shape = {out};
  return s;
}

std::vector<NamedTensor> DenseBlock::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "linear", linear_.named_parameters());
  return out;
}

}  // namespace ht::nn
