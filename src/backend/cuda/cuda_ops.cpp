// Every primitive but gemm: a launcher of kernels/ on the compute stream (launchers accept
// empty sizes and then enqueue nothing), then the launch check.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "kernels/kernels.h"

namespace ht::cuda {

namespace k = ht::kernels;

void CudaBackend::fill(float* y, float value, int64_t n) {
  activate();
  k::fill(y, value, n, compute_);
  launched("fill");
}

void CudaBackend::copy(const void* src, const Strides& ss, void* dst, const Strides& ds,
                       const Shape& shape) {
  activate();
  k::copy(src, ss, dst, ds, shape, compute_);
  launched("copy");
}

void CudaBackend::unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha) {
  activate();
  k::unary(op, x, y, n, alpha, compute_);
  launched("unary");
}

void CudaBackend::unary_backward(UnaryOp op, const float* x, const float* y, const float* gy,
                                 float* gx, int64_t n, float alpha) {
  activate();
  k::unary_backward(op, x, y, gy, gx, n, alpha, compute_);
  launched("unary_backward");
}

void CudaBackend::binary(BinaryOp op, const float* a, const Strides& sa, const float* b,
                         const Strides& sb, float* out, const Shape& shape) {
  activate();
  k::binary(op, a, sa, b, sb, out, shape, compute_);
  launched("binary");
}

void CudaBackend::where(const float* cond, const Strides& sc, const float* a, const Strides& sa,
                        const float* b, const Strides& sb, float* out, const Shape& shape) {
  activate();
  k::where(cond, sc, a, sa, b, sb, out, shape, compute_);
  launched("where");
}

void CudaBackend::reduce(ReduceOp op, const float* x, float* y, int32_t* argmax, int64_t outer,
                         int64_t n, int64_t inner) {
  activate();
  k::reduce(op, x, y, argmax, outer, n, inner, compute_);
  launched("reduce");
}

void CudaBackend::max_backward(const float* gy, const int32_t* argmax, float* gx, int64_t outer,
                               int64_t n, int64_t inner) {
  activate();
  k::max_backward(gy, argmax, gx, outer, n, inner, compute_);
  launched("max_backward");
}

void CudaBackend::softmax(const float* x, float* y, int64_t rows, int64_t n, bool log) {
  activate();
  k::softmax(x, y, rows, n, log, compute_);
  launched("softmax");
}

void CudaBackend::softmax_backward(const float* y, const float* gy, float* gx, int64_t rows,
                                   int64_t n, bool log) {
  activate();
  k::softmax_backward(y, gy, gx, rows, n, log, compute_);
  launched("softmax_backward");
}

void CudaBackend::cross_entropy(const float* logits, const int32_t* labels, float* loss,
                                float* lse, int64_t rows, int64_t classes) {
  activate();
  k::cross_entropy(logits, labels, loss, lse, rows, classes, flag(label_range, classes),
                   compute_);
  launched("cross_entropy");
}

void CudaBackend::cross_entropy_backward(const float* logits, const float* lse,
                                         const int32_t* labels, const float* gloss,
                                         float* glogits, int64_t rows, int64_t classes) {
  activate();
  k::cross_entropy_backward(logits, lse, labels, gloss, glogits, rows, classes, compute_);
  launched("cross_entropy_backward");
}

void CudaBackend::layernorm(const float* x, const float* gamma, const float* beta, float* y,
                            float* mean, float* rstd, int64_t rows, int64_t n, float eps) {
  activate();
  k::layernorm(x, gamma, beta, y, mean, rstd, rows, n, eps, compute_);
  launched("layernorm");
}

void CudaBackend::layernorm_backward(const float* x, const float* gamma, const float* mean,
                                     const float* rstd, const float* gy, float* gx,
                                     float* ggamma, float* gbeta, int64_t rows, int64_t n) {
  activate();
  k::layernorm_backward(x, gamma, mean, rstd, gy, gx, ggamma, gbeta, rows, n, compute_);
  launched("layernorm_backward");
}

void CudaBackend::embedding(const float* table, const int32_t* ids, float* out, int64_t count,
                            int64_t vocab, int64_t dim) {
  activate();
  k::embedding(table, ids, out, count, vocab, dim, flag(embedding_id_range, vocab), compute_);
  launched("embedding");
}

void CudaBackend::embedding_backward(const int32_t* ids, const float* gout, float* gtable,
                                     int64_t count, int64_t vocab, int64_t dim) {
  activate();
  k::embedding_backward(ids, gout, gtable, count, vocab, dim,
                        flag(embedding_backward_id_range, vocab), compute_);
  launched("embedding_backward");
}

void CudaBackend::im2col(const float* x, float* cols, const Window2d& g) {
  activate();
  k::im2col(x, cols, g, compute_);
  launched("im2col");
}

void CudaBackend::col2im(const float* gcols, float* gx, const Window2d& g) {
  activate();
  k::col2im(gcols, gx, g, compute_);
  launched("col2im");
}

void CudaBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g) {
  activate();
  k::maxpool2d(x, y, argmax, g, compute_);
  launched("maxpool2d");
}

void CudaBackend::maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                                     const Window2d& g) {
  activate();
  k::maxpool2d_backward(gy, argmax, gx, g, compute_);
  launched("maxpool2d_backward");
}

void CudaBackend::dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset) {
  activate();
  k::dropout_mask(mask, n, p, seed, offset, compute_);
  launched("dropout_mask");
}

void CudaBackend::adamw(float* param, const float* grad, float* m, float* v, int64_t n,
                        const AdamWArgs& a) {
  activate();
  k::adamw(param, grad, m, v, n, a, compute_);
  launched("adamw");
}

void CudaBackend::sgd(float* param, const float* grad, float* momentum_buf, int64_t n,
                      const SgdArgs& a) {
  activate();
  k::sgd(param, grad, momentum_buf, n, a, compute_);
  launched("sgd");
}

}  // namespace ht::cuda
