// Flash attention kernels (forward, backward) and their launchers; see attention.h for the
// contract and attention_launch.h for the launcher interface.
//
// Layout of work shared by all three kernels: a block of 256 threads owns one 64-row tile;
// tile row `row` = threadIdx.x / 4 belongs to the 4 consecutive lanes `quad` = threadIdx.x % 4
// of one warp. A thread computes the scores of its row against the columns quad + 4i
// (i < 16) of the other tile, and accumulates the head-width lanes quad + 4i (i < kPadded/4)
// of its row's output in registers. Row reductions (max, sum) are two shuffles in the quad.
// Tiles live in shared memory as fp32 with a row stride of kPadded + 1 (odd), so the rows read
// together fall in different banks.
#include <cmath>
#include <cstdint>

#include "cuda/attention_launch.h"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kTile = kAttentionTile;
constexpr int kThreads = 256;
constexpr int kQuad = kThreads / kTile;  // threads per tile row
constexpr int kCols = kTile / kQuad;     // score columns per thread
constexpr int kScoreStride = kTile + 1;  // row stride of a [64, 64] fp32 score tile

static_assert(kQuad == 4, "the row reductions below shuffle across 4 lanes");

// The score rule of softmax attention: s = scale · (q·k), keys visible causally (j <= p).
// The mixer owns the normalization (online softmax over the visible keys) and asks the rule
// only for visibility, the score of a dot product and its derivative. FlashRelation's rule
// (SiLU scores over the history j < p; its Self and count terms are applied around the mixer)
// plugs in here.
struct CausalSoftmaxRule {
  float scale;
  __device__ bool visible(int64_t p, int64_t j) const { return j <= p; }
  __device__ float score(float dot) const { return dot * scale; }
  __device__ float dscore(float) const { return scale; }  // d score / d dot
};

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

// D_p = dy_p · y_p in fp32, summed by the quad of row p (all 32 lanes of the warp must call
// it); 0 when `valid` is false.
__device__ float row_delta(const uint16_t* y_row, const uint16_t* dy_row, int Dh, int quad,
                           bool valid) {
  float s = 0.0f;
  if (valid)
    for (int d = quad; d < Dh; d += kQuad) s = fmaf(bf16_load(y_row[d]), bf16_load(dy_row[d]), s);
  return quad_sum(s);
}

// Forward. Grid (query tiles, Hq, B); tiles run heaviest (last) first.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const AttentionForwardArgs a, const Rule rule) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  float* qs = smem;                // [64, S] query tile
  float* ks = qs + kTile * S;      // [64, S] key tile
  float* vs = ks + kTile * S;      // [64, S] value tile
  float* ps = vs + kTile * S;      // [64, 65] probabilities (unnormalized) of the key tile

  const AttentionDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int64_t p = p0 + row;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;  // key row j at kb + j * kv_stride
  const uint16_t* vb = a.v + (b * T * d.Hkv + g) * Dh;

  load_tile<kPadded>(qs, a.q + (b * T * d.Hq + h) * Dh, p0, T, q_stride, Dh);

  float m = -INFINITY, l = 0.0f, acc[kLanes];
#pragma unroll
  for (int i = 0; i < kLanes; ++i) acc[i] = 0.0f;

  const int64_t key_end = p0 + kTile < T ? p0 + kTile : T;  // keys any row of the tile may see
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile's readers of ks, vs, ps are done
    load_tile<kPadded>(ks, kb, j0, T, kv_stride, Dh);
    load_tile<kPadded>(vs, vb, j0, T, kv_stride, Dh);
    __syncthreads();

    float s[kCols], tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = quad + kQuad * i;
      const int64_t j = j0 + c;
      float x = -INFINITY;
      if (j < T && rule.visible(p, j)) x = rule.score(dot_row<kPadded>(qs + row * S, ks + c * S));
      s[i] = x;
      tile_max = fmaxf(tile_max, x);
    }
    const float m_new = fmaxf(m, quad_max(tile_max));
    // m_new = -inf: the row has seen no visible key yet (possible for rules with a strict
    // mask); nothing to rescale then, and exp(-inf - -inf) must not produce NaN.
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
    __syncwarp();  // the row's probabilities, written by its quad, are read by the quad

#pragma unroll
    for (int i = 0; i < kLanes; ++i) acc[i] *= alpha;
    for (int c = 0; c < kTile; ++c) {
      const float pc = ps[row * kScoreStride + c];
#pragma unroll
      for (int i = 0; i < kLanes; ++i) acc[i] = fmaf(pc, vs[c * S + quad + kQuad * i], acc[i]);
    }
  }

  if (p < T) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    uint16_t* yr = a.y + ((b * T + p) * d.Hq + h) * Dh;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) {
      const int dd = quad + kQuad * i;
      if (dd < Dh) yr[dd] = bf16_round(acc[i] * inv);
    }
    if (quad == 0) a.lse[(b * d.Hq + h) * T + p] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
}

// dK, dV. Grid (key tiles, Hkv, B). Thread row = key row c; loops over the group's query
// heads and the query tiles at or after the key tile, so dk/dv are summed in a fixed order.
//   P_pj = exp(score_pj − lse_p), dS_pj = P_pj (dy_p·v_j − D_p) · score'(dot_pj)
//   dv_j = Σ_p P_pj dy_p,  dk_j = Σ_p dS_pj q_p.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(const AttentionBackwardArgs a, const Rule rule) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  float* ks = smem;                 // [64, S] key tile (fixed)
  float* vs = ks + kTile * S;       // [64, S] value tile (fixed)
  float* qs = vs + kTile * S;       // [64, S] query tile
  float* dys = qs + kTile * S;      // [64, S] dy tile
  float* ps = dys + kTile * S;      // [64 keys, 65] P^T
  float* dss = ps + kTile * kScoreStride;       // [64 keys, 65] dS^T
  float* lse_s = dss + kTile * kScoreStride;    // [64] lse of the query rows
  float* delta_s = lse_s + kTile;               // [64] D of the query rows

  const AttentionDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T, group = d.Hq / d.Hkv;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t g = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int c = row;
  const int64_t j = j0 + c;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;

  load_tile<kPadded>(ks, a.k + (b * T * d.Hkv + g) * Dh, j0, T, kv_stride, Dh);
  load_tile<kPadded>(vs, a.v + (b * T * d.Hkv + g) * Dh, j0, T, kv_stride, Dh);

  float dk[kLanes], dv[kLanes];
#pragma unroll
  for (int i = 0; i < kLanes; ++i) dk[i] = dv[i] = 0.0f;

  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const int64_t q_off = (b * T * d.Hq + h) * Dh;  // query row p at q_off + p * q_stride
    const float* lse_h = a.lse + (b * d.Hq + h) * T;
    // Causal: query rows p < j0 see none of this tile's keys; tiles are aligned, so the first
    // query tile that matters starts at j0.
    for (int64_t p0 = j0; p0 < T; p0 += kTile) {
      __syncthreads();  // the previous query tile's readers are done
      load_tile<kPadded>(qs, a.q + q_off, p0, T, q_stride, Dh);
      load_tile<kPadded>(dys, a.dy + q_off, p0, T, q_stride, Dh);
      {
        // Thread quad `row` computes D of query row p0 + row.
        const int64_t p = p0 + row;
        const bool valid = p < T;
        const int64_t off = q_off + (valid ? p : 0) * q_stride;
        const float delta = row_delta(a.y + off, a.dy + off, Dh, quad, valid);
        if (quad == 0) {
          delta_s[row] = delta;
          lse_s[row] = valid ? lse_h[p] : 0.0f;
        }
      }
      __syncthreads();

#pragma unroll 4
      for (int i = 0; i < kCols; ++i) {
        const int r = quad + kQuad * i;
        const int64_t p = p0 + r;
        float pr = 0.0f, dsr = 0.0f;
        if (p < T && j < T && rule.visible(p, j)) {
          const float dot = dot_row<kPadded>(qs + r * S, ks + c * S);
          pr = expf(rule.score(dot) - lse_s[r]);
          const float dp = dot_row<kPadded>(dys + r * S, vs + c * S);
          dsr = pr * (dp - delta_s[r]) * rule.dscore(dot);
        }
        ps[c * kScoreStride + r] = pr;
        dss[c * kScoreStride + r] = dsr;
      }
      __syncwarp();  // row c of P^T and dS^T, written by its quad, is read by the quad

      for (int r = 0; r < kTile; ++r) {
        const float pr = ps[c * kScoreStride + r], dsr = dss[c * kScoreStride + r];
#pragma unroll
        for (int i = 0; i < kLanes; ++i) {
          dv[i] = fmaf(pr, dys[r * S + quad + kQuad * i], dv[i]);
          dk[i] = fmaf(dsr, qs[r * S + quad + kQuad * i], dk[i]);
        }
      }
    }
  }

  if (j < T) {
    uint16_t* dkr = a.dk + ((b * T + j) * d.Hkv + g) * Dh;
    uint16_t* dvr = a.dv + ((b * T + j) * d.Hkv + g) * Dh;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) {
      const int dd = quad + kQuad * i;
      if (dd < Dh) {
        dkr[dd] = bf16_round(dk[i]);
        dvr[dd] = bf16_round(dv[i]);
      }
    }
  }
}

// dQ. Grid (query tiles, Hq, B); tiles run heaviest first. dq_p = Σ_j dS_pj k_j.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const AttentionBackwardArgs a, const Rule rule) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  float* qs = smem;               // [64, S] query tile (fixed)
  float* dys = qs + kTile * S;    // [64, S] dy tile (fixed)
  float* ks = dys + kTile * S;    // [64, S] key tile
  float* vs = ks + kTile * S;     // [64, S] value tile
  float* dss = vs + kTile * S;    // [64, 65] dS of the key tile

  const AttentionDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int64_t p = p0 + row;
  const bool row_valid = p < T;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t q_off = (b * T * d.Hq + h) * Dh;
  const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;
  const uint16_t* vb = a.v + (b * T * d.Hkv + g) * Dh;

  load_tile<kPadded>(qs, a.q + q_off, p0, T, q_stride, Dh);
  load_tile<kPadded>(dys, a.dy + q_off, p0, T, q_stride, Dh);
  const int64_t row_off = q_off + (row_valid ? p : 0) * q_stride;
  const float delta = row_delta(a.y + row_off, a.dy + row_off, Dh, quad, row_valid);
  const float lse = row_valid ? a.lse[(b * d.Hq + h) * T + p] : 0.0f;

  float dq[kLanes];
#pragma unroll
  for (int i = 0; i < kLanes; ++i) dq[i] = 0.0f;

  const int64_t key_end = p0 + kTile < T ? p0 + kTile : T;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous key tile's readers are done (and qs, dys are loaded)
    load_tile<kPadded>(ks, kb, j0, T, kv_stride, Dh);
    load_tile<kPadded>(vs, vb, j0, T, kv_stride, Dh);
    __syncthreads();

#pragma unroll 4
    for (int i = 0; i < kCols; ++i) {
      const int c = quad + kQuad * i;
      const int64_t j = j0 + c;
      float ds = 0.0f;
      if (row_valid && j < T && rule.visible(p, j)) {
        const float dot = dot_row<kPadded>(qs + row * S, ks + c * S);
        const float pr = expf(rule.score(dot) - lse);
        const float dp = dot_row<kPadded>(dys + row * S, vs + c * S);
        ds = pr * (dp - delta) * rule.dscore(dot);
      }
      dss[row * kScoreStride + c] = ds;
    }
    __syncwarp();

    for (int c = 0; c < kTile; ++c) {
      const float ds = dss[row * kScoreStride + c];
#pragma unroll
      for (int i = 0; i < kLanes; ++i) dq[i] = fmaf(ds, ks[c * S + quad + kQuad * i], dq[i]);
    }
  }

  if (row_valid) {
    uint16_t* dqr = a.dq + ((b * T + p) * d.Hq + h) * Dh;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) {
      const int dd = quad + kQuad * i;
      if (dd < Dh) dqr[dd] = bf16_round(dq[i]);
    }
  }
}

CausalSoftmaxRule softmax_rule(int64_t Dh) {
  return CausalSoftmaxRule{static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)))};
}

// Dynamic shared memory of the kernels, in bytes.
template <int kPadded>
constexpr size_t forward_smem() {
  return sizeof(float) * (3 * kTile * kStride<kPadded> + kTile * kScoreStride);
}
template <int kPadded>
constexpr size_t dkdv_smem() {
  return sizeof(float) * (4 * kTile * kStride<kPadded> + 2 * kTile * kScoreStride + 2 * kTile);
}
template <int kPadded>
constexpr size_t dq_smem() {
  return sizeof(float) * (4 * kTile * kStride<kPadded> + kTile * kScoreStride);
}

// Above 48 KiB a kernel must opt in to its dynamic shared memory. The attribute is per device,
// so it is set at every launch (a host-side call: no synchronization, allowed while capturing).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

}  // namespace

template <int kPadded>
void launch_attention_forward(const AttentionForwardArgs& args, cudaStream_t stream) {
  const AttentionDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.Hq == 0) return;
  auto kernel = attention_forward_kernel<kPadded, CausalSoftmaxRule>;
  constexpr size_t smem = forward_smem<kPadded>();
  allow_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>((d.T + kTile - 1) / kTile), static_cast<unsigned>(d.Hq),
                  static_cast<unsigned>(d.B));
  kernel<<<grid, kThreads, smem, stream>>>(args, softmax_rule(d.Dh));
  QV_CUDA_CHECK(cudaGetLastError());
}

template <int kPadded>
void launch_attention_backward(const AttentionBackwardArgs& args, cudaStream_t stream) {
  const AttentionDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.Hq == 0) return;
  auto dkdv = attention_backward_dkdv_kernel<kPadded, CausalSoftmaxRule>;
  auto dq = attention_backward_dq_kernel<kPadded, CausalSoftmaxRule>;
  constexpr size_t dkdv_bytes = dkdv_smem<kPadded>(), dq_bytes = dq_smem<kPadded>();
  allow_smem(dkdv, dkdv_bytes);
  allow_smem(dq, dq_bytes);
  const unsigned tiles = static_cast<unsigned>((d.T + kTile - 1) / kTile);
  const CausalSoftmaxRule rule = softmax_rule(d.Dh);
  dkdv<<<dim3(tiles, static_cast<unsigned>(d.Hkv), static_cast<unsigned>(d.B)), kThreads,
         dkdv_bytes, stream>>>(args, rule);
  QV_CUDA_CHECK(cudaGetLastError());
  dq<<<dim3(tiles, static_cast<unsigned>(d.Hq), static_cast<unsigned>(d.B)), kThreads, dq_bytes,
       stream>>>(args, rule);
  QV_CUDA_CHECK(cudaGetLastError());
}

#define QUIVER_ATTENTION_INSTANTIATE(P)                                                    \
  template void launch_attention_forward<P>(const AttentionForwardArgs&, cudaStream_t); \
  template void launch_attention_backward<P>(const AttentionBackwardArgs&, cudaStream_t);
QUIVER_ATTENTION_INSTANTIATE(16)
QUIVER_ATTENTION_INSTANTIATE(32)
QUIVER_ATTENTION_INSTANTIATE(48)
QUIVER_ATTENTION_INSTANTIATE(64)
QUIVER_ATTENTION_INSTANTIATE(80)
QUIVER_ATTENTION_INSTANTIATE(96)
QUIVER_ATTENTION_INSTANTIATE(112)
QUIVER_ATTENTION_INSTANTIATE(128)
#undef QUIVER_ATTENTION_INSTANTIATE

}  // namespace quiver::cuda::detail
