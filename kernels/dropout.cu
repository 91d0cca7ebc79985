// The dropout mask, one thread per element, from core/host_device.h's counter_uniform,
// the CPU backend's stream (the cuda suite compares the masks bit for bit).
#include "kernels/dropout.cuh"

#include "core/host_device.h"
#include "kernels/launch.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

__global__ void dropout_mask_kernel(float* mask, int64_t n, float p, float keep_scale,
                                    uint64_t seed, uint64_t offset) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    mask[i] =
        ht::counter_uniform(seed, offset + static_cast<uint64_t>(i)) >= p ? keep_scale : 0.f;
}

}  // namespace

void dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset,
                  cudaStream_t stream) {
  if (n <= 0) return;
  float keep_scale = 1.f / (1.f - p);  // on the host, as the CPU backend rounds it
  dropout_mask_kernel<<<blocks_for(n), kThreads, 0, stream>>>(mask, n, p, keep_scale, seed, offset);
}

}  // namespace ht::kernels
