#include "nn/embedding.h"

#include "core/error.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace ht::nn {

Embedding::Embedding(int64_t count, int64_t dim, Rng& rng) : count_(count), dim_(dim) {
  HT_CHECK(count_ > 0 && dim_ > 0, "Embedding: table ", count_, " x ", dim_,
           "; expected positive sizes");
  table_ = normal_parameter({count_, dim_}, kGptInitStd, rng);
}

// The backend range-checks the ids (naming the bad id); the dtype is checked here so
// the message names this layer.
Tensor Embedding::forward(const Tensor& ids) const {
  HT_CHECK(ids.defined() && ids.dtype() == DType::i32, "Embedding(", count_, " x ", dim_,
           "): ids of shape ", ids.defined() ? to_string(ids.shape()) : "undefined", " are ",
           ids.defined() ? dtype_name(ids.dtype()) : "undefined", "; expected int32");
  return embedding(table_, ids);
}

}  // namespace ht::nn
