#include "nn/block_shape.h"

#include "nn/block.h"

namespace ht::nn {

int64_t ModelShape::param_count() const {
  int64_t n = 0;
  for (const BlockShape& b : blocks) n += b.params;
  return n;
}

BlockShape shape_of(const Block& block) {
  return {block.kind(),
          block.param_count(),
          block.flops_per_sample(),
          block.activation_bytes_per_sample(),
          block.workspace_bytes_per_sample(),
          block.eval_bytes_per_sample(),
          block.eval_fused_bytes_per_sample(),
          block.sample_input_shape(),
          block.sample_output_shape(),
          block.input_dtype()};
}

ModelShape shape_of(const Sequential& model) {
  ModelShape m;
  m.blocks.reserve(model.size());
  for (const auto& b : model.blocks()) m.blocks.push_back(shape_of(*b));
  return m;
}

}  // namespace ht::nn
