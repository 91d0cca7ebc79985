#include "nn/block_input.h"

#include "core/error.h"

namespace ht::nn {

std::string batched_shape_text(const Shape& sample) {
  std::string s = "(B";
  for (int64_t d : sample) s += ", " + std::to_string(d);
  return s + ")";
}

bool has_sample_shape(const Tensor& x, const Shape& sample) {
  if (!x.defined() || x.dim() != static_cast<int64_t>(sample.size()) + 1 || x.shape()[0] < 1)
    return false;
  for (size_t i = 0; i < sample.size(); ++i)
    if (x.shape()[i + 1] != sample[i]) return false;
  return true;
}

void check_block_input(const Block& block, const Tensor& x, bool shape_ok,
                       const std::string& expected) {
  HT_CHECK(x.defined(), block.kind(), " block: input is an undefined tensor; expected ",
           expected, " ", dtype_name(block.input_dtype()));
  HT_CHECK(x.dtype() == block.input_dtype() && shape_ok, block.kind(), " block: input of shape ",
           to_string(x.shape()), " ", dtype_name(x.dtype()), "; expected ", expected, " ",
           dtype_name(block.input_dtype()));
}

void check_block_input(const Block& block, const Tensor& x) {
  Shape sample = block.sample_input_shape();
  check_block_input(block, x, has_sample_shape(x, sample), batched_shape_text(sample));
}

}  // namespace ht::nn
