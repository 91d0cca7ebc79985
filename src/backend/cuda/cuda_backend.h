// The CUDA backend: one GPU behind the Backend interface. Products go to cuBLAS; every
// other primitive to a launcher of kernels/ (ht::kernels, same name and parameters plus
// the stream). Device code lives in kernels/; this is the host side, compiled by the host
// compiler against the CUDA runtime, cuBLAS and cuDNN. Convolutions and max pooling go to
// cuDNN (with fixed, deterministic algorithms and fp32 FMA math), causal attention to the
// fused kernel of kernels/attention.cu, and the optimisers' multi-tensor updates to one
// launch for all parameters.
//
// Precision. gemm honours the backend's precision() (bf16: operands rounded to bf16 on
// tensor cores, fp32 accumulation and storage, see gemm in cuda_backend.cpp); cuDNN's
// convolutions and every kernel compute in fp32 whatever it is.
//
// Ordering. Every kernel and cuBLAS call goes to one compute stream, so work runs in
// the order it was issued, and a block the caching allocator hands out again after a free
// is written only after the work that read it. Copies run on a copy stream that waits for
// the compute stream's work issued before them, and the compute stream waits for the
// copy; the two streams are therefore ordered as the calls were made, and the copy
// stream is where copies will overlap with compute once the interface has asynchronous
// copies.
//
// Errors. A launch error is reported at the launch, naming the op. A kernel's fault and
// the input checks that the CPU backend makes before it computes (a cross-entropy label,
// an embedding id out of range) are found on the device, so they are reported at the next
// synchronisation: synchronize() or a copy to the host.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_memory.h"

namespace ht::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  const std::string& device_name() const { return name_; }
  int device() const { return device_; }
  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t copy_stream() const { return copy_; }
  // Pinned host memory for staging transfers (cudaHostAlloc), accounted apart from the
  // device's memory.
  Allocator& pinned_allocator() { return *pinned_; }
  // The bytes cudaMalloc'd by this backend: in use plus the allocator's cache.
  size_t device_bytes_held() const { return memory_->held_bytes(); }

  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override;
  MemoryInfo memory_info() const override;
  bool supports(OpKind) const override { return true; }
  // fp32 and fp16 anywhere (fp16 tensor cores from sm_70); bf16 on sm_80 and later.
  std::string precision_refusal(Precision p) const override;
  // The GPU's product name ("NVIDIA A100-SXM4-80GB") and compute capability (8, 0).
  const std::string& product_name() const { return product_; }
  int capability_major() const { return cc_major_; }
  int capability_minor() const { return cc_minor_; }

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
  bool maxpool2d_keeps_argmax() const override { return false; }
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
  int64_t attention_max_head() const override;
  void dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset) override;
  void adamw(float* param, const float* grad, float* m, float* v, int64_t n,
             const AdamWArgs& a) override;
  void sgd(float* param, const float* grad, float* momentum_buf, int64_t n,
           const SgdArgs& a) override;
  void adamw_multi(float* const* params, const float* const* grads, float* const* ms,
                   float* const* vs, const int64_t* sizes, int count,
                   const AdamWArgs& a) override;
  void sgd_multi(float* const* params, const float* const* grads, float* const* momentum_bufs,
                 const int64_t* sizes, int count, const SgdArgs& a) override;
  void axpy(float alpha, const float* x, float* y, int64_t n) override;

 private:
  struct DeviceParts {
    std::shared_ptr<DeviceMemory> memory;
    std::unique_ptr<Allocator> allocator;
  };
  static DeviceParts make_parts(int device);
  CudaBackend(int device, DeviceParts parts);

  // The input checks found on the device, one flag each (see "Errors" above).
  enum Check { label_range, embedding_id_range, embedding_backward_id_range, checks_ };
  int* flag(Check c, int64_t bound);
  void raise_device_checks();
  // Makes this backend's GPU the calling thread's current device.
  void activate() const;
  void launched(const char* op) const;
  // The copy stream waits for the work issued so far on the compute stream.
  void copy_after_compute();

  int device_;
  std::string name_;
  std::string product_;
  int cc_major_ = 0, cc_minor_ = 0;
  std::shared_ptr<DeviceMemory> memory_;
  std::unique_ptr<Allocator> device_allocator_;
  std::unique_ptr<Allocator> pinned_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_workspace_ = nullptr;  // from device_allocator_, counted under its cap
  size_t blas_workspace_bytes_ = 0;
  cudnnHandle_t dnn_ = nullptr;  // convolutions and pooling, on the compute stream

  // Staging for copies: two pinned chunks, so that the host fills (or drains) one while
  // the DMA engine moves the other; each chunk's event says when its last transfer ended.
  static constexpr size_t kStagingChunk = size_t{4} << 20;
  std::mutex copy_mu_;
  std::array<void*, 2> staging_{};
  std::array<cudaEvent_t, 2> staging_done_{};
  cudaEvent_t compute_mark_ = nullptr, copy_mark_ = nullptr;

  // Mapped pinned memory the kernels write a nonzero to when a check fails; read on the
  // host after each synchronisation.
  int* flags_host_ = nullptr;
  int* flags_device_ = nullptr;
  std::array<int64_t, checks_> flag_bound_{};  // the bound of the last launch, for the message
};

// The process's backend for GPU `device`, made on first use and kept for the life of the
// process (tensors hold references to their backend; the runtime's own teardown at exit
// must not run after a static backend's destructor).
CudaBackend& cuda_backend(int device);

}  // namespace ht::cuda
