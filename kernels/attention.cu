// Fused causal attention. A block of kWarps warps owns kWarps consecutive rows (queries
// in the forward and dQ passes, keys in the dK/dV pass) of one (batch, head); the block
// stages 32-row tiles of the other side in shared memory. Within a warp, lane j scores
// tile row j (a dot product over d read from shared memory, rows padded by one float so
// the lanes hit distinct banks), and each lane accumulates the output dimensions
// lane, lane + 32, ... (up to kDimsPerLane of them), taking the per-key weights from the
// scoring lanes by shuffle.
#include "core/error.h"
#include "kernels/attention.cuh"
#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"

namespace ht::kernels {

using namespace detail;

namespace {

constexpr int kWarps = 8, kBlockThreads = kWarps * 32;
constexpr int kTile = 32;
constexpr int kDimsPerLane = static_cast<int>(kAttentionMaxHead / 32);
constexpr int kPad = static_cast<int>(kAttentionMaxHead) + 1;

struct AttnShape {
  int64_t t, d;
  float scale;
};

// Where this thread's block and warp sit: the (batch, head) pair, the block's first row,
// the warp's own row and the offset of the pair's (t, d) matrices.
struct RowPlace {
  int64_t head, first, row, base;
  int warp, lane;
};

__device__ __forceinline__ RowPlace row_place(const AttnShape& s, int64_t row_blocks) {
  RowPlace p;
  p.head = blockIdx.x / row_blocks;
  p.first = (blockIdx.x % row_blocks) * kWarps;
  p.warp = threadIdx.x >> 5;
  p.lane = threadIdx.x & 31;
  p.row = p.first + p.warp;
  p.base = p.head * s.t * s.d;
  return p;
}

// Copies rows [first, first + kTile) of a (t, d) matrix into tile (zeros past t).
__device__ __forceinline__ void load_tile(const float* m, int64_t first, const AttnShape& s,
                                          float (*tile)[kPad]) {
  for (int64_t e = threadIdx.x; e < kTile * s.d; e += blockDim.x) {
    int64_t r = e / s.d, c = e % s.d;
    tile[r][c] = first + r < s.t ? m[(first + r) * s.d + c] : 0.f;
  }
}

// Copies row `row` of a (t, d) matrix into this warp's slot (zeros past t).
__device__ __forceinline__ void load_row(const float* m, int64_t row, const AttnShape& s,
                                         float* slot) {
  int lane = threadIdx.x & 31;
  for (int64_t c = lane; c < s.d; c += 32) slot[c] = row < s.t ? m[row * s.d + c] : 0.f;
}

__device__ __forceinline__ float dot_row(const float* a, const float* b, int64_t d) {
  float s = 0.f;
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

// acc[r] += sum over tile rows jj of w(jj) * tile[jj][lane + 32 r], w held by lane jj.
__device__ __forceinline__ void accumulate(float (&acc)[kDimsPerLane], float w,
                                           const float (*tile)[kPad], int64_t d) {
  int lane = threadIdx.x & 31;
  for (int jj = 0; jj < kTile; ++jj) {
    float wj = __shfl_sync(0xffffffffu, w, jj);
    for (int r = 0; r < kDimsPerLane; ++r) {
      int64_t c = lane + 32 * r;
      if (c < d) acc[r] += wj * tile[jj][c];
    }
  }
}

__device__ __forceinline__ void store_row(const float (&acc)[kDimsPerLane], float factor,
                                          float* out, int64_t d) {
  int lane = threadIdx.x & 31;
  for (int r = 0; r < kDimsPerLane; ++r) {
    int64_t c = lane + 32 * r;
    if (c < d) out[c] = acc[r] * factor;
  }
}

__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(const float* q, const float* k, const float* v, float* o, float* lse,
                   AttnShape s, int64_t row_blocks) {
  __shared__ float ks[kTile][kPad], vs[kTile][kPad], qs[kWarps][kPad];
  RowPlace at = row_place(s, row_blocks);
  int64_t head = at.head, first = at.first, i = at.row, base = at.base;
  int warp = at.warp, lane = at.lane;
  load_row(q + base, i, s, qs[warp]);
  float m = -INFINITY, l = 0.f, acc[kDimsPerLane] = {};
  int64_t last = min(first + kWarps, s.t) - 1;  // the block's last query sees keys <= last
  for (int64_t t0 = 0; t0 <= last; t0 += kTile) {
    __syncthreads();
    load_tile(k + base, t0, s, ks);
    load_tile(v + base, t0, s, vs);
    __syncthreads();
    if (i >= s.t || t0 > i) continue;  // warp-uniform
    int64_t j = t0 + lane;
    float score = j <= i ? dot_row(qs[warp], ks[lane], s.d) * s.scale : -INFINITY;
    float m_new = fmaxf(m, warp_max(score));  // finite: key t0 <= i is in the tile
    float p = j <= i ? expf(score - m_new) : 0.f;
    float alpha = expf(m - m_new);
    l = l * alpha + warp_sum(p);
    for (int r = 0; r < kDimsPerLane; ++r) acc[r] *= alpha;
    accumulate(acc, p, vs, s.d);
    m = m_new;
  }
  if (i >= s.t) return;
  store_row(acc, 1.f / l, o + base + i * s.d, s.d);
  if (lane == 0) lse[head * s.t + i] = m + logf(l);
}

// delta[row] = go[row] . o[row], one warp per row.
__global__ void __launch_bounds__(kBlockThreads)
    delta_kernel(const float* o, const float* go, float* delta, int64_t rows, int64_t d) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  float sum = 0.f;
  for (int64_t c = threadIdx.x & 31; c < d; c += 32) sum += go[row * d + c] * o[row * d + c];
  sum = warp_sum(sum);
  if ((threadIdx.x & 31) == 0) delta[row] = sum;
}

// gq[i] = scale * sum_{j <= i} p_ij (dp_ij - delta_i) k[j], dp_ij = go[i] . v[j].
__global__ void __launch_bounds__(kBlockThreads)
    grad_q_kernel(const float* q, const float* k, const float* v, const float* lse, const float* go,
                  const float* delta, float* gq, AttnShape s, int64_t row_blocks) {
  __shared__ float ks[kTile][kPad], vs[kTile][kPad], qs[kWarps][kPad], gos[kWarps][kPad];
  RowPlace at = row_place(s, row_blocks);
  int64_t head = at.head, first = at.first, i = at.row, base = at.base;
  int warp = at.warp, lane = at.lane;
  load_row(q + base, i, s, qs[warp]);
  load_row(go + base, i, s, gos[warp]);
  float li = i < s.t ? lse[head * s.t + i] : 0.f, di = i < s.t ? delta[head * s.t + i] : 0.f;
  float acc[kDimsPerLane] = {};
  int64_t last = min(first + kWarps, s.t) - 1;
  for (int64_t t0 = 0; t0 <= last; t0 += kTile) {
    __syncthreads();
    load_tile(k + base, t0, s, ks);
    load_tile(v + base, t0, s, vs);
    __syncthreads();
    if (i >= s.t || t0 > i) continue;
    int64_t j = t0 + lane;
    float ds = 0.f;
    if (j <= i) {
      float p = expf(dot_row(qs[warp], ks[lane], s.d) * s.scale - li);
      ds = p * (dot_row(gos[warp], vs[lane], s.d) - di);
    }
    accumulate(acc, ds, ks, s.d);
  }
  if (i < s.t) store_row(acc, s.scale, gq + base + i * s.d, s.d);
}

// gv[j] = sum_{i >= j} p_ij go[i]; gk[j] = scale * sum_{i >= j} p_ij (dp_ij - delta_i) q[i].
__global__ void __launch_bounds__(kBlockThreads)
    grad_kv_kernel(const float* q, const float* k, const float* v, const float* lse,
                   const float* go, const float* delta, float* gk, float* gv, AttnShape s,
                   int64_t row_blocks) {
  __shared__ float qs[kTile][kPad], gos[kTile][kPad], ks[kWarps][kPad], vs[kWarps][kPad];
  __shared__ float ls[kTile], deltas[kTile];
  RowPlace at = row_place(s, row_blocks);
  int64_t head = at.head, first = at.first, j = at.row, base = at.base;
  int warp = at.warp, lane = at.lane;
  load_row(k + base, j, s, ks[warp]);
  load_row(v + base, j, s, vs[warp]);
  float acc_k[kDimsPerLane] = {}, acc_v[kDimsPerLane] = {};
  for (int64_t t0 = (first / kTile) * kTile; t0 < s.t; t0 += kTile) {
    __syncthreads();
    load_tile(q + base, t0, s, qs);
    load_tile(go + base, t0, s, gos);
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      bool in = t0 + e < s.t;
      ls[e] = in ? lse[head * s.t + t0 + e] : 0.f;
      deltas[e] = in ? delta[head * s.t + t0 + e] : 0.f;
    }
    __syncthreads();
    if (j >= s.t || t0 + kTile <= j) continue;  // warp-uniform: no query of this tile sees j
    int64_t i = t0 + lane;
    float p = 0.f, ds = 0.f;
    if (i >= j && i < s.t) {
      p = expf(dot_row(qs[lane], ks[warp], s.d) * s.scale - ls[lane]);
      ds = p * (dot_row(gos[lane], vs[warp], s.d) - deltas[lane]);
    }
    accumulate(acc_v, p, gos, s.d);
    accumulate(acc_k, ds, qs, s.d);
  }
  if (j >= s.t) return;
  store_row(acc_v, 1.f, gv + base + j * s.d, s.d);
  store_row(acc_k, s.scale, gk + base + j * s.d, s.d);
}

void check_head(int64_t d, const char* op) {
  HT_CHECK(d > 0 && d <= kAttentionMaxHead, op, ": head size ", d, " is not supported; expected ",
           "1 <= d <= ", kAttentionMaxHead);
}

}  // namespace

void causal_attention(const float* q, const float* k, const float* v, float* o, float* lse,
                      int64_t bh, int64_t t, int64_t d, float scale, cudaStream_t stream) {
  if (bh * t == 0) return;
  check_head(d, "causal_attention");
  int64_t row_blocks = (t + kWarps - 1) / kWarps;
  forward_kernel<<<row_grid(bh * row_blocks, "causal_attention"), kBlockThreads, 0, stream>>>(
      q, k, v, o, lse, AttnShape{t, d, scale}, row_blocks);
}

void causal_attention_backward(const float* q, const float* k, const float* v, const float* o,
                               const float* lse, const float* go, float* delta, float* gq,
                               float* gk, float* gv, int64_t bh, int64_t t, int64_t d, float scale,
                               cudaStream_t stream) {
  if (bh * t == 0) return;
  check_head(d, "causal_attention_backward");
  int64_t row_blocks = (t + kWarps - 1) / kWarps;
  const unsigned blocks = row_grid(bh * row_blocks, "causal_attention_backward");
  AttnShape s{t, d, scale};
  delta_kernel<<<blocks, kBlockThreads, 0, stream>>>(o, go, delta, bh * t, d);
  grad_q_kernel<<<blocks, kBlockThreads, 0, stream>>>(q, k, v, lse, go, delta, gq, s, row_blocks);
  grad_kv_kernel<<<blocks, kBlockThreads, 0, stream>>>(q, k, v, lse, go, delta, gk, gv, s,
                                                       row_blocks);
}

}  // namespace ht::kernels
