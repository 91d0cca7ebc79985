// Elementwise kernels. As on the CPU, the op is chosen once per call on the host (a
// switch over template instantiations), so each kernel's loop holds no branch on it.
#include "kernels/device_math.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/launch.cuh"
#include "kernels/strided.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

__global__ void fill_kernel(float* y, float value, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = value;
}

// fmaf(1, x, y) rounds x + y once, so alpha == 1 sums exactly as the CPU's y + x.
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = fmaf(alpha, x[i], y[i]);
}

template <class Index>
__global__ void copy_kernel(const uint32_t* src, uint32_t* dst, StridedDims<2> s, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    int64_t off[2];
    strided_offsets<Index>(s, i, off);
    dst[off[1]] = src[off[0]];
  }
}

template <class F>
__global__ void map1_kernel(const float* x, float* y, int64_t n, F f) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = f(x[i]);
}

template <class F>
__global__ void map2_kernel(const float* a, const float* b, float* y, int64_t n, F f) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = f(a[i], b[i]);
}

template <class F>
void map1(const float* x, float* y, int64_t n, cudaStream_t stream, F f) {
  if (n > 0) map1_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n, f);
}

template <class F>
void map2(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream, F f) {
  if (n > 0) map2_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n, f);
}

// One merged dimension (dense operands, a broadcast scalar, a strided row) is the common
// case; it takes no division per element.
template <class F>
__global__ void binary_1d_kernel(const float* a, int64_t sa, const float* b, int64_t sb, float* out,
                                 int64_t n, F f) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) out[i] = f(a[i * sa], b[i * sb]);
}

template <class Index, class F>
__global__ void binary_kernel(const float* a, const float* b, float* out, StridedDims<3> s,
                              int64_t n, F f) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    int64_t off[3];
    strided_offsets<Index>(s, i, off);
    out[off[2]] = f(a[off[0]], b[off[1]]);
  }
}

template <class F>
void binary_loop(const float* a, const Strides& sa, const float* b, const Strides& sb, float* out,
                 const Shape& shape, cudaStream_t stream, F f) {
  Strides so = contiguous_strides(shape);
  auto s = coalesce<3>(shape, {&sa, &sb, &so}, "binary");
  int64_t n = s.count();
  if (s.ndim == 1 && s.stride[2][0] == 1)
    binary_1d_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, s.stride[0][0], b, s.stride[1][0],
                                                             out, n, f);
  else if (s.fits_int32())
    binary_kernel<int32_t><<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, s, n, f);
  else
    binary_kernel<int64_t><<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, s, n, f);
}

template <class Index>
__global__ void where_kernel(const float* cond, const float* a, const float* b, float* out,
                             StridedDims<4> s, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    int64_t off[4];
    strided_offsets<Index>(s, i, off);
    out[off[3]] = cond[off[0]] != 0.f ? a[off[1]] : b[off[2]];
  }
}

}  // namespace

void fill(float* y, float value, int64_t n, cudaStream_t stream) {
  if (n > 0) fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, value, n);
}

void axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n > 0) axpy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(alpha, x, y, n);
}

void copy(const void* src, const Strides& src_strides, void* dst, const Strides& dst_strides,
          const Shape& shape, cudaStream_t stream) {
  if (has_zero_extent(shape)) return;
  auto s = coalesce<2>(shape, {&src_strides, &dst_strides}, "copy");
  int64_t n = s.count();
  if (s.ndim == 1 && s.stride[0][0] == 1 && s.stride[1][0] == 1) {
    cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDefault, stream);
    return;
  }
  auto in = static_cast<const uint32_t*>(src);
  auto out = static_cast<uint32_t*>(dst);
  if (s.fits_int32())
    copy_kernel<int32_t><<<blocks_for(n), kThreads, 0, stream>>>(in, out, s, n);
  else
    copy_kernel<int64_t><<<blocks_for(n), kThreads, 0, stream>>>(in, out, s, n);
}

void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::neg:
      return map1(x, y, n, stream, [] __device__(float v) { return -v; });
    case UnaryOp::exp:
      return map1(x, y, n, stream, [] __device__(float v) { return expf(v); });
    case UnaryOp::log:
      return map1(x, y, n, stream, [] __device__(float v) { return logf(v); });
    case UnaryOp::sqrt:
      return map1(x, y, n, stream, [] __device__(float v) { return sqrtf(v); });
    case UnaryOp::tanh:
      return map1(x, y, n, stream, [] __device__(float v) { return tanh_approx(v); });
    case UnaryOp::relu:
      return map1(x, y, n, stream, [] __device__(float v) { return v > 0.f ? v : 0.f; });
    case UnaryOp::gelu:
      return map1(x, y, n, stream, [] __device__(float v) { return gelu(v); });
    case UnaryOp::add_scalar:
      return map1(x, y, n, stream, [alpha] __device__(float v) { return v + alpha; });
    case UnaryOp::mul_scalar:
      return map1(x, y, n, stream, [alpha] __device__(float v) { return v * alpha; });
    case UnaryOp::pow_scalar:
      if (alpha == 2.f) return map1(x, y, n, stream, [] __device__(float v) { return v * v; });
      return map1(x, y, n, stream, [alpha] __device__(float v) { return powf(v, alpha); });
  }
}

void unary_backward(UnaryOp op, const float* x, const float* y, const float* gy, float* gx,
                    int64_t n, float alpha, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::neg:
      return map1(gy, gx, n, stream, [] __device__(float g) { return -g; });
    case UnaryOp::add_scalar:
      return map1(gy, gx, n, stream, [] __device__(float g) { return g; });
    case UnaryOp::mul_scalar:
      return map1(gy, gx, n, stream, [alpha] __device__(float g) { return g * alpha; });
    case UnaryOp::exp:
      return map2(y, gy, gx, n, stream, [] __device__(float v, float g) { return g * v; });
    case UnaryOp::log:
      return map2(x, gy, gx, n, stream, [] __device__(float v, float g) { return g / v; });
    case UnaryOp::sqrt:
      return map2(y, gy, gx, n, stream, [] __device__(float v, float g) { return 0.5f * g / v; });
    case UnaryOp::tanh:
      return map2(y, gy, gx, n, stream,
                  [] __device__(float v, float g) { return g * (1.f - v * v); });
    case UnaryOp::relu:
      return map2(y, gy, gx, n, stream,
                  [] __device__(float v, float g) { return v > 0.f ? g : 0.f; });
    case UnaryOp::gelu:
      return map2(x, gy, gx, n, stream,
                  [] __device__(float v, float g) { return gelu_backward(v, g); });
    case UnaryOp::pow_scalar:
      return map2(x, gy, gx, n, stream, [alpha] __device__(float v, float g) {
        return g * alpha * powf(v, alpha - 1.f);
      });
  }
}

void binary(BinaryOp op, const float* a, const Strides& sa, const float* b, const Strides& sb,
            float* out, const Shape& shape, cudaStream_t stream) {
  if (has_zero_extent(shape)) return;
  switch (op) {
    case BinaryOp::add:
      return binary_loop(a, sa, b, sb, out, shape, stream,
                         [] __device__(float x, float y) { return x + y; });
    case BinaryOp::sub:
      return binary_loop(a, sa, b, sb, out, shape, stream,
                         [] __device__(float x, float y) { return x - y; });
    case BinaryOp::mul:
      return binary_loop(a, sa, b, sb, out, shape, stream,
                         [] __device__(float x, float y) { return x * y; });
    case BinaryOp::div:
      return binary_loop(a, sa, b, sb, out, shape, stream,
                         [] __device__(float x, float y) { return x / y; });
  }
}

void where(const float* cond, const Strides& sc, const float* a, const Strides& sa, const float* b,
           const Strides& sb, float* out, const Shape& shape, cudaStream_t stream) {
  if (has_zero_extent(shape)) return;
  Strides so = contiguous_strides(shape);
  auto s = coalesce<4>(shape, {&sc, &sa, &sb, &so}, "where");
  int64_t n = s.count();
  if (s.fits_int32())
    where_kernel<int32_t><<<blocks_for(n), kThreads, 0, stream>>>(cond, a, b, out, s, n);
  else
    where_kernel<int64_t><<<blocks_for(n), kThreads, 0, stream>>>(cond, a, b, out, s, n);
}

}  // namespace ht::kernels
