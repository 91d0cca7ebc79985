// Input validation shared by the Blocks: a wrong input fails at the block's door with
// a message naming the block, the shape and dtype it got, and what it expected,
// rather than deep inside an op with the op's view of things.
#pragma once

#include <string>

#include "nn/block.h"

namespace ht::nn {

// "(B, 784)" for the sample shape {784}.
std::string batched_shape_text(const Shape& sample);

// True when x is (batch, sample...) for a batch of at least one.
bool has_sample_shape(const Tensor& x, const Shape& sample);

// Throws ht::Error unless x is defined, has the block's input dtype and `shape_ok`;
// `expected` describes the accepted shapes (e.g. "(B, T, 128) with T <= 128").
void check_block_input(const Block& block, const Tensor& x, bool shape_ok,
                       const std::string& expected);

// The common case: exactly (B, sample_input_shape...).
void check_block_input(const Block& block, const Tensor& x);

}  // namespace ht::nn
