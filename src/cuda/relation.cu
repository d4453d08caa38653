// FlashRelation kernels (forward, backward, decode) and their launchers; see relation.h for the
// contract and relation_launch.h for the launcher interface.
//
// Layout of the tiled kernels, as the flash attention kernels (attention.cu): a block of 256
// threads owns one 64-row tile; tile row `row` = threadIdx.x / 4 belongs to the 4 consecutive
// lanes `quad` = threadIdx.x % 4 of one warp. A thread computes the scores of its row against
// the columns quad + 4i (i < 16) of the other tile and accumulates the head-width lanes
// quad + 4i (i < kPadded/4) of its row's output in registers. Row reductions are two shuffles
// in the quad. Tiles live in shared memory as fp32 with an odd row stride (kPadded + 1), so
// the rows read together fall in different banks.
//
// The score rule of Relation differs from attention's in three places, all handled here:
// the scan covers the strict history j < p with E = SiLU(U) as the score, the Self entry is
// applied around the scan (S_p from the row's own p1·p2), and the count term −λ log(p+1)
// enters only through the gate g_p = sigmoid(L_p − λ log(p+1) − S_p).
#include <cmath>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/relation_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kTile = kRelationTile;
constexpr int kThreads = 256;
constexpr int kQuad = kThreads / kTile;  // threads per tile row
constexpr int kCols = kTile / kQuad;     // score columns per thread
constexpr int kScoreStride = kTile + 1;  // row stride of a [64, 64] fp32 score tile
constexpr int kStats = 3;                // columns of ops::RelationStat
constexpr int kStatLogExchange = 0, kStatSelf = 1, kStatGate = 2;

static_assert(kQuad == 4, "the row reductions below shuffle across 4 lanes");

template <int kPadded>
constexpr int kStride = kPadded + 1;

// dst[r, d] = row (row0 + r) of a bf16 [T, rows of `row_stride` elements] array at base, as
// fp32, for r < 64 and d < kPadded; zero where row0 + r >= T or d >= Dh (padding).
template <int kPadded>
__device__ void load_tile(float* dst, const uint16_t* base, int64_t row0, int64_t T,
                          int64_t row_stride, int Dh) {
  for (int idx = threadIdx.x; idx < kTile * kPadded; idx += kThreads) {
    const int r = idx / kPadded, d = idx % kPadded;
    float x = 0.0f;
    if (row0 + r < T && d < Dh) x = bf16_load(base[(row0 + r) * row_stride + d]);
    dst[r * kStride<kPadded> + d] = x;
  }
}

template <int kPadded>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  float s = 0.0f;
#pragma unroll 16
  for (int d = 0; d < kPadded; ++d) s = fmaf(a[d], b[d], s);
  return s;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// expf(-x) overflows to inf for x < -88 and the quotient is then 0: no NaN.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float log_sigmoid(float x) {
  return fminf(x, 0.0f) - log1pf(expf(-fabsf(x)));
}

// dSiLU/du given u and σ(u).
__device__ __forceinline__ float silu_grad(float u, float sg) {
  return sg * (1.0f + u * (1.0f - sg));
}

// Σ_d a[d]·b[d] over d < Dh of two bf16 rows, summed by the quad (all 32 lanes of the warp
// must call it); 0 when `valid` is false.
__device__ float quad_dot_bf16(const uint16_t* a, const uint16_t* b, int Dh, int quad, bool valid) {
  float s = 0.0f;
  if (valid)
    for (int d = quad; d < Dh; d += kQuad) s = fmaf(bf16_load(a[d]), bf16_load(b[d]), s);
  return quad_sum(s);
}

// Forward. Grid (query tiles, H, B); tiles run heaviest (last) first.
template <int kPadded>
__global__ void __launch_bounds__(kThreads) relation_forward_kernel(const RelationForwardArgs a) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  float* qs = smem;            // [64, S] p1 tile
  float* ks = qs + kTile * S;  // [64, S] p2 tile
  float* vs = ks + kTile * S;  // [64, S] Ĩ tile
  float* ps = vs + kTile * S;  // [64, 65] unnormalized weights of the key tile

  const RelationDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int64_t p = p0 + row;
  const bool row_valid = p < T;
  const int64_t stride = d.H * Dh, head = (b * T * d.H + h) * Dh;  // row t at head + t * stride
  const float scale = a.rule.scale;

  load_tile<kPadded>(qs, a.p1 + head, p0, T, stride, Dh);

  float m = -INFINITY, l = 0.0f, acc[kLanes];
#pragma unroll
  for (int i = 0; i < kLanes; ++i) acc[i] = 0.0f;

  // The tile's last row sees the keys j < min(p0 + 64, T) − 1.
  const int64_t key_end = (p0 + kTile < T ? p0 + kTile : T) - 1;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile's readers of ks, vs, ps are done
    load_tile<kPadded>(ks, a.p2 + head, j0, T, stride, Dh);
    load_tile<kPadded>(vs, a.v + head, j0, T, stride, Dh);
    __syncthreads();

    float s[kCols], tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = quad + kQuad * i;
      float x = -INFINITY;
      if (row_valid && j0 + c < p) {
        const float u = dot_row<kPadded>(qs + row * S, ks + c * S) * scale;
        x = u * sigmoid(u);  // E = SiLU(U)
      }
      s[i] = x;
      tile_max = fmaxf(tile_max, x);
    }
    const float m_new = fmaxf(m, quad_max(tile_max));
    // m_new = -inf: no key of the history seen yet (rows at the start of the tile); nothing to
    // rescale, and exp(-inf - -inf) must not produce NaN.
    const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - m_new);
      ps[row * kScoreStride + quad + kQuad * i] = e;
      sum += e;
    }
    l = l * alpha + quad_sum(sum);
    m = m_new;
    __syncwarp();  // the row's weights, written by its quad, are read by the quad

#pragma unroll
    for (int i = 0; i < kLanes; ++i) acc[i] *= alpha;
    for (int c = 0; c < kTile; ++c) {
      const float pc = ps[row * kScoreStride + c];
#pragma unroll
      for (int i = 0; i < kLanes; ++i) acc[i] = fmaf(pc, vs[c * S + quad + kQuad * i], acc[i]);
    }
  }

  // Self: S_p = sigmoid(p1_p · p2_p / (sqrt(Dh) τ_S)).
  const int64_t row_off = head + (row_valid ? p : 0) * stride;
  const float self_dot = quad_dot_bf16(a.p1 + row_off, a.p2 + row_off, Dh, quad, row_valid);
  if (!row_valid) return;
  const float self = sigmoid(self_dot * scale * a.rule.inv_tau);
  float log_exchange = -INFINITY, gate = 0.0f, w_hist = 0.0f;
  if (p > 0) {  // p = 0 has no history: g_0 = 0, Y_0 = Ĩ_0 (exchange-only: 0)
    log_exchange = m + logf(l);
    const float lambda = *a.lambda;
    gate = sigmoid(log_exchange - lambda * logf(static_cast<float>(p + 1)) - self);
    w_hist = gate / l;
  }
  const float w_self = a.rule.exchange_only ? 0.0f : 1.0f - gate;
  const uint16_t* vr = a.v + row_off;
  uint16_t* yr = a.y + row_off;
#pragma unroll
  for (int i = 0; i < kLanes; ++i) {
    const int dd = quad + kQuad * i;
    if (dd < Dh) yr[dd] = bf16_round(fmaf(w_self, bf16_load(vr[dd]), w_hist * acc[i]));
  }
  if (quad == 0) {
    float* st = a.stats + ((b * d.H + h) * T + p) * kStats;
    st[kStatLogExchange] = log_exchange;
    st[kStatSelf] = self;
    st[kStatGate] = gate;
  }
}

// Views of the backward's workspace (relation_launch.h).
struct BackwardWorkspace {
  double* partials;  // [B, H, tiles] Σ_p log(p+1) dR_pp over the tile's rows
  float* delta;      // [B, H, T] D_p = dY_p · Y_p
  float* norm;       // [B, H, T] F_pj = exp(E_pj − norm_p) for j < p
  float* dr_self;    // [B, H, T] dR_pp
};

BackwardWorkspace backward_workspace(const RelationBackwardArgs& a) {
  const RelationDims& d = a.dims;
  const int64_t rows = d.B * d.H * d.T;
  BackwardWorkspace w;
  w.partials = static_cast<double*>(a.workspace);
  w.delta = reinterpret_cast<float*>(w.partials + relation_backward_partials(d.B, d.T, d.H));
  w.norm = w.delta + rows;
  w.dr_self = w.norm + rows;
  return w;
}

// Row terms of the backward. Grid (query tiles, H, B). For each row p: D_p, norm_p and the
// Self entry dR_pp = F_pp (dY_p · w_p − D_p) with F_pp = 1 − g_p and w_p = Ĩ_p (0 under
// exchange-only transport); the block's Σ log(p+1) dR_pp goes to its slot of the partials.
__global__ void __launch_bounds__(kThreads)
    relation_backward_rows_kernel(const RelationBackwardArgs a, const BackwardWorkspace w) {
  __shared__ double scratch[kThreads / 32];
  const RelationDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kTile + row;
  const bool valid = p < T;
  const int64_t stride = d.H * Dh;
  const int64_t row_off = (b * T * d.H + h) * Dh + (valid ? p : 0) * stride;
  const float delta = quad_dot_bf16(a.dy + row_off, a.y + row_off, Dh, quad, valid);
  const float dself =
      quad_dot_bf16(a.dy + row_off, a.v + row_off, Dh, quad, valid && !a.rule.exchange_only);
  double part = 0.0;
  if (valid && quad == 0) {
    const int64_t r = (b * d.H + h) * T + p;
    const float* st = a.stats + r * kStats;
    const float log_exchange = st[kStatLogExchange], self = st[kStatSelf], gate = st[kStatGate];
    const float log_count = logf(static_cast<float>(p + 1));
    float norm = 0.0f;  // unused at p = 0 (no history)
    if (p > 0) norm = log_exchange - log_sigmoid(log_exchange - *a.lambda * log_count - self);
    const float dr_self = (1.0f - gate) * (dself - delta);
    w.delta[r] = delta;
    w.norm[r] = norm;
    w.dr_self[r] = dr_self;
    part = static_cast<double>(log_count) * dr_self;
  }
  const double total = block_sum_double(part, scratch);
  if (threadIdx.x == 0) w.partials[(b * d.H + h) * gridDim.x + blockIdx.x] = total;
}

// dλ += Σ of the partials, in index order per thread and a fixed tree across threads.
__global__ void __launch_bounds__(kThreads)
    relation_dlambda_kernel(const double* partials, int64_t n, float* dlambda) {
  __shared__ double scratch[kThreads / 32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += partials[i];
  const double total = block_sum_double(s, scratch);
  if (threadIdx.x == 0) *dlambda = static_cast<float>(static_cast<double>(*dlambda) + total);
}

// The historical entries of one (query p, key j < p) pair: F_pj and dU_pj.
struct PairGrad {
  float f, du;
};
__device__ __forceinline__ PairGrad pair_grad(float dot_p1p2, float dot_dyv, float scale,
                                              float norm, float delta) {
  const float u = dot_p1p2 * scale, sg = sigmoid(u);
  const float f = expf(u * sg - norm);
  return {f, f * (dot_dyv - delta) * silu_grad(u, sg)};
}

// dp2, dv. Grid (key tiles, H, B). Thread row = key row c; loops over the query tiles at or
// after the key tile, so dp2 and dv are summed in a fixed order:
//   dv_j  = (1 − g_j) dY_j [0 under exchange-only] + Σ_{p>j} F_pj dY_p
//   dp2_j = scale (dU_jj p1_j + Σ_{p>j} dU_pj p1_p), dU_jj = dR_jj S_j (1 − S_j) / τ_S.
template <int kPadded>
__global__ void __launch_bounds__(kThreads)
    relation_backward_dp2dv_kernel(const RelationBackwardArgs a, const BackwardWorkspace w) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  float* ks = smem;                            // [64, S] p2 tile (fixed)
  float* vs = ks + kTile * S;                  // [64, S] Ĩ tile (fixed)
  float* qs = vs + kTile * S;                  // [64, S] p1 tile
  float* dys = qs + kTile * S;                 // [64, S] dY tile
  float* ps = dys + kTile * S;                 // [64 keys, 65] F^T
  float* dus = ps + kTile * kScoreStride;      // [64 keys, 65] dU^T
  float* norm_s = dus + kTile * kScoreStride;  // [64] norm of the query rows
  float* delta_s = norm_s + kTile;             // [64] D of the query rows

  const RelationDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int c = row;
  const int64_t j = j0 + c;
  const int64_t stride = d.H * Dh, head = (b * T * d.H + h) * Dh;
  const int64_t head_rows = (b * d.H + h) * T;  // row t of the workspace and stats
  const float scale = a.rule.scale;

  load_tile<kPadded>(ks, a.p2 + head, j0, T, stride, Dh);
  load_tile<kPadded>(vs, a.v + head, j0, T, stride, Dh);

  float dp2[kLanes], dv[kLanes];
#pragma unroll
  for (int i = 0; i < kLanes; ++i) dp2[i] = dv[i] = 0.0f;

  // Query rows p <= j0 see none of this tile's keys; the first query tile that matters is the
  // key tile's own.
  for (int64_t p0 = j0; p0 < T; p0 += kTile) {
    __syncthreads();  // the previous query tile's readers are done
    load_tile<kPadded>(qs, a.p1 + head, p0, T, stride, Dh);
    load_tile<kPadded>(dys, a.dy + head, p0, T, stride, Dh);
    if (threadIdx.x < kTile) {
      const int64_t p = p0 + threadIdx.x;
      norm_s[threadIdx.x] = p < T ? w.norm[head_rows + p] : 0.0f;
      delta_s[threadIdx.x] = p < T ? w.delta[head_rows + p] : 0.0f;
    }
    __syncthreads();

#pragma unroll 4
    for (int i = 0; i < kCols; ++i) {
      const int r = quad + kQuad * i;
      const int64_t p = p0 + r;
      PairGrad g{0.0f, 0.0f};
      if (p < T && j < p)
        g = pair_grad(dot_row<kPadded>(qs + r * S, ks + c * S),
                      dot_row<kPadded>(dys + r * S, vs + c * S), scale, norm_s[r], delta_s[r]);
      ps[c * kScoreStride + r] = g.f;
      dus[c * kScoreStride + r] = g.du;
    }
    __syncwarp();  // row c of F^T and dU^T, written by its quad, is read by the quad

    for (int r = 0; r < kTile; ++r) {
      const float f = ps[c * kScoreStride + r], du = dus[c * kScoreStride + r];
#pragma unroll
      for (int i = 0; i < kLanes; ++i) {
        dv[i] = fmaf(f, dys[r * S + quad + kQuad * i], dv[i]);
        dp2[i] = fmaf(du, qs[r * S + quad + kQuad * i], dp2[i]);
      }
    }
  }

  if (j < T) {
    const float* st = a.stats + (head_rows + j) * kStats;
    const float self = st[kStatSelf], gate = st[kStatGate];
    const float du_self = w.dr_self[head_rows + j] * self * (1.0f - self) * a.rule.inv_tau;
    const float w_self = a.rule.exchange_only ? 0.0f : 1.0f - gate;
    const int64_t off = head + j * stride;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) {
      const int dd = quad + kQuad * i;
      if (dd < Dh) {
        a.dp2[off + dd] = bf16_round(scale * fmaf(du_self, bf16_load(a.p1[off + dd]), dp2[i]));
        a.dv[off + dd] = bf16_round(fmaf(w_self, bf16_load(a.dy[off + dd]), dv[i]));
      }
    }
  }
}

// dp1. Grid (query tiles, H, B); tiles run heaviest first.
//   dp1_p = scale (dU_pp p2_p + Σ_{j<p} dU_pj p2_j).
template <int kPadded>
__global__ void __launch_bounds__(kThreads)
    relation_backward_dp1_kernel(const RelationBackwardArgs a, const BackwardWorkspace w) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  float* qs = smem;             // [64, S] p1 tile (fixed)
  float* dys = qs + kTile * S;  // [64, S] dY tile (fixed)
  float* ks = dys + kTile * S;  // [64, S] p2 tile
  float* vs = ks + kTile * S;   // [64, S] Ĩ tile
  float* dus = vs + kTile * S;  // [64, 65] dU of the key tile

  const RelationDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int64_t p = p0 + row;
  const bool row_valid = p < T;
  const int64_t stride = d.H * Dh, head = (b * T * d.H + h) * Dh;
  const int64_t head_rows = (b * d.H + h) * T;
  const float scale = a.rule.scale;

  load_tile<kPadded>(qs, a.p1 + head, p0, T, stride, Dh);
  load_tile<kPadded>(dys, a.dy + head, p0, T, stride, Dh);
  const float norm = row_valid ? w.norm[head_rows + p] : 0.0f;
  const float delta = row_valid ? w.delta[head_rows + p] : 0.0f;

  float dp1[kLanes];
#pragma unroll
  for (int i = 0; i < kLanes; ++i) dp1[i] = 0.0f;

  const int64_t key_end = (p0 + kTile < T ? p0 + kTile : T) - 1;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous key tile's readers are done (and qs, dys are loaded)
    load_tile<kPadded>(ks, a.p2 + head, j0, T, stride, Dh);
    load_tile<kPadded>(vs, a.v + head, j0, T, stride, Dh);
    __syncthreads();

#pragma unroll 4
    for (int i = 0; i < kCols; ++i) {
      const int c = quad + kQuad * i;
      float du = 0.0f;
      if (row_valid && j0 + c < p)
        du = pair_grad(dot_row<kPadded>(qs + row * S, ks + c * S),
                       dot_row<kPadded>(dys + row * S, vs + c * S), scale, norm, delta)
                 .du;
      dus[row * kScoreStride + c] = du;
    }
    __syncwarp();

    for (int c = 0; c < kTile; ++c) {
      const float du = dus[row * kScoreStride + c];
#pragma unroll
      for (int i = 0; i < kLanes; ++i) dp1[i] = fmaf(du, ks[c * S + quad + kQuad * i], dp1[i]);
    }
  }

  if (row_valid) {
    const float self = a.stats[(head_rows + p) * kStats + kStatSelf];
    const float du_self = w.dr_self[head_rows + p] * self * (1.0f - self) * a.rule.inv_tau;
    const int64_t off = head + p * stride;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) {
      const int dd = quad + kQuad * i;
      if (dd < Dh)
        a.dp1[off + dd] = bf16_round(scale * fmaf(du_self, bf16_load(a.p2[off + dd]), dp1[i]));
    }
  }
}

// Decode: one block per (head, sequence); warp w scans the cached rows j ≡ w (mod 8) with its
// own online-softmax state, lane l holding the channels l + 32i; the warps' states are merged
// in a fixed order at the end.
constexpr int kDecodeThreads = 256;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeLanes = kRelationMaxHeadDim / 32;

__global__ void __launch_bounds__(kDecodeThreads)
    relation_decode_kernel(const RelationDecodeArgs a) {
  __shared__ float m_s[kDecodeWarps], l_s[kDecodeWarps];
  __shared__ float z_s[kDecodeWarps][kRelationMaxHeadDim];
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int Dh = static_cast<int>(a.Dh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pos = *a.pos;
  const int64_t row_off = (b * a.H + h) * Dh;
  const int64_t stride = a.H * Dh;
  const int64_t cache_head = (b * a.capacity * a.H + h) * Dh;  // row j at + j * stride
  const float scale = a.rule.scale;

  float p1[kDecodeLanes], p2[kDecodeLanes], v[kDecodeLanes];
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) {
    const int dd = lane + 32 * i;
    const bool in = dd < Dh;
    p1[i] = in ? bf16_load(a.p1[row_off + dd]) : 0.0f;
    p2[i] = in ? bf16_load(a.p2[row_off + dd]) : 0.0f;
    v[i] = in ? bf16_load(a.v[row_off + dd]) : 0.0f;
    if (warp == 0 && in) {
      a.cache_p2[cache_head + pos * stride + dd] = a.p2[row_off + dd];
      a.cache_v[cache_head + pos * stride + dd] = a.v[row_off + dd];
    }
  }
  float self_dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) self_dot = fmaf(p1[i], p2[i], self_dot);
  const float self = sigmoid(warp_sum(self_dot) * scale * a.rule.inv_tau);

  float m = -INFINITY, l = 0.0f, z[kDecodeLanes];
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) z[i] = 0.0f;
  for (int64_t j = warp; j < pos; j += kDecodeWarps) {
    const uint16_t* kr = a.cache_p2 + cache_head + j * stride;
    const uint16_t* vr = a.cache_v + cache_head + j * stride;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) {
      const int dd = lane + 32 * i;
      if (dd < Dh) s = fmaf(p1[i], bf16_load(kr[dd]), s);
    }
    const float u = warp_sum(s) * scale;
    const float e = u * sigmoid(u);
    const float m_new = fmaxf(m, e);
    const float alpha = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float wgt = expf(e - m_new);
    l = fmaf(l, alpha, wgt);
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) {
      const int dd = lane + 32 * i;
      const float vj = dd < Dh ? bf16_load(vr[dd]) : 0.0f;
      z[i] = fmaf(z[i], alpha, wgt * vj);
    }
    m = m_new;
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) {
    const int dd = lane + 32 * i;
    if (dd < Dh) z_s[warp][dd] = z[i];
  }
  __syncthreads();
  if (warp != 0) return;

  float y[kDecodeLanes];
  if (pos == 0) {  // no history: Y_0 = Ĩ_0 (exchange-only: 0)
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) y[i] = a.rule.exchange_only ? 0.0f : v[i];
  } else {
    float m_all = -INFINITY;
    for (int k = 0; k < kDecodeWarps; ++k) m_all = fmaxf(m_all, m_s[k]);
    float l_all = 0.0f, z_all[kDecodeLanes];
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) z_all[i] = 0.0f;
    for (int k = 0; k < kDecodeWarps; ++k) {
      const float w_k = l_s[k] > 0.0f ? expf(m_s[k] - m_all) : 0.0f;
      l_all = fmaf(l_s[k], w_k, l_all);
#pragma unroll
      for (int i = 0; i < kDecodeLanes; ++i) {
        const int dd = lane + 32 * i;
        if (dd < Dh) z_all[i] = fmaf(z_s[k][dd], w_k, z_all[i]);
      }
    }
    const float log_exchange = m_all + logf(l_all);
    const float gate = sigmoid(log_exchange - *a.lambda * logf(static_cast<float>(pos + 1)) - self);
    const float w_hist = gate / l_all, w_self = a.rule.exchange_only ? 0.0f : 1.0f - gate;
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) y[i] = fmaf(w_self, v[i], w_hist * z_all[i]);
  }
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) {
    const int dd = lane + 32 * i;
    if (dd < Dh) a.y[row_off + dd] = bf16_round(y[i]);
  }
}

// Dynamic shared memory of the kernels, in bytes.
template <int kPadded>
constexpr size_t forward_smem() {
  return sizeof(float) * (3 * kTile * kStride<kPadded> + kTile * kScoreStride);
}
template <int kPadded>
constexpr size_t dp2dv_smem() {
  return sizeof(float) * (4 * kTile * kStride<kPadded> + 2 * kTile * kScoreStride + 2 * kTile);
}
template <int kPadded>
constexpr size_t dp1_smem() {
  return sizeof(float) * (4 * kTile * kStride<kPadded> + kTile * kScoreStride);
}

// Above 48 KiB a kernel must opt in to its dynamic shared memory. The attribute is per device,
// so it is set at every launch (a host-side call: no synchronization, allowed while capturing).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

dim3 tile_grid(const RelationDims& d) {
  return dim3(static_cast<unsigned>((d.T + kTile - 1) / kTile), static_cast<unsigned>(d.H),
              static_cast<unsigned>(d.B));
}

}  // namespace

template <int kPadded>
void launch_relation_forward(const RelationForwardArgs& args, cudaStream_t stream) {
  const RelationDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.H == 0) return;
  auto kernel = relation_forward_kernel<kPadded>;
  constexpr size_t smem = forward_smem<kPadded>();
  allow_smem(kernel, smem);
  kernel<<<tile_grid(d), kThreads, smem, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

template <int kPadded>
void launch_relation_backward(const RelationBackwardArgs& args, cudaStream_t stream) {
  const RelationDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.H == 0) return;
  const BackwardWorkspace w = backward_workspace(args);
  relation_backward_rows_kernel<<<tile_grid(d), kThreads, 0, stream>>>(args, w);
  QV_CUDA_CHECK(cudaGetLastError());
  if (args.dlambda != nullptr) {
    relation_dlambda_kernel<<<1, kThreads, 0, stream>>>(
        w.partials, relation_backward_partials(d.B, d.T, d.H), args.dlambda);
    QV_CUDA_CHECK(cudaGetLastError());
  }
  auto dp2dv = relation_backward_dp2dv_kernel<kPadded>;
  auto dp1 = relation_backward_dp1_kernel<kPadded>;
  constexpr size_t dp2dv_bytes = dp2dv_smem<kPadded>(), dp1_bytes = dp1_smem<kPadded>();
  allow_smem(dp2dv, dp2dv_bytes);
  allow_smem(dp1, dp1_bytes);
  dp2dv<<<tile_grid(d), kThreads, dp2dv_bytes, stream>>>(args, w);
  QV_CUDA_CHECK(cudaGetLastError());
  dp1<<<tile_grid(d), kThreads, dp1_bytes, stream>>>(args, w);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_relation_decode(const RelationDecodeArgs& args, cudaStream_t stream) {
  if (args.B == 0 || args.H == 0) return;
  relation_decode_kernel<<<dim3(static_cast<unsigned>(args.H), static_cast<unsigned>(args.B)),
                           kDecodeThreads, 0, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

#define QUIVER_RELATION_INSTANTIATE(P)                                                \
  template void launch_relation_forward<P>(const RelationForwardArgs&, cudaStream_t); \
  template void launch_relation_backward<P>(const RelationBackwardArgs&, cudaStream_t);
QUIVER_RELATION_INSTANTIATE(16)
QUIVER_RELATION_INSTANTIATE(32)
QUIVER_RELATION_INSTANTIATE(48)
QUIVER_RELATION_INSTANTIATE(64)
QUIVER_RELATION_INSTANTIATE(80)
QUIVER_RELATION_INSTANTIATE(96)
QUIVER_RELATION_INSTANTIATE(112)
QUIVER_RELATION_INSTANTIATE(128)
#undef QUIVER_RELATION_INSTANTIATE

}  // namespace quiver::cuda::detail
