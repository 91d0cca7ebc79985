// Differentiable tensor ops. Each op checks its inputs (errors name the op, the shapes
// or values, and what was expected), computes through the inputs' backend, and, when a
// gradient is needed, records its backward beside its forward in the same file.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace ht {

// ---- views and copies (shape_ops.cpp)
Tensor reshape(const Tensor& x, Shape shape);  // one dimension may be -1; copies only if needed
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& order);
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end);  // [start, end)
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast view, no copy
Tensor contiguous(const Tensor& x);                  // x itself when already dense
Tensor clone(const Tensor& x);                       // always a fresh dense copy
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);

// ---- elementwise (elementwise_ops.cpp); binary ops broadcast NumPy-style
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& x, float s);
Tensor sub(const Tensor& x, float s);
Tensor mul(const Tensor& x, float s);
Tensor div(const Tensor& x, float s);
Tensor pow(const Tensor& x, float exponent);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation, as GPT-2
// cond != 0 selects a, else b; cond is a float32 mask, not differentiated.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// acc += x in place, without recording (gradient accumulation, optimisers).
void add_(Tensor& acc, const Tensor& x);

// ---- reductions (reduce_ops.cpp); empty `axes` means all axes
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (the inverse of broadcasting).
Tensor sum_to_shape(const Tensor& g, const Shape& shape);

// ---- matrix products (matmul_ops.cpp)
// (M, K) @ (K, N); (..., M, K) @ (K, N) shares the right matrix across the batch;
// (..., M, K) @ (..., K, N) is a batched product over equal leading dimensions.
Tensor matmul(const Tensor& a, const Tensor& b);

// ---- neural-network ops (nn_ops.cpp)
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
enum class Reduction { mean, sum };
// logits (N, C), labels int32 (N,). `sum` gives exact sample-weighted aggregation
// across unequal shards; `mean` divides by N.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     Reduction reduction = Reduction::mean);
// Normalises over the last axis; gamma and beta have the last axis's size.
Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps = 1e-5f);
// table (V, D), ids int32 (...) -> (..., D)
Tensor embedding(const Tensor& table, const Tensor& ids);
// Inverted dropout with a counter-based mask: (seed, offset) fixes the mask, so a
// replay (recomputation, another backend) draws the same one.
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset);

// ---- convolution and pooling over NCHW (conv_ops.cpp)
// x (N, C, H, W), weight (O, C, kh, kw), bias (O) or undefined -> (N, O, H', W')
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride = 1,
              int64_t padding = 0);
Tensor maxpool2d(const Tensor& x, int64_t kernel, int64_t stride);

// ---- attention (attention_ops.cpp)
// q, k, v (B, H, T, D) -> (B, H, T, D), each position attending to itself and earlier.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace ht
