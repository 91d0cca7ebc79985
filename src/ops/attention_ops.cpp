#include <cmath>
#include <limits>

#include "ops/op_support.h"

namespace ht {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::check_f32(q, "causal_attention", "q");
  detail::check_f32(k, "causal_attention", "k");
  detail::check_f32(v, "causal_attention", "v");
  detail::check_rank(q, 4, "causal_attention", "q");
  HT_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), "causal_attention: q ",
           to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()),
           "; expected three equal shapes (B, H, T, D)");
  int64_t t = q.shape()[2], d = q.shape()[3];
  HT_CHECK(d > 0 && t > 0, "causal_attention: empty shape ", to_string(q.shape()));
  // Composed from differentiable ops, so its gradient needs no code of its own.
  std::vector<float> keep(t * t);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) keep[i * t + j] = j <= i ? 1.f : 0.f;
  Tensor mask = Tensor::from_vector(keep, {t, t}, q.backend());
  Tensor minus_inf = Tensor::full({}, -std::numeric_limits<float>::infinity(), q.backend());
  Tensor scores = mul(matmul(q, transpose(k, -1, -2)), 1.f / std::sqrt(static_cast<float>(d)));
  return matmul(softmax(where(mask, scores, minus_inf), -1), v);
}

}  // namespace ht
