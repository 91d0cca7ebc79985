// Embedding kernels: one thread per output element, so a row's dim elements are read
// and written by adjacent threads (coalesced).
#include "kernels/embedding.cuh"
#include "kernels/launch.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

__global__ void embedding_kernel(const float* table, const int32_t* ids, float* out, int64_t total,
                                 int64_t vocab, int64_t dim, int* error_flag) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t pos = k / dim, j = k % dim;
    int32_t id = ids[pos];
    if (id < 0 || id >= vocab) {
      *error_flag = 1;
      out[k] = 0.f;
      continue;
    }
    out[k] = table[static_cast<int64_t>(id) * dim + j];
  }
}

__global__ void embedding_backward_kernel(const int32_t* ids, const float* gout, float* gtable,
                                          int64_t total, int64_t vocab, int64_t dim,
                                          int* error_flag) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t pos = k / dim, j = k % dim;
    int32_t id = ids[pos];
    if (id < 0 || id >= vocab) {
      *error_flag = 1;
      continue;
    }
    atomicAdd(gtable + static_cast<int64_t>(id) * dim + j, gout[k]);
  }
}

}  // namespace

void embedding(const float* table, const int32_t* ids, float* out, int64_t count, int64_t vocab,
               int64_t dim, int* error_flag, cudaStream_t stream) {
  int64_t total = count * dim;
  if (total == 0) return;
  embedding_kernel<<<blocks_for(total), kThreads, 0, stream>>>(table, ids, out, total, vocab, dim,
                                                               error_flag);
}

void embedding_backward(const int32_t* ids, const float* gout, float* gtable, int64_t count,
                        int64_t vocab, int64_t dim, int* error_flag, cudaStream_t stream) {
  int64_t total = count * dim;
  if (total == 0) return;
  embedding_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(ids, gout, gtable, total,
                                                                        vocab, dim, error_flag);
}

}  // namespace ht::kernels
