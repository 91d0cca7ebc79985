// Every primitive but gemm: a launcher of kernels/ on the compute stream (launchers accept
// empty sizes and then enqueue nothing), then the launch check; convolutions and pooling
// through cuDNN on the same stream, every call checked.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
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

void CudaBackend::adamw_multi(float* const* params, const float* const* grads, float* const* ms,
                              float* const* vs, const int64_t* sizes, int count,
                              const AdamWArgs& a) {
  activate();
  k::adamw_multi(params, grads, ms, vs, sizes, count, a, compute_);
  launched("adamw_multi");
}

void CudaBackend::sgd_multi(float* const* params, const float* const* grads,
                            float* const* momentum_bufs, const int64_t* sizes, int count,
                            const SgdArgs& a) {
  activate();
  k::sgd_multi(params, grads, momentum_bufs, sizes, count, a, compute_);
  launched("sgd_multi");
}

void CudaBackend::axpy(float alpha, const float* x, float* y, int64_t n) {
  activate();
  k::axpy(alpha, x, y, n, compute_);
  launched("axpy");
}

// ---- causal attention: the fused kernels, never storing the t x t scores

int64_t CudaBackend::attention_max_head() const { return k::kAttentionMaxHead; }

void CudaBackend::causal_attention(const float* q, const float* kk, const float* v, float* o,
                                   float* lse, int64_t bh, int64_t t, int64_t d, float scale) {
  activate();
  k::causal_attention(q, kk, v, o, lse, bh, t, d, scale, compute_);
  launched("causal_attention");
}

void CudaBackend::causal_attention_backward(const float* q, const float* kk, const float* v,
                                            const float* o, const float* lse, const float* go,
                                            float* gq, float* gk, float* gv, int64_t bh,
                                            int64_t t, int64_t d, float scale) {
  activate();
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(bh * t, 1)) * sizeof(float);
  // Freed at once: the caching allocator hands the block out again only to work issued
  // later on this stream, which runs after these kernels.
  float* delta = static_cast<float*>(allocator().allocate(bytes, "causal_attention_backward"));
  try {
    k::causal_attention_backward(q, kk, v, o, lse, go, delta, gq, gk, gv, bh, t, d, scale,
                                 compute_);
  } catch (...) {  // the launcher refuses a head size it does not take: give the block back
    allocator().deallocate(delta, bytes);
    throw;
  }
  allocator().deallocate(delta, bytes);
  launched("causal_attention_backward");
}

// ---- cuDNN: convolutions and max pooling
//
// The legacy (descriptor) API, which cuDNN 9 marks deprecated in favour of its graph API
// but still ships; it covers these fixed NCHW fp32 cases in a few calls.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

// One call's descriptors, destroyed when it returns (the work they describe is enqueued).
struct DnnDescriptors {
  const std::string& device;
  std::vector<cudnnTensorDescriptor_t> tensors;
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;

  explicit DnnDescriptors(const std::string& dev) : device(dev) {}
  ~DnnDescriptors() {
    for (auto t : tensors) cudnnDestroyTensorDescriptor(t);
    if (filter) cudnnDestroyFilterDescriptor(filter);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (pool) cudnnDestroyPoolingDescriptor(pool);
  }
  DnnDescriptors(const DnnDescriptors&) = delete;
  DnnDescriptors& operator=(const DnnDescriptors&) = delete;

  cudnnTensorDescriptor_t tensor(int64_t n, int64_t c, int64_t h, int64_t w) {
    cudnnTensorDescriptor_t t = nullptr;
    HT_CUDA_ON(device, cudnnCreateTensorDescriptor(&t));
    tensors.push_back(t);
    HT_CUDA_ON(device, cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                  narrow(n), narrow(c), narrow(h), narrow(w)));
    return t;
  }
  // The convolution of g with out_ch filters: x, w and y descriptors and the convolution.
  void convolution(const Window2d& g, int64_t out_ch, cudnnTensorDescriptor_t& x,
                   cudnnTensorDescriptor_t& y) {
    x = tensor(g.n, g.c, g.h, g.w);
    y = tensor(g.n, out_ch, g.out_h(), g.out_w());
    HT_CUDA_ON(device, cudnnCreateFilterDescriptor(&filter));
    HT_CUDA_ON(device, cudnnSetFilter4dDescriptor(filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                  narrow(out_ch), narrow(g.c), narrow(g.kh),
                                                  narrow(g.kw)));
    HT_CUDA_ON(device, cudnnCreateConvolutionDescriptor(&conv));
    // Cross-correlation, as the CPU's im2col computes; fp32 accumulation.
    HT_CUDA_ON(device, cudnnSetConvolution2dDescriptor(conv, narrow(g.pad), narrow(g.pad),
                                                       narrow(g.stride), narrow(g.stride), 1, 1,
                                                       CUDNN_CROSS_CORRELATION,
                                                       CUDNN_DATA_FLOAT));
    // FMA math only: TF32 tensor cores (allowed by the default on sm_80+) would round the
    // inputs to 10 mantissa bits, far outside the harness's tolerance against the CPU.
    HT_CUDA_ON(device, cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
  }
  // Max pooling over g's windows, without padding (the CPU backend applies none).
  void max_pooling(const Window2d& g) {
    HT_CUDA_ON(device, cudnnCreatePoolingDescriptor(&pool));
    // Deterministic routing of the gradient; NaNs propagate as the CPU's comparison does
    // not, which matters only for inputs that already hold NaNs.
    HT_CUDA_ON(device, cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX_DETERMINISTIC,
                                                   CUDNN_PROPAGATE_NAN, narrow(g.kh),
                                                   narrow(g.kw), 0, 0, narrow(g.stride),
                                                   narrow(g.stride)));
  }
  int narrow(int64_t v) const {
    HT_CHECK(v >= 0 && v <= INT32_MAX, "cuDNN on ", device, ": a size of ", v,
             " does not fit cuDNN's int; expected at most ", INT32_MAX);
    return static_cast<int>(v);
  }
};

// Fixed algorithms, so that results do not depend on a benchmark's pick between runs:
// all three are deterministic (the backward ones sum without atomics; cuDNN's algorithm 0
// for either backward pass does not).
constexpr cudnnConvolutionFwdAlgo_t kForwardAlgo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
constexpr cudnnConvolutionBwdDataAlgo_t kDataAlgo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
constexpr cudnnConvolutionBwdFilterAlgo_t kFilterAlgo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

// cuDNN workspace from the device allocator, released once the call is enqueued (see
// causal_attention_backward for why that is safe).
class Workspace {
 public:
  Workspace(Allocator& a, size_t bytes, const char* what)
      : a_(a), bytes_(bytes), p_(bytes ? a.allocate(bytes, what) : nullptr) {}
  ~Workspace() { a_.deallocate(p_, bytes_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  Allocator& a_;
  size_t bytes_;
  void* p_;
};

bool empty_window(const Window2d& g, int64_t out_ch) {
  return g.n == 0 || g.c == 0 || out_ch == 0 || g.out_h() <= 0 || g.out_w() <= 0;
}

}  // namespace

void CudaBackend::conv2d(const float* x, const float* w, float* y, const Window2d& g,
                         int64_t out_ch) {
  if (empty_window(g, out_ch)) {
    // No input channels: every output is an empty sum, 0 (the CPU's gemm with k = 0).
    if (g.c == 0 && g.out_h() > 0 && g.out_w() > 0)
      fill(y, 0.f, g.n * out_ch * g.out_h() * g.out_w());
    return;
  }
  activate();
  DnnDescriptors d(name_);
  cudnnTensorDescriptor_t xd, yd;
  d.convolution(g, out_ch, xd, yd);
  size_t bytes = 0;
  HT_CUDA(cudnnGetConvolutionForwardWorkspaceSize(dnn_, xd, d.filter, d.conv, yd, kForwardAlgo,
                                                  &bytes));
  Workspace ws(allocator(), bytes, "conv2d (cuDNN workspace)");
  const float one = 1.f, zero = 0.f;
  HT_CUDA(cudnnConvolutionForward(dnn_, &one, xd, x, d.filter, w, d.conv, kForwardAlgo, ws.get(),
                                  ws.bytes(), &zero, yd, y));
}

void CudaBackend::conv2d_backward_data(const float* gy, const float* w, float* gx,
                                       const Window2d& g, int64_t out_ch) {
  if (empty_window(g, out_ch)) {
    fill(gx, 0.f, g.n * g.c * g.h * g.w);
    return;
  }
  activate();
  DnnDescriptors d(name_);
  cudnnTensorDescriptor_t xd, yd;
  d.convolution(g, out_ch, xd, yd);
  size_t bytes = 0;
  HT_CUDA(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, d.filter, yd, d.conv, xd, kDataAlgo,
                                                       &bytes));
  Workspace ws(allocator(), bytes, "conv2d_backward (cuDNN workspace)");
  const float one = 1.f, zero = 0.f;
  HT_CUDA(cudnnConvolutionBackwardData(dnn_, &one, d.filter, w, yd, gy, d.conv, kDataAlgo,
                                       ws.get(), ws.bytes(), &zero, xd, gx));
}

void CudaBackend::conv2d_backward_filter(const float* x, const float* gy, float* gw,
                                         const Window2d& g, int64_t out_ch) {
  if (empty_window(g, out_ch)) {
    fill(gw, 0.f, out_ch * g.c * g.kh * g.kw);
    return;
  }
  activate();
  DnnDescriptors d(name_);
  cudnnTensorDescriptor_t xd, yd;
  d.convolution(g, out_ch, xd, yd);
  size_t bytes = 0;
  HT_CUDA(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, xd, yd, d.conv, d.filter,
                                                         kFilterAlgo, &bytes));
  Workspace ws(allocator(), bytes, "conv2d_backward (cuDNN workspace)");
  const float one = 1.f, zero = 0.f;
  HT_CUDA(cudnnConvolutionBackwardFilter(dnn_, &one, xd, x, yd, gy, d.conv, kFilterAlgo,
                                         ws.get(), ws.bytes(), &zero, d.filter, gw));
}

// With argmax (a caller that asks for it) the window kernels, which record it; without,
// cuDNN's pooling, whose backward finds the maxima again from x and y.
void CudaBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g) {
  activate();
  if (argmax) {
    k::maxpool2d(x, y, argmax, g, compute_);
    launched("maxpool2d");
    return;
  }
  if (empty_window(g, g.c)) return;
  DnnDescriptors d(name_);
  d.max_pooling(g);
  cudnnTensorDescriptor_t xd = d.tensor(g.n, g.c, g.h, g.w);
  cudnnTensorDescriptor_t yd = d.tensor(g.n, g.c, g.out_h(), g.out_w());
  const float one = 1.f, zero = 0.f;
  HT_CUDA(cudnnPoolingForward(dnn_, d.pool, &one, xd, x, &zero, yd, y));
}

void CudaBackend::maxpool2d_backward(const float* x, const float* y, const float* gy,
                                     const int32_t* argmax, float* gx, const Window2d& g) {
  activate();
  if (argmax) {
    k::maxpool2d_backward(gy, argmax, gx, g, compute_);
    launched("maxpool2d_backward");
    return;
  }
  HT_CHECK(x && y, "maxpool2d_backward on ", name_,
           ": neither argmax nor the forward's input and output were given; expected one");
  if (empty_window(g, g.c)) {
    fill(gx, 0.f, g.n * g.c * g.h * g.w);
    return;
  }
  DnnDescriptors d(name_);
  d.max_pooling(g);
  cudnnTensorDescriptor_t xd = d.tensor(g.n, g.c, g.h, g.w);
  cudnnTensorDescriptor_t yd = d.tensor(g.n, g.c, g.out_h(), g.out_w());
  const float one = 1.f, zero = 0.f;
  HT_CUDA(cudnnPoolingBackward(dnn_, d.pool, &one, yd, y, yd, gy, xd, x, &zero, xd, gx));
}

#pragma GCC diagnostic pop

}  // namespace ht::cuda
