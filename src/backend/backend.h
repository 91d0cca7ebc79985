// The narrow interface every compute device implements. Ops (src/ops) own the
// autograd and shape logic and call down into these primitives; a backend only moves
// bytes and runs kernels on its own memory. All pointers are device pointers; all
// tensors are float32 unless a parameter says int32; element strides may be 0 to
// express broadcasting.
#pragma once

#include <cstdint>
#include <string>

#include "core/device_kind.h"
#include "core/host_device.h"  // counter_uniform, which dropout_mask must produce
#include "core/shape.h"
#include "backend/allocator.h"
#include "backend/precision.h"

namespace ht {

// Every primitive a backend may offer; `supports` answers per primitive so that the
// planner can learn what a device runs without trying it.
enum class OpKind {
  fill, copy, unary, unary_backward, binary, where, reduce, max_backward, gemm, softmax, softmax_backward,
  cross_entropy, cross_entropy_backward, layernorm, layernorm_backward, embedding,
  embedding_backward, im2col, col2im, maxpool2d, maxpool2d_backward, dropout_mask, adamw, sgd,
  conv2d, conv2d_backward_data, conv2d_backward_filter, causal_attention,
  causal_attention_backward, adamw_multi, sgd_multi, axpy, count_
};
const char* op_kind_name(OpKind k);

enum class UnaryOp { neg, exp, log, sqrt, tanh, relu, gelu, add_scalar, mul_scalar, pow_scalar };
enum class BinaryOp { add, sub, mul, div };
enum class ReduceOp { sum, max };

struct MemoryInfo {
  size_t total = 0;      // bytes the device has
  size_t available = 0;  // bytes free now (before the engine's cap)
};

// C = alpha * op(A) @ op(B) + beta * C for `batch` matrices, row-major, op(X) = X or X^T.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
  const float* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const float* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  float* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;

  // c = a b of n x n row-major matrices, as the probes time it.
  static GemmArgs square(const float* a, const float* b, float* c, int64_t n) {
    GemmArgs g;
    g.m = g.n = g.k = n;
    g.a = a;
    g.lda = n;
    g.b = b;
    g.ldb = n;
    g.c = c;
    g.ldc = n;
    return g;
  }
};

// One 2-d convolution or pooling window geometry over NCHW images.
struct Window2d {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input (N, C, H, W)
  int64_t kh = 0, kw = 0, stride = 1, pad = 0;
  int64_t out_h() const { return (h + 2 * pad - kh) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - kw) / stride + 1; }
};

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

struct SgdArgs {
  float lr, momentum, weight_decay;
  bool nesterov;
  bool first_step;  // the momentum buffer starts as the first gradient
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;
  Allocator& allocator() { return *allocator_; }

  // ---- memory and synchronisation
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  virtual MemoryInfo memory_info() const = 0;
  virtual bool supports(OpKind op) const = 0;

  // ---- the arithmetic of products (backend/precision.h). The mode is the backend's, set
  // once where a run starts (the executor sets it from train.precision), so that ops and
  // models issue the same calls in every mode: gemm reads it, every other primitive
  // computes in fp32 whatever it is. Empty where the backend computes in `p`; otherwise
  // why not, naming the device (the CPU backend: fp32 only).
  virtual std::string precision_refusal(Precision p) const {
    return p == Precision::fp32 ? std::string()
                                : name() + " computes in fp32 only (no " + precision_name(p) +
                                      " products)";
  }
  // Throws ht::Error with precision_refusal's reason when the backend cannot compute in `p`.
  void set_precision(Precision p) {
    const std::string why = precision_refusal(p);
    if (!why.empty()) fail("precision ", precision_name(p), " on ", name(), ": ", why);
    precision_ = p;
  }
  Precision precision() const { return precision_; }

  // ---- data movement (4-byte elements: float32 or int32)
  virtual void fill(float* y, float value, int64_t n) = 0;
  // dst[i] = src[i] over `shape` with each side's element strides.
  virtual void copy(const void* src, const Strides& src_strides, void* dst,
                    const Strides& dst_strides, const Shape& shape) = 0;

  // ---- elementwise; `out` is contiguous of `shape`
  virtual void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha) = 0;
  // gx = gy * d op / dx, from whichever of x (input) and y (output) the op needs.
  virtual void unary_backward(UnaryOp op, const float* x, const float* y, const float* gy,
                              float* gx, int64_t n, float alpha) = 0;
  virtual void binary(BinaryOp op, const float* a, const Strides& sa, const float* b,
                      const Strides& sb, float* out, const Shape& shape) = 0;
  // out = cond != 0 ? a : b
  virtual void where(const float* cond, const Strides& sc, const float* a, const Strides& sa,
                     const float* b, const Strides& sb, float* out, const Shape& shape) = 0;

  // ---- reductions over the middle axis of a contiguous (outer, n, inner) view.
  // For max, `argmax` (may be null) receives the index along n of each maximum.
  virtual void reduce(ReduceOp op, const float* x, float* y, int32_t* argmax, int64_t outer,
                      int64_t n, int64_t inner) = 0;
  // gx (outer, n, inner) = gy (outer, inner) placed at argmax, zero elsewhere.
  virtual void max_backward(const float* gy, const int32_t* argmax, float* gx, int64_t outer,
                            int64_t n, int64_t inner) = 0;

  // In the backend's precision(): fp32, or bf16 or fp16 operands with fp32 accumulation and C.
  virtual void gemm(const GemmArgs& args) = 0;

  // ---- row-wise ops over contiguous (rows, n)
  virtual void softmax(const float* x, float* y, int64_t rows, int64_t n, bool log) = 0;
  virtual void softmax_backward(const float* y, const float* gy, float* gx, int64_t rows,
                                int64_t n, bool log) = 0;
  // loss[r] = logsumexp(logits[r]) - logits[r][labels[r]]; lse[r] kept for backward.
  // Throws when a label is outside [0, classes).
  virtual void cross_entropy(const float* logits, const int32_t* labels, float* loss,
                             float* lse, int64_t rows, int64_t classes) = 0;
  // glogits[r] = gloss[r] * (softmax(logits[r]) - onehot(labels[r]))
  virtual void cross_entropy_backward(const float* logits, const float* lse,
                                      const int32_t* labels, const float* gloss,
                                      float* glogits, int64_t rows, int64_t classes) = 0;
  virtual void layernorm(const float* x, const float* gamma, const float* beta, float* y,
                         float* mean, float* rstd, int64_t rows, int64_t n, float eps) = 0;
  // Writes gx, and overwrites ggamma and gbeta with their sums over rows.
  virtual void layernorm_backward(const float* x, const float* gamma, const float* mean,
                                  const float* rstd, const float* gy, float* gx, float* ggamma,
                                  float* gbeta, int64_t rows, int64_t n) = 0;

  // ---- lookups. Throws when an id is outside [0, vocab).
  virtual void embedding(const float* table, const int32_t* ids, float* out, int64_t count,
                         int64_t vocab, int64_t dim) = 0;
  // gtable[ids[i]] += gout[i]; gtable is not cleared first.
  virtual void embedding_backward(const int32_t* ids, const float* gout, float* gtable,
                                  int64_t count, int64_t vocab, int64_t dim) = 0;

  // ---- convolution helpers: cols is (N, C*kh*kw, out_h*out_w)
  virtual void im2col(const float* x, float* cols, const Window2d& g) = 0;
  // gx += col2im(gcols); gx is not cleared first.
  virtual void col2im(const float* gcols, float* gx, const Window2d& g) = 0;

  // ---- convolution: x (N, C, H, W), w (out_ch, C, kh, kw), y (N, out_ch, out_h, out_w),
  // all contiguous; no bias (the op adds it). Any scratch comes from allocator().
  virtual void conv2d(const float* x, const float* w, float* y, const Window2d& g,
                      int64_t out_ch) = 0;
  // gx (overwritten) = the input gradient of y = conv2d(x, w) for output gradient gy.
  virtual void conv2d_backward_data(const float* gy, const float* w, float* gx,
                                    const Window2d& g, int64_t out_ch) = 0;
  // gw (overwritten) = the weight gradient, summed over the batch.
  virtual void conv2d_backward_filter(const float* x, const float* gy, float* gw,
                                      const Window2d& g, int64_t out_ch) = 0;

  // ---- max pooling; windows start at (yo * stride, xo * stride) and g.pad is not applied.
  // argmax receives each maximum's index within its (n, c) plane, the first in window
  // order on ties; it may be null, and then the backward is given x and y instead.
  virtual void maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g) = 0;
  // gx (cleared by the callee) receives gy routed to each window's maximum: through argmax
  // where it is not null, else found from x and y.
  virtual void maxpool2d_backward(const float* x, const float* y, const float* gy,
                                  const int32_t* argmax, float* gx, const Window2d& g) = 0;
  // Whether the op should keep argmax for the backward (true) or x and y (false: the
  // device's pooling, cuDNN's, routes the gradient from them and has no argmax).
  virtual bool maxpool2d_keeps_argmax() const { return true; }

  // ---- causal self-attention over contiguous (bh, t, d) q, k, v and o, one (batch, head)
  // pair per leading index: o[i] = sum_{j <= i} softmax_j(scale * q[i] . k[j]) v[j], and
  // lse (bh, t) the natural-log sum of exp of each row's scaled scores.
  virtual void causal_attention(const float* q, const float* k, const float* v, float* o,
                                float* lse, int64_t bh, int64_t t, int64_t d, float scale) = 0;
  // Overwrites gq, gk and gv from the output gradient go, given the forward's o and lse.
  virtual void causal_attention_backward(const float* q, const float* k, const float* v,
                                         const float* o, const float* lse, const float* go,
                                         float* gq, float* gk, float* gv, int64_t bh, int64_t t,
                                         int64_t d, float scale) = 0;
  // The largest head size d the fused attention takes (0: any); the op composes attention
  // from gemm and softmax for larger heads.
  virtual int64_t attention_max_head() const { return 0; }

  // mask[i] = (u(seed, offset + i) >= p) / (1 - p), u a counter-based uniform in [0, 1)
  // that every backend computes identically.
  virtual void dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset) = 0;

  // ---- fused optimiser updates, in place
  virtual void adamw(float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWArgs& a) = 0;
  virtual void sgd(float* param, const float* grad, float* momentum_buf, int64_t n,
                   const SgdArgs& a) = 0;
  // The same updates over `count` tensors with one set of arguments: each element gets
  // exactly the arithmetic of adamw / sgd on its own tensor. The pointer arrays and sizes
  // are host memory, read before the call returns. These defaults call adamw / sgd once
  // per tensor; a device where a launch costs more than a small tensor's update overrides
  // them with one launch for all. momentum_bufs may be null when a.momentum is 0.
  virtual void adamw_multi(float* const* params, const float* const* grads, float* const* ms,
                           float* const* vs, const int64_t* sizes, int count,
                           const AdamWArgs& a) {
    for (int i = 0; i < count; ++i) adamw(params[i], grads[i], ms[i], vs[i], sizes[i], a);
  }
  virtual void sgd_multi(float* const* params, const float* const* grads,
                         float* const* momentum_bufs, const int64_t* sizes, int count,
                         const SgdArgs& a) {
    for (int i = 0; i < count; ++i)
      sgd(params[i], grads[i], momentum_bufs ? momentum_bufs[i] : nullptr, sizes[i], a);
  }

  // y[i] += alpha * x[i]; with alpha == 1 exactly y[i] + x[i] (the all-reduce's sums).
  virtual void axpy(float alpha, const float* x, float* y, int64_t n) = 0;

 protected:
  explicit Backend(Allocator* allocator) : allocator_(allocator) {}
  Allocator* allocator_;
  Precision precision_ = Precision::fp32;
};

Backend& cpu_backend();


}  // namespace ht
