// The dropout mask, one thread per element. counter_uniform in backend.h is a host
// function; this is the same splitmix64 step written for the device, and must stay
// identical to it (the cuda suite compares the masks bit for bit).
#include "kernels/dropout.cuh"
#include "kernels/launch.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

__device__ __forceinline__ float device_counter_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

__global__ void dropout_mask_kernel(float* mask, int64_t n, float p, float keep_scale,
                                    uint64_t seed, uint64_t offset) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    mask[i] =
        device_counter_uniform(seed, offset + static_cast<uint64_t>(i)) >= p ? keep_scale : 0.f;
}

}  // namespace

void dropout_mask(float* mask, int64_t n, float p, uint64_t seed, uint64_t offset,
                  cudaStream_t stream) {
  if (n <= 0) return;
  float keep_scale = 1.f / (1.f - p);  // on the host, as the CPU backend rounds it
  dropout_mask_kernel<<<blocks_for(n), kThreads, 0, stream>>>(mask, n, p, keep_scale, seed, offset);
}

}  // namespace ht::kernels
