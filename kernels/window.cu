// Sliding-window kernels, one thread per element written; the output extents come as
// arguments because Window2d's out_h()/out_w() are host functions. The backward passes
// gather (each input pixel visits the few windows that cover it) instead of scattering, so
// they need no atomics and add in the CPU backend's order.
#include "kernels/launch.cuh"
#include "kernels/window.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

// The output positions o with o * stride + k == at for some 0 <= k < window, as the
// first and one past the last, within [0, outs).
__device__ __forceinline__ void covering(int64_t at, int64_t window, int64_t stride, int64_t outs,
                                         int64_t& lo, int64_t& hi) {
  int64_t first = at - window + 1;
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = min(at / stride + 1, outs);
}

__global__ void im2col_kernel(const float* x, float* cols, Window2d g, int64_t oh, int64_t ow,
                              int64_t total) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t xo = k % ow, yo = (k / ow) % oh;
    int64_t row = (k / (ow * oh)) % (g.c * g.kh * g.kw);
    int64_t n = k / (ow * oh * g.c * g.kh * g.kw);
    int64_t c = row / (g.kh * g.kw), ki = (row / g.kw) % g.kh, kj = row % g.kw;
    int64_t iy = yo * g.stride - g.pad + ki, ix = xo * g.stride - g.pad + kj;
    bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
    cols[k] = inside ? x[((n * g.c + c) * g.h + iy) * g.w + ix] : 0.f;
  }
}

__global__ void col2im_kernel(const float* gcols, float* gx, Window2d g, int64_t oh, int64_t ow,
                              int64_t total) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t ix = k % g.w, iy = (k / g.w) % g.h, plane = k / (g.w * g.h);
    int64_t n = plane / g.c, c = plane % g.c;
    const float* base = gcols + (n * g.c + c) * g.kh * g.kw * oh * ow;
    float acc = gx[k];
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      int64_t ty = iy + g.pad - ki;
      if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= oh) continue;
      int64_t yo = ty / g.stride;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        int64_t tx = ix + g.pad - kj;
        if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= ow) continue;
        acc += base[(ki * g.kw + kj) * oh * ow + yo * ow + tx / g.stride];
      }
    }
    gx[k] = acc;
  }
}

__global__ void maxpool2d_kernel(const float* x, float* y, int32_t* argmax, Window2d g, int64_t oh,
                                 int64_t ow, int64_t total) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t xo = k % ow, yo = (k / ow) % oh, plane = k / (ow * oh);
    const float* xp = x + plane * g.h * g.w;
    float best = -INFINITY;
    int64_t at = (yo * g.stride) * g.w + xo * g.stride;
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        int64_t idx = (yo * g.stride + ki) * g.w + xo * g.stride + kj;
        if (xp[idx] > best) {
          best = xp[idx];
          at = idx;
        }
      }
    y[k] = best;
    argmax[k] = static_cast<int32_t>(at);
  }
}

__global__ void maxpool2d_backward_kernel(const float* gy, const int32_t* argmax, float* gx,
                                          Window2d g, int64_t oh, int64_t ow, int64_t total) {
  for (int64_t k = global_index(); k < total; k += grid_stride()) {
    int64_t ix = k % g.w, iy = (k / g.w) % g.h, plane = k / (g.w * g.h);
    int64_t at = iy * g.w + ix;
    const float* gp = gy + plane * oh * ow;
    const int32_t* ap = argmax + plane * oh * ow;
    int64_t y_lo, y_hi, x_lo, x_hi;
    covering(iy, g.kh, g.stride, oh, y_lo, y_hi);
    covering(ix, g.kw, g.stride, ow, x_lo, x_hi);
    float acc = 0.f;
    for (int64_t yo = y_lo; yo < y_hi; ++yo)
      for (int64_t xo = x_lo; xo < x_hi; ++xo)
        if (ap[yo * ow + xo] == at) acc += gp[yo * ow + xo];
    gx[k] = acc;
  }
}

int64_t output_elements(const Window2d& g) { return g.n * g.c * g.out_h() * g.out_w(); }
int64_t input_elements(const Window2d& g) { return g.n * g.c * g.h * g.w; }

}  // namespace

void im2col(const float* x, float* cols, const Window2d& g, cudaStream_t stream) {
  int64_t total = output_elements(g) * g.kh * g.kw;
  if (total == 0) return;
  im2col_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, cols, g, g.out_h(), g.out_w(),
                                                            total);
}

void col2im(const float* gcols, float* gx, const Window2d& g, cudaStream_t stream) {
  int64_t total = input_elements(g);
  if (total == 0) return;
  col2im_kernel<<<blocks_for(total), kThreads, 0, stream>>>(gcols, gx, g, g.out_h(), g.out_w(),
                                                            total);
}

void maxpool2d(const float* x, float* y, int32_t* argmax, const Window2d& g, cudaStream_t stream) {
  int64_t total = output_elements(g);
  if (total == 0) return;
  maxpool2d_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, y, argmax, g, g.out_h(),
                                                               g.out_w(), total);
}

void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx, const Window2d& g,
                        cudaStream_t stream) {
  int64_t total = input_elements(g);
  if (total == 0) return;
  maxpool2d_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      gy, argmax, gx, g, g.out_h(), g.out_w(), total);
}

}  // namespace ht::kernels
