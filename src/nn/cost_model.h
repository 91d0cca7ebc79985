// The cost convention every Block uses for flops_per_sample() and
// activation_bytes_per_sample(). The unit tests recompute these figures by hand from
// the rules below, so a change here is a change to the planner's inputs.
//
// FLOPs (forward only, one sample):
//   * matrix products and convolutions: 2 FLOPs per multiply-add, over the full
//     product the kernel computes (attention scores are counted for the whole T x T
//     matrix: the causal op computes it all and masks afterwards);
//   * elementwise ops: 1 FLOP per output value, whatever the op's internal cost
//     (bias add, ReLU, GELU, residual add, position add, attention scale, causal mask
//     select, dropout multiply); copies, views and embedding lookups are 0;
//   * max-pooling: k*k - 1 comparisons per output value;
//   * layernorm: 7 per value = 1 (sum for the mean) + 1 (subtract the mean) + 2 (square
//     and accumulate the variance, one multiply-add) + 1 (scale by 1/std) + 2 (gamma
//     multiply-add beta); per-row sqrt/reciprocal is ignored;
//   * softmax: 5 per value = max compare, subtract max, exp, sum, divide.
//
// Activation bytes (one sample): the distinct storage the ops' backward closures hold
// once forward returns, read from src/ops: matmul keeps its left operand when the
// right one needs a gradient, conv2d its (dense) input, relu its output, gelu its
// input, layernorm its input plus per-row mean and 1/std, softmax its output, maxpool
// an int32 argmax per output, embedding its int32 ids, dropout its float mask; bias
// and residual adds and scalar multiplies keep nothing. A tensor kept by two ops (the
// softmax output kept by softmax and by the following matmul; q, k, v as views of one
// qkv buffer) counts once. A block's own input counts when its ops keep it, so each
// block's figure is what it holds when run alone; two adjacent blocks that both keep
// their shared boundary tensor (ReLU output, next Linear's input) therefore count it
// twice when summed, an overestimate of at most one boundary tensor per block.
// Buffers whose size does not grow with the batch (the causal mask, T x T) are not
// per-sample and are left out.
//
// Workspace bytes (one sample): what a training step holds at once beyond the kept
// activations while the block runs, counted at its fullest moment, which is in its
// backward: the gradient arriving at its output, and the gradients its ops make on the
// way back while their inputs' are made (the output gradient of an op is held until the
// op's backward returns). Outputs the forward makes and does not keep are at most that.
// The planner adds the largest block's (times the micro-batch) to a stage's kept
// activations, and the loss's to the last block's (plan/block_costs.h); a unit test
// holds the sum against the allocator's measured peak of whole training steps.
//
// Evaluation bytes (one sample): what a forward without gradients holds at the block's
// fullest moment beyond its input (which its caller holds): its output and the op
// outputs alive beside it, a full expression's temporaries until it ends. The planner
// takes the largest block's, with its input and the batch, as rank 0's evaluation
// (plan/block_costs.h); a unit test holds it against the allocator's measured peak.
#pragma once

#include <cstdint>

namespace ht::nn::cost {

inline constexpr int64_t kFloatBytes = 4;
inline constexpr int64_t kIntBytes = 4;
inline constexpr int64_t kLayerNormFlopsPerValue = 7;
inline constexpr int64_t kSoftmaxFlopsPerValue = 5;

// (rows, in) @ (in, out), plus the bias add when there is one.
constexpr int64_t linear_flops(int64_t rows, int64_t in, int64_t out, bool bias) {
  return 2 * rows * in * out + (bias ? rows * out : 0);
}

// Parameter counts of the layers, as their constructors allocate them (PyTorch layouts).
constexpr int64_t linear_params(int64_t in, int64_t out, bool bias) {
  return in * out + (bias ? out : 0);
}
constexpr int64_t conv2d_params(int64_t in_channels, int64_t out_channels, int64_t kernel,
                                bool bias) {
  return out_channels * in_channels * kernel * kernel + (bias ? out_channels : 0);
}
constexpr int64_t layernorm_params(int64_t dim) { return 2 * dim; }  // gain and shift
constexpr int64_t embedding_params(int64_t count, int64_t dim) { return count * dim; }

// Per-sample bytes of a layernorm's saved state: input plus mean and 1/std per row.
constexpr int64_t layernorm_saved_bytes(int64_t rows, int64_t dim) {
  return (rows * dim + 2 * rows) * kFloatBytes;
}

}  // namespace ht::nn::cost
