#include "nn/causal_self_attention.h"

#include "core/error.h"
#include "ops/ops.h"

namespace ht::nn {

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads, Init init, Rng& rng)
    : dim_(dim),
      heads_(heads),
      qkv_(dim, 3 * dim, true, init, rng),
      proj_(dim, dim, true, init, rng) {
  HT_CHECK(heads_ > 0 && dim_ % heads_ == 0, "CausalSelfAttention: ", heads_,
           " heads for model width ", dim_, "; expected a positive divisor of ", dim_);
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  HT_CHECK(x.defined() && x.dim() == 3 && x.shape()[2] == dim_, "CausalSelfAttention(C=", dim_,
           "): input of shape ", x.defined() ? to_string(x.shape()) : "undefined",
           "; expected (B, T, ", dim_, ")");
  int64_t b = x.shape()[0], t = x.shape()[1], h = heads_, d = dim_ / heads_;
  Tensor qkv = qkv_.forward(x);  // (B, T, 3C), dense
  // (B, T, 3C) -> (B, T, 3H, D) is a free reshape; permuting to (B, 3H, T, D) and
  // slicing the second axis gives q, k and v as strided views of the one qkv buffer,
  // so what attention keeps of them for backward is that buffer, once. (Slicing the
  // other way round would need a squeeze, i.e. a copy per tensor.)
  Tensor heads = permute(reshape(qkv, {b, t, 3 * h, d}), {0, 2, 1, 3});  // (B, 3H, T, D)
  Tensor q = slice(heads, 1, 0, h);                                       // (B, H, T, D)
  Tensor k = slice(heads, 1, h, 2 * h);                                   // (B, H, T, D)
  Tensor v = slice(heads, 1, 2 * h, 3 * h);                               // (B, H, T, D)
  Tensor y = causal_attention(q, k, v);                                   // (B, H, T, D)
  // Merging heads copies once (the permuted view is not dense); proj keeps that copy.
  Tensor merged = reshape(permute(y, {0, 2, 1, 3}), {b, t, dim_});  // (B, T, C)
  return proj_.forward(merged);
}

std::vector<NamedTensor> CausalSelfAttention::named_parameters() const {
  std::vector<NamedTensor> out;
  append(out, "qkv", qkv_.named_parameters());
  append(out, "proj", proj_.named_parameters());
  return out;
}

}  // namespace ht::nn
