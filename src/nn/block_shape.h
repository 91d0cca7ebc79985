// What the planner needs to know of a Block, without the Block: its parameters, forward
// FLOPs and kept activation bytes per sample, and the shapes it takes and hands on.
// Each Block type computes these with a static describe(hyper-parameters) that its own
// cost methods return too, so a model can be described from its config alone (no weight
// allocated, no data read) and the description cannot drift from the built Blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "nn/cost_model.h"

namespace ht::nn {

class Block;
class Sequential;

struct BlockShape {
  std::string kind;                         // Block::kind()
  int64_t params = 0;                       // parameter count
  int64_t flops_per_sample = 0;             // forward, the cost_model.h convention
  int64_t activation_bytes_per_sample = 0;  // what backward keeps, cost_model.h
  int64_t workspace_bytes_per_sample = 0;   // transients beyond it, cost_model.h
  int64_t eval_bytes_per_sample = 0;        // a no-grad forward's fullest moment, cost_model.h
  int64_t eval_fused_bytes_per_sample = 0;  // the same with a fused attention kernel (a GPU's)
  Shape sample_input_shape;                 // without the batch dimension
  Shape sample_output_shape;
  DType input_dtype = DType::f32;

  int64_t param_bytes() const { return params * cost::kFloatBytes; }  // fp32 weights
  bool operator==(const BlockShape&) const = default;
};

// A model as the planner sees it: its Blocks' shapes in order.
struct ModelShape {
  std::vector<BlockShape> blocks;

  size_t size() const { return blocks.size(); }
  int64_t param_count() const;
  bool operator==(const ModelShape&) const = default;
};

// The figures of a built Block or model, its parameters counted from its tensors: what
// a description from hyper-parameters must equal.
BlockShape shape_of(const Block& block);
ModelShape shape_of(const Sequential& model);

}  // namespace ht::nn
