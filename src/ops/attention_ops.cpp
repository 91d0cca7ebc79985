#include <cmath>
#include <limits>

#include "ops/op_support.h"

namespace ht {

namespace {

// Attention composed from differentiable ops, so its gradient needs no code of its own:
// for heads larger than the backend's fused attention takes.
Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t t,
                          float scale) {
  std::vector<float> keep(t * t);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) keep[i * t + j] = j <= i ? 1.f : 0.f;
  Tensor mask = Tensor::from_vector(keep, {t, t}, q.backend());
  Tensor minus_inf = Tensor::full({}, -std::numeric_limits<float>::infinity(), q.backend());
  Tensor scores = mul(matmul(q, transpose(k, -1, -2)), scale);
  return matmul(softmax(where(mask, scores, minus_inf), -1), v);
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::check_f32(q, "causal_attention", "q");
  detail::check_f32(k, "causal_attention", "k");
  detail::check_f32(v, "causal_attention", "v");
  detail::check_rank(q, 4, "causal_attention", "q");
  HT_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), "causal_attention: q ",
           to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()),
           "; expected three equal shapes (B, H, T, D)");
  detail::check_same_backend(q, k, "causal_attention");
  detail::check_same_backend(q, v, "causal_attention");
  const int64_t bh = q.shape()[0] * q.shape()[1], t = q.shape()[2], d = q.shape()[3];
  HT_CHECK(d > 0 && t > 0, "causal_attention: empty shape ", to_string(q.shape()));
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  Backend& be = q.backend();
  const int64_t max_head = be.attention_max_head();
  if (max_head > 0 && d > max_head) return composed_attention(q, k, v, t, scale);

  // The backend's attention: on the CPU the composition above, primitive by primitive
  // (same results), keeping only o and the row sums; on a GPU the fused kernel, which
  // never stores the t x t scores.
  Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v);
  Tensor out = Tensor::empty(q.shape(), DType::f32, be, "causal_attention");
  Tensor lse = Tensor::empty({bh, t}, DType::f32, be, "causal_attention");
  be.causal_attention(qc.data(), kc.data(), vc.data(), out.data(), lse.data(), bh, t, d, scale);
  if (any_requires_grad({&q, &k, &v})) {
    Tensor kq = qc.detach(), kk = kc.detach(), kv = vc.detach(), ko = out.detach();
    record(out, "causal_attention", {&q, &k, &v},
           [kq, kk, kv, ko, lse, bh, t, d, scale](const Tensor& go_in, const Node&) {
             Tensor go = contiguous(go_in);
             Backend& b = go.backend();
             std::vector<Tensor> grads(3);
             for (Tensor& g : grads)
               g = Tensor::empty(kq.shape(), DType::f32, b, "causal_attention_backward");
             b.causal_attention_backward(kq.data(), kk.data(), kv.data(), ko.data(), lse.data(),
                                         go.data(), grads[0].data(), grads[1].data(),
                                         grads[2].data(), bh, t, d, scale);
             return grads;
           });
  }
  return out;
}

}  // namespace ht
