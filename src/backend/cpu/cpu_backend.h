// The CPU backend: OpenBLAS for matrix products, thread-pool parallel loops with dense
// fast paths for everything else. It is also the reference the other backends are
// checked against, together with the plain loops in tests/harness.
#pragma once

#include "backend/backend.h"

namespace ht {

class CpuBackend final : public Backend {
 public:
  CpuBackend();

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu"; }

  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override {}
  MemoryInfo memory_info() const override;
  bool supports(OpKind) const override { return true; }

  void fill(float* y, float value, int64_t n) override;
  void copy(const void* src, const Strides& src_strides, void* dst, const Strides& dst_strides,
            const Shape& shape) override;

  void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha) override;
  void unary_backward(UnaryOp op, const float* x, const float* y, const float* gy, float* gx,
                      int64_t n, float alpha) override;
  void binary(BinaryOp op, const float* a, const Strides& sa, const float* b, const Strides& sb,
              float* out, const Shape& shape) override;
  void where(const float* cond, const Strides& sc, const float* a, const Strides& sa,
             const float* b, const Strides& sb, float* out, const Shape& shape) override;

  void reduce(ReduceOp op, const float* x, float* y, int32_t* argmax, int64_t outer, int64_t n,
              int64_t inner) override;
  void max_backward(const float* gy, const int32_t* argmax, float* gx, int64_t outer, int64_t n,
                    int64_t inner) override;
  void gemm(const GemmArgs& args) override;

  void softmax(const float* x, float* y, int64_t rows, int64_t n, bool log) override;
  void softmax_backward(const float* y, const float* gy, float* gx, int64_t rows, int64_t n,
                        bool log) override;
  void cross_entropy(const float* logits, const int32_t* labels, float* loss, float* lse,
                     int64_t rows, int64_t classes) override;
  void cross_entropy_backward(const float* logits, const float* lse, const int32_t* labels,
                              const float* gloss, float* glogits, int64_t rows,
                              int64_t classes) override;
  void layernorm(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                 float* rstd, int64_t rows, int64_t n, float eps) override;
  void layernorm_backward(const float* x, const float* gamma, const float* mean,
                          const float* rstd, const float* gy, float* gx, float* ggamma,
                          float* gbeta, int64_t rows, int64_t n) override;

  void embedding(const float* table, const int32_t* ids, float* out, int64_t count,
                 int64_t vocab, int64_t dim) override;
  void embedding_backward(const int32_t* ids, const float* gout, float* gtable, int64_t count,
                          int64_t vocab, int64_t dim) override;
  void im2col(const float* x, float* cols, const Window2d& g) override;
  void col2im(const float* gcols, float* gx, const Window2d& g) override;
  void maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g) override;
  void maxpool2d_backward(const float* x, const float* y, const float* gy,
                          const int32_t* argmax, float* gx, const Window2d& g) override;
  void conv2d(const float* x, const float* w, float* y, const Window2d& g,
              int64_t out_ch) override;
  void conv2d_backward_data(const float* gy, const float* w, float* gx, const Window2d& g,
                            int64_t out_ch) override;
  void conv2d_backward_filter(const float* x, const float* gy, float* gw, const Window2d& g,
                              int64_t out_ch) override;
  void causal_attention(const float* q, const float* k, const float* v, float* o, float* lse,
                        int64_t bh, int64_t t, int64_t d, float scale) override;
  void causal_attention_backward(const float* q, const float* k, const float* v,
                                 const float* o, const float* lse, const float* go, float* gq,
                                 float* gk, float* gv, int64_t bh, int64_t t, int64_t d,
                                 float scale) override;
  void dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset) override;

  void adamw(float* param, const float* grad, float* m, float* v, int64_t n,
             const AdamWArgs& a) override;
  void sgd(float* param, const float* grad, float* momentum_buf, int64_t n,
           const SgdArgs& a) override;
  void axpy(float alpha, const float* x, float* y, int64_t n) override;
};

namespace cpu {
// gemm over a batch through `be`: C[i] = op(A[i]) @ op(B[i]), row-major operands of their
// natural leading dimensions, per-operand batch strides (cpu_window.cpp; the convolution
// and attention compositions both use it).
void batched_gemm(Backend& be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t sa,
                  const float* b, int64_t sb, float* c, int64_t sc, int64_t batch, float beta = 0.f);
}  // namespace cpu

}  // namespace ht
