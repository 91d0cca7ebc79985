// Launchers of the sliding-window family over NCHW images: im2col and col2im behind
// conv2d, and max pooling. cols is (N, C*kh*kw, out_h*out_w).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

void im2col(const float* x, float* cols, const Window2d& g, cudaStream_t stream);
// gx += col2im(gcols); gx is not cleared first. Each input pixel gathers the columns
// that read it, in the CPU backend's order (deterministic, no atomics).
void col2im(const float* gcols, float* gx, const Window2d& g, cudaStream_t stream);
// Like the CPU backend, windows start at (yo * stride, xo * stride): g.pad is not
// applied. argmax holds each maximum's index within its (n, c) plane.
void maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g, cudaStream_t stream);
// gx is overwritten: each input pixel sums the gy of the windows whose argmax it is
// (deterministic, no atomics).
void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx, const Window2d& g,
                        cudaStream_t stream);

}  // namespace ht::kernels
