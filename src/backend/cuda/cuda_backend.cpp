#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace ht::cuda {

namespace {
std::string device_label(int device) { return "cuda:" + std::to_string(device); }
}  // namespace

CudaBackend::DeviceParts CudaBackend::make_parts(int device) {
  HT_CUDA_ON(device_label(device), cudaSetDevice(device));
  auto memory = std::make_shared<DeviceMemory>(device, device_label(device));
  auto allocator = make_device_allocator(memory, device_label(device));
  return {std::move(memory), std::move(allocator)};
}

CudaBackend::CudaBackend(int device) : CudaBackend(device, make_parts(device)) {}

CudaBackend::CudaBackend(int device, DeviceParts parts)
    : Backend(parts.allocator.get()),
      device_(device),
      name_(device_label(device)),
      memory_(std::move(parts.memory)),
      device_allocator_(std::move(parts.allocator)),
      pinned_(make_pinned_allocator(name_ + " pinned host")) {
  activate();
  HT_CUDA(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device_));
  HT_CUDA(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device_));
  {
    cudaDeviceProp prop{};
    HT_CUDA(cudaGetDeviceProperties(&prop, device_));
    product_ = prop.name;
  }
  // Host staging (Allocator::HostStaging) on this device is pinned, mapped host memory:
  // with unified addressing its pointers are valid in kernels and copies alike.
  const std::string staging_name = name_ + " host staging";
  // Freed staging blocks are kept and handed out again once both streams are idle: work
  // queued before the free may still read or write the block (copies, and kernels through
  // its mapped address), and cudaHostAlloc/cudaFreeHost per tensor per step cost
  // milliseconds and a device-wide synchronisation each.
  device_allocator_->set_host_staging(
      [staging_name](size_t bytes) { return pinned_alloc(bytes, staging_name); },
      // A block freed for good (the staging cache full) waits for both streams first:
      // cudaFreeHost is not promised to, and queued work may still read the block.
      [this, staging_name](void* p) {
        if (compute_) cudaStreamSynchronize(compute_);
        if (copy_) cudaStreamSynchronize(copy_);
        cudaGetLastError();  // a free reports, never throws: the next checked call sees a sticky fault
        pinned_free(p, staging_name);
      },
      [this] {
        activate();
        HT_CUDA(cudaStreamSynchronize(compute_));
        HT_CUDA(cudaStreamSynchronize(copy_));
      });
  // Non-blocking streams: the legacy default stream, which other libraries may use,
  // would otherwise serialise with both.
  HT_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  HT_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  HT_CUDA(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  HT_CUDA(cudaEventCreateWithFlags(&copy_mark_, cudaEventDisableTiming));
  for (size_t i = 0; i < staging_.size(); ++i) {
    staging_[i] = pinned_->allocate(kStagingChunk, "copy staging");
    HT_CUDA(cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming));
  }
  flags_host_ = static_cast<int*>(pinned_->allocate(checks_ * sizeof(int), "device checks"));
  std::memset(flags_host_, 0, checks_ * sizeof(int));
  HT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flags_device_), flags_host_, 0));
  HT_CUDA(cublasCreate(&blas_));
  HT_CUDA(cublasSetStream(blas_, compute_));
  // cuBLAS's workspace from this device's allocator (after cublasSetStream, which resets
  // it), so that it is counted and capped like every other block and a shortage is the
  // allocator's out-of-memory error with its figures, not cuBLAS's bare ALLOC_FAILED.
  // The size cuBLAS recommends: 32 MiB on Hopper and later, 4 MiB before.
  blas_workspace_bytes_ = (cc_major_ >= 9 ? size_t{32} : size_t{4}) << 20;
  blas_workspace_ = device_allocator_->allocate(blas_workspace_bytes_, "cuBLAS workspace");
  HT_CUDA(cublasSetWorkspace(blas_, blas_workspace_, blas_workspace_bytes_));
  // fp32 products in fp32: TF32 tensor cores would round the inputs to 10 mantissa bits,
  // far outside the 1e-5 the consistency harness allows against the CPU.
  HT_CUDA(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  HT_CUDA(cudnnCreate(&dnn_));
  HT_CUDA(cudnnSetStream(dnn_, compute_));
}

CudaBackend::~CudaBackend() {
  // Nothing here throws: a failure of the last work is reported by the synchronisation
  // the owner made, and a destructor cannot report it anyway.
  cudaSetDevice(device_);
  cudaStreamSynchronize(compute_);
  cudaStreamSynchronize(copy_);
  if (blas_) cublasDestroy(blas_);
  if (blas_workspace_) device_allocator_->deallocate(blas_workspace_, blas_workspace_bytes_);
  if (dnn_) cudnnDestroy(dnn_);
  for (size_t i = 0; i < staging_.size(); ++i) {
    pinned_->deallocate(staging_[i], kStagingChunk);
    cudaEventDestroy(staging_done_[i]);
  }
  pinned_->deallocate(flags_host_, checks_ * sizeof(int));
  cudaEventDestroy(compute_mark_);
  cudaEventDestroy(copy_mark_);
  cudaStreamDestroy(compute_);
  cudaStreamDestroy(copy_);
}

void CudaBackend::activate() const { HT_CUDA(cudaSetDevice(device_)); }

void CudaBackend::launched(const char* op) const { check_launch(op, name_); }

// ---- copies through pinned staging

void CudaBackend::copy_after_compute() {
  HT_CUDA(cudaEventRecord(compute_mark_, compute_));
  HT_CUDA(cudaStreamWaitEvent(copy_, compute_mark_, 0));
}

void CudaBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  activate();
  std::lock_guard<std::mutex> lock(copy_mu_);
  copy_after_compute();
  const char* src = static_cast<const char*>(host_src);
  char* out = static_cast<char*>(dst);
  for (size_t done = 0, chunk = 0; done < bytes; done += kStagingChunk, chunk ^= 1) {
    size_t n = std::min(kStagingChunk, bytes - done);
    // The chunk's previous transfer must have read it before the host overwrites it.
    HT_CUDA(cudaEventSynchronize(staging_done_[chunk]));
    std::memcpy(staging_[chunk], src + done, n);
    HT_CUDA(cudaMemcpyAsync(out + done, staging_[chunk], n, cudaMemcpyDefault, copy_));
    HT_CUDA(cudaEventRecord(staging_done_[chunk], copy_));
  }
  // The source is in the staging buffers now, so the call may return before the
  // transfer ends; kernels issued after it wait for it.
  HT_CUDA(cudaEventRecord(copy_mark_, copy_));
  HT_CUDA(cudaStreamWaitEvent(compute_, copy_mark_, 0));
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  activate();
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    copy_after_compute();
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(host_dst);
    // Chunk i+1 is in flight while the host drains chunk i.
    size_t pending = 0, pending_at = 0;
    int chunk = 0;
    for (size_t done = 0; done < bytes; done += kStagingChunk, chunk ^= 1) {
      size_t n = std::min(kStagingChunk, bytes - done);
      HT_CUDA(cudaEventSynchronize(staging_done_[chunk]));
      HT_CUDA(cudaMemcpyAsync(staging_[chunk], in + done, n, cudaMemcpyDefault, copy_));
      HT_CUDA(cudaEventRecord(staging_done_[chunk], copy_));
      if (pending) {
        HT_CUDA(cudaEventSynchronize(staging_done_[chunk ^ 1]));
        std::memcpy(out + pending_at, staging_[chunk ^ 1], pending);
      }
      pending = n;
      pending_at = done;
    }
    HT_CUDA(cudaEventSynchronize(staging_done_[chunk ^ 1]));
    std::memcpy(out + pending_at, staging_[chunk ^ 1], pending);
  }
  // The copy waited for every kernel issued before it, so their checks are final.
  raise_device_checks();
}

void CudaBackend::synchronize() {
  activate();
  HT_CUDA(cudaStreamSynchronize(copy_));
  HT_CUDA(cudaStreamSynchronize(compute_));
  raise_device_checks();
}

MemoryInfo CudaBackend::memory_info() const {
  activate();
  size_t free = 0, total = 0;
  HT_CUDA(cudaMemGetInfo(&free, &total));
  MemoryInfo info;
  info.total = total;
  info.available = free;
  return info;
}

// ---- checks found on the device

int* CudaBackend::flag(Check c, int64_t bound) {
  flag_bound_[c] = bound;
  return flags_device_ + c;
}

void CudaBackend::raise_device_checks() {
  // Read once, clear, then report the first: the flags belong to kernels that have all
  // finished (the caller synchronised), so clearing races with nothing.
  std::array<int, checks_> seen{};
  bool any = false;
  for (int c = 0; c < checks_; ++c) {
    seen[c] = reinterpret_cast<volatile int*>(flags_host_)[c];
    any = any || seen[c] != 0;
  }
  if (!any) return;
  std::memset(flags_host_, 0, checks_ * sizeof(int));
  if (seen[label_range])
    fail("cross_entropy on ", name_, ": a label is out of range; expected 0 <= label < ",
         flag_bound_[label_range], " (found by the kernel, reported at the next synchronisation)");
  if (seen[embedding_id_range])
    fail("embedding on ", name_, ": an id is out of range; expected 0 <= id < ",
         flag_bound_[embedding_id_range],
         " (the table's rows; found by the kernel, reported at the next synchronisation)");
  fail("embedding_backward on ", name_, ": an id is out of range; expected 0 <= id < ",
       flag_bound_[embedding_backward_id_range],
       " (the table's rows; found by the kernel, reported at the next synchronisation)");
}

// ---- products

void CudaBackend::gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  auto fits = [&](int64_t v, const char* what) {
    HT_CHECK(v >= 0 && v <= INT32_MAX, "gemm on ", name_, ": ", what, " = ", v,
             " is out of cuBLAS's range; expected 0 <= ", what, " <= ", INT32_MAX);
    return static_cast<int>(v);
  };
  // cuBLAS is column-major. A row-major matrix is the column-major view of its
  // transpose, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
  // swap the operands and the sizes m and n, keep the leading dimensions.
  int m = fits(g.m, "m"), n = fits(g.n, "n"), k = fits(g.k, "k"), batch = fits(g.batch, "batch");
  int lda = fits(g.lda, "lda"), ldb = fits(g.ldb, "ldb"), ldc = fits(g.ldc, "ldc");
  if (k == 0) {
    // An empty sum leaves C = beta * C; cuBLAS still checks the unused operands'
    // leading dimensions, which a caller need not have set.
    lda = std::max(lda, g.trans_a ? m : 1);
    ldb = std::max(ldb, g.trans_b ? 1 : n);
    lda = std::max(lda, 1);
    ldb = std::max(ldb, 1);
  }
  activate();
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (precision_ != Precision::fp32) {
    // bf16 autocast on the fp32 tensors themselves: CUBLAS_COMPUTE_32F_FAST_16BF lets
    // cuBLAS round A and B to bf16 inside its tensor-core kernels, accumulating and
    // writing C in fp32. Explicit bf16 copies of the operands would cost a conversion
    // kernel per operand per call (4 bytes read and 2 written per element, plus the
    // allocator's blocks) and, since weights change every step and activations every
    // call, could not be cached; whether they would still be faster for the largest
    // products is unmeasured. The master weights, gradients and C stay fp32. fp16 is the
    // same with IEEE half operands (CUBLAS_COMPUTE_32F_FAST_16F): fp16 tensor cores exist
    // from sm_70, so on every GPU CUDA 13 builds for; its gradients reach these products
    // scaled by the dynamic loss scale (runtime/loss_scale.h).
    const cublasComputeType_t compute =
        precision_ == Precision::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
    HT_CUDA(cublasGemmStridedBatchedEx(blas_, op_b, op_a, n, m, k, &g.alpha, g.b, CUDA_R_32F, ldb,
                                       g.stride_b, g.a, CUDA_R_32F, lda, g.stride_a, &g.beta, g.c,
                                       CUDA_R_32F, ldc, g.stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  HT_CUDA(cublasSgemmStridedBatched(blas_, op_b, op_a, n, m, k, &g.alpha, g.b, ldb, g.stride_b,
                                    g.a, lda, g.stride_a, &g.beta, g.c, ldc, g.stride_c, batch));
}

std::string CudaBackend::precision_refusal(Precision p) const {
  const std::string gpu = product_ + " (" + name_ + ", sm_" + std::to_string(cc_major_) +
                          std::to_string(cc_minor_) + ")";
  switch (p) {
    case Precision::fp32: return {};
    case Precision::bf16:
      if (cc_major_ >= 8) return {};
      return "bf16 products need bf16 tensor cores, compute capability 8.0 or later (sm_80+); " +
             gpu + " has compute capability " + std::to_string(cc_major_) + "." +
             std::to_string(cc_minor_);
    case Precision::fp16: return {};  // fp16 tensor cores from sm_70; CUDA 13 builds for sm_75 and later
  }
  return "unknown precision";
}

CudaBackend& cuda_backend(int device) {
  static std::mutex mu;
  static std::map<int, CudaBackend*> backends;
  std::lock_guard<std::mutex> lock(mu);
  CudaBackend*& b = backends[device];
  if (!b) b = new CudaBackend(device);  // kept to the process's end (see the header)
  return *b;
}

}  // namespace ht::cuda
