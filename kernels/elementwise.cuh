// Launchers of the elementwise family: fill, axpy, strided copy, unary ops and their
// gradients, broadcasting binary ops and where. Host-side declarations only, so that
// g++-compiled code may include this header (through kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace ht::kernels {

void fill(float* y, float value, int64_t n, cudaStream_t stream);
// y[i] += alpha * x[i]; with alpha == 1 exactly y[i] + x[i], as on the CPU.
void axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t stream);
// 4-byte elements (float32 or int32); up to 8 dimensions after merging dense ones.
void copy(const void* src, const Strides& src_strides, void* dst, const Strides& dst_strides,
          const Shape& shape, cudaStream_t stream);
void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha, cudaStream_t stream);
void unary_backward(UnaryOp op, const float* x, const float* y, const float* gy, float* gx,
                    int64_t n, float alpha, cudaStream_t stream);
void binary(BinaryOp op, const float* a, const Strides& sa, const float* b, const Strides& sb,
            float* out, const Shape& shape, cudaStream_t stream);
void where(const float* cond, const Strides& sc, const float* a, const Strides& sa, const float* b,
           const Strides& sb, float* out, const Shape& shape, cudaStream_t stream);

}  // namespace ht::kernels
