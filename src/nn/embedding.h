// A lookup table of learned vectors, initialised normal(0, 0.02) as GPT-2.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "nn/module.h"

namespace ht::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t count, int64_t dim, Rng& rng);

  // ids int32 (...) -> (..., dim). Keeps the ids for backward.
  Tensor forward(const Tensor& ids) const;

  int64_t count() const { return count_; }
  int64_t dim() const { return dim_; }
  const Tensor& table() const { return table_; }  // (count, dim)

  std::vector<NamedTensor> named_parameters() const override { return {{"weight", table_}}; }

 private:
  int64_t count_, dim_;
  Tensor table_;  // (count, dim)
};

}  // namespace ht::nn
