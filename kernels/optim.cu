// Fused optimiser updates, one thread per element. The per-call scalars are formed on
// the host exactly as the CPU backend forms them, so both round them alike.
//
// The multi-tensor forms pass up to kListTensors tensors and kListBlocks (tensor, chunk)
// work items by value in the kernel's parameters (under the 4 KiB that every
// architecture accepts), so they need no device-side pointer tables and no copy before
// the launch; longer lists take several launches.
#include <cmath>

#include "kernels/launch.cuh"
#include "kernels/optim.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

struct AdamWScalars {
  float beta1, beta2, eps, decay, step, inv_sqrt_bc2;
};

AdamWScalars adamw_scalars(const AdamWArgs& a) {
  return {a.beta1,
          a.beta2,
          a.eps,
          1.f - a.lr * a.weight_decay,
          a.lr / a.bias_correction1,
          1.f / std::sqrt(a.bias_correction2)};
}

__device__ __forceinline__ void adamw_element(float* param, const float* grad, float* m, float* v,
                                              int64_t i, const AdamWScalars& s) {
  float g = grad[i];
  float mi = s.beta1 * m[i] + (1.f - s.beta1) * g;
  float vi = s.beta2 * v[i] + (1.f - s.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  float denom = sqrtf(vi) * s.inv_sqrt_bc2 + s.eps;
  param[i] = param[i] * s.decay - s.step * mi / denom;
}

__device__ __forceinline__ void sgd_element(float* param, const float* grad, float* buf, int64_t i,
                                            const SgdArgs& a) {
  float g = grad[i] + a.weight_decay * param[i];
  if (a.momentum != 0.f) {
    float b = a.first_step ? g : a.momentum * buf[i] + g;
    buf[i] = b;
    g = a.nesterov ? g + a.momentum * b : b;
  }
  param[i] -= a.lr * g;
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             AdamWScalars s) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    adamw_element(param, grad, m, v, i, s);
}

__global__ void sgd_kernel(float* param, const float* grad, float* buf, int64_t n, SgdArgs a) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) sgd_element(param, grad, buf, i, a);
}

constexpr int kListTensors = 32;
constexpr int kListBlocks = 256;
constexpr int64_t kListChunk = 1 << 16;  // elements per block of a multi-tensor launch

// One launch's share of a tensor list: Lists pointer lists (parameter, gradient, state)
// and the (tensor, chunk) item of each block.
template <int Lists>
struct TensorBatch {
  float* ptr[Lists][kListTensors];
  int64_t size[kListTensors];
  int16_t tensor[kListBlocks];
  int32_t chunk[kListBlocks];
};

template <int Lists, class Update>
__global__ void multi_kernel(TensorBatch<Lists> b, Update update) {
  int t = b.tensor[blockIdx.x];
  int64_t begin = static_cast<int64_t>(b.chunk[blockIdx.x]) * kListChunk;
  int64_t end = min(begin + kListChunk, b.size[t]);
  float* p[Lists];
  for (int k = 0; k < Lists; ++k) p[k] = b.ptr[k][t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update(p, i);
}

// Splits the lists into batches and launches one multi_kernel per batch.
template <int Lists, class Update>
void for_tensor_lists(float* const* (&lists)[Lists], const int64_t* sizes, int count,
                      cudaStream_t stream, Update update) {
  TensorBatch<Lists> b;
  int tensors = 0, blocks = 0;
  auto launch = [&] {
    if (blocks > 0) multi_kernel<<<blocks, kThreads, 0, stream>>>(b, update);
    tensors = blocks = 0;
  };
  for (int t = 0; t < count; ++t) {
    int64_t chunks = (sizes[t] + kListChunk - 1) / kListChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || tensors == 0) {  // the tensor takes a slot in this batch
        if (tensors == kListTensors) launch();
        for (int k = 0; k < Lists; ++k) b.ptr[k][tensors] = lists[k] ? lists[k][t] : nullptr;
        b.size[tensors] = sizes[t];
        ++tensors;
      }
      b.tensor[blocks] = static_cast<int16_t>(tensors - 1);
      b.chunk[blocks] = static_cast<int32_t>(c);
      if (++blocks == kListBlocks) launch();
    }
  }
  launch();
}

}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& a,
           cudaStream_t stream) {
  if (n <= 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, m, v, n, adamw_scalars(a));
}

void sgd(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdArgs& a,
         cudaStream_t stream) {
  if (n <= 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, momentum_buf, n, a);
}

void adamw_multi(float* const* params, const float* const* grads, float* const* ms,
                 float* const* vs, const int64_t* sizes, int count, const AdamWArgs& a,
                 cudaStream_t stream) {
  // The gradients are only read; the batch holds every list as float*.
  float* const* lists[4] = {params, const_cast<float* const*>(grads), ms, vs};
  AdamWScalars s = adamw_scalars(a);
  for_tensor_lists(lists, sizes, count, stream, [s] __device__(float*(&p)[4], int64_t i) {
    adamw_element(p[0], p[1], p[2], p[3], i, s);
  });
}

void sgd_multi(float* const* params, const float* const* grads, float* const* momentum_bufs,
               const int64_t* sizes, int count, const SgdArgs& a, cudaStream_t stream) {
  float* const* lists[3] = {params, const_cast<float* const*>(grads), momentum_bufs};
  for_tensor_lists(lists, sizes, count, stream, [a] __device__(float*(&p)[3], int64_t i) {
    sgd_element(p[0], p[1], p[2], i, a);
  });
}

}  // namespace ht::kernels
