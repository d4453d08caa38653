// Linear Relation kernels (chunkwise forward and backward, decode step, retention-gate
// element-wise parts) and their launchers; see linear_relation.h for the contract and
// linear_relation_launch.h for the launcher interface.
//
// Notation per head, as in src/ops/linear_relation.cpp: q_t = S_t p̂1_t, k_t = p̂2_t,
// w_t = S_t v_t; inside a chunk G_i = Σ_{u<=i} g_u (from the chunk start, non-increasing),
// Γ = G of the chunk's last row. For the chunk with entering state C:
//   E_i    = (q_i ⊙ e^{G_i})ᵀ C + Σ_{j<i} A_ij w_j,   A_ij = Σ_r q_i[r] k_j[r] e^{G_i[r]−G_j[r]}
//   C_next = Diag(e^Γ) C + ΔC,                          ΔC = Σ_j (k_j ⊙ e^{Γ−G_j}) w_jᵀ
// Every exponent is G_i − G_j with j <= i (or Γ − G_j, or G_i): never positive. G is an fp32
// running sum of values <= 0, so it is non-increasing and each difference is <= 0 exactly.
//
// The chunks are independent given their entering states, so both passes are chunk-parallel:
//   forward:  chunk_delta (ΔC, e^Γ per chunk) -> chunk_scan (entering states, in place)
//             -> chunk_output (y per chunk);
//   backward: chunk_delta (ΔC and ΔD = Σ_i (q_i ⊙ e^{G_i}) dE_iᵀ) -> chunk_scan forward (states)
//             and reverse (D_c = dL/dC after chunk c: D_{c−1} = Diag(e^Γ_c) D_c + ΔD_c)
//             -> chunk_grad (all input gradients of a chunk).
// A chunk block has 256 threads; token row `row` = threadIdx.x / 4 belongs to the 4 lanes
// `quad` = threadIdx.x % 4, which hold the head-width lanes quad + 4n (n < kPadded / 4) of
// that row in registers. Chunk tiles live in shared memory as fp32 with a row stride of
// kPadded + 4 (≡ 4 or 20 mod 32), so 8 rows × 4 lanes of a warp hit 32 distinct banks.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/linear_relation_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kL = kLinearRelationChunk;
constexpr int kThreads = 256;
constexpr int kQuad = kThreads / kL;     // threads per token row
constexpr int kScoreStride = kL + 1;     // row stride of a [64, 64] score tile
constexpr int kStateTileRows = 16;       // state rows staged in shared memory at a time
constexpr float kNormEps = 1e-12f;       // ops::kLinearRelationNormEps

static_assert(kQuad == 4, "the row reductions below shuffle across 4 lanes");

template <int kPadded>
constexpr int kStride = kPadded + 4;

__device__ __forceinline__ float sigmoid(float u) {
  if (u >= 0.0f) return 1.0f / (1.0f + expf(-u));
  const float e = expf(u);
  return e / (1.0f + e);
}

__device__ __forceinline__ float softplus(float z) {
  return fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)));
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The shared tiles of one chunk (rows i < 64, lanes < kPadded; rows past the sequence and lanes
// past Dh are zero, except G, which stays at the last real row's value past the sequence).
template <int kPadded>
struct ChunkTiles {
  static constexpr int kFloats = 4 * kL * kStride<kPadded> + 3 * kL;
  float* p1h;    // [64, stride] p̂1
  float* k;      // [64, stride] p̂2
  float* G;      // [64, stride] cumulative log-decay from the chunk start
  float* v;      // [64, stride]
  float* gate;   // [64] S
  float* norm1;  // [64] ‖p1‖ (unclamped)
  float* norm2;  // [64] ‖p2‖

  __device__ static ChunkTiles carve(float* smem) {
    constexpr int tile = kL * kStride<kPadded>;
    return {smem, smem + tile, smem + 2 * tile, smem + 3 * tile, smem + 4 * tile,
            smem + 4 * tile + kL, smem + 4 * tile + 2 * kL};
  }
};

// Position of one chunk: head (b, h), tokens [t0, t0 + len), row t of a [B, T, H, Dh] tensor
// at base + t · row_stride.
struct ChunkPos {
  int64_t bh, chunk, t0, base, row_stride;
  int len, Dh;

  __device__ static ChunkPos of_block(const LinearRelationDims& d) {
    ChunkPos c;
    const int64_t h = blockIdx.y, b = blockIdx.z;
    c.bh = b * d.H + h;
    c.chunk = blockIdx.x;
    c.t0 = c.chunk * kL;
    c.len = static_cast<int>(d.T - c.t0 < kL ? d.T - c.t0 : kL);
    c.Dh = static_cast<int>(d.Dh);
    c.row_stride = d.H * d.Dh;
    c.base = (b * d.T + c.t0) * c.row_stride + h * d.Dh;
    return c;
  }
  __device__ int64_t slot(int64_t chunks) const { return bh * chunks + chunk; }
};

// Loads a chunk into the tiles (and dy into dE when given), normalizes p1 and p2, computes
// the gates and the cumulative log-decay. Ends with a barrier.
template <int kPadded>
__device__ void load_chunk(const ChunkTiles<kPadded>& s, float* dE, const LinearRelationArgs& a,
                           const ChunkPos& c) {
  constexpr int S = kStride<kPadded>;
  for (int idx = threadIdx.x; idx < kL * kPadded; idx += kThreads) {
    const int i = idx / kPadded, d = idx % kPadded;
    float x1 = 0.0f, x2 = 0.0f, xv = 0.0f, xg = 0.0f, xe = 0.0f;
    if (i < c.len && d < c.Dh) {
      const int64_t o = c.base + i * c.row_stride + d;
      x1 = bf16_load(a.p1[o]);
      x2 = bf16_load(a.p2[o]);
      xv = bf16_load(a.v[o]);
      xg = a.g[o];
      if (dE) xe = bf16_load(a.dy[o]);
    }
    const int o = i * S + d;
    s.p1h[o] = x1;
    s.k[o] = x2;
    s.v[o] = xv;
    s.G[o] = xg;
    if (dE) dE[o] = xe;
  }
  __syncthreads();
  // One warp per token row: S = sigmoid(p1·p2 · gate_scale), p̂ = p / max(‖p‖, eps).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < kL; i += kThreads / 32) {
    float dot = 0.0f, n1 = 0.0f, n2 = 0.0f;
    for (int d = lane; d < kPadded; d += 32) {
      const float x1 = s.p1h[i * S + d], x2 = s.k[i * S + d];
      dot = fmaf(x1, x2, dot);
      n1 = fmaf(x1, x1, n1);
      n2 = fmaf(x2, x2, n2);
    }
    dot = warp_sum(dot);
    const float norm1 = sqrtf(warp_sum(n1)), norm2 = sqrtf(warp_sum(n2));
    const float inv1 = 1.0f / fmaxf(norm1, kNormEps), inv2 = 1.0f / fmaxf(norm2, kNormEps);
    for (int d = lane; d < kPadded; d += 32) {
      s.p1h[i * S + d] *= inv1;
      s.k[i * S + d] *= inv2;
    }
    if (lane == 0) {
      s.gate[i] = sigmoid(dot * a.gate_scale);
      s.norm1[i] = norm1;
      s.norm2[i] = norm2;
    }
  }
  if (threadIdx.x < kPadded) {
    float acc = 0.0f;
    for (int i = 0; i < kL; ++i) {
      acc += s.G[i * S + threadIdx.x];
      s.G[i * S + threadIdx.x] = acc;
    }
  }
  __syncthreads();
}

// A[i][j] = S_i Σ_r p̂1_i[r] p̂2_j[r] e^{G_i[r] − G_j[r]} (= q_i·k_j with decay) for j < i and 0
// otherwise; this thread writes the columns quad + 4m of row i.
template <int kPadded>
__device__ void intra_scores(const ChunkTiles<kPadded>& s, float* A, int i, int quad) {
  constexpr int S = kStride<kPadded>;
  const float* pi = s.p1h + i * S;
  const float* gi = s.G + i * S;
  for (int m = 0; m < kL / kQuad; ++m) {
    const int j = quad + kQuad * m;
    float dot = 0.0f;
    if (j < i) {
      const float* kj = s.k + j * S;
      const float* gj = s.G + j * S;
#pragma unroll 8
      for (int r = 0; r < kPadded; ++r) dot = fmaf(pi[r] * kj[r], expf(gi[r] - gj[r]), dot);
    }
    A[i * kScoreStride + j] = s.gate[i] * dot;
  }
}

// dst[rr][c] = state[r0 + rr][c] for rr < 16, c < kPadded; zero past Dh.
template <int kPadded>
__device__ void load_state_rows(float* dst, const float* state, int r0, int Dh) {
  constexpr int S = kStride<kPadded>;
  for (int idx = threadIdx.x; idx < kStateTileRows * kPadded; idx += kThreads) {
    const int rr = idx / kPadded, c = idx % kPadded, r = r0 + rr;
    dst[rr * S + c] = r < Dh && c < Dh ? state[r * Dh + c] : 0.0f;
  }
}

// Per chunk: ΔC into states[slot], e^Γ into decays[slot] and, when dy is given, ΔD into
// dstates[slot]. Thread (row, quad) computes the state rows row + 64·pass, columns quad + 4n.
template <int kPadded>
__global__ void __launch_bounds__(kThreads) chunk_delta_kernel(const LinearRelationArgs a) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  const ChunkTiles<kPadded> s = ChunkTiles<kPadded>::carve(smem);
  float* dE = a.dy ? smem + ChunkTiles<kPadded>::kFloats : nullptr;  // [64, stride]
  const ChunkPos c = ChunkPos::of_block(a.dims);
  load_chunk<kPadded>(s, dE, a, c);

  const int Dh = c.Dh;
  const int64_t slot = c.slot(a.dims.chunks), dd = static_cast<int64_t>(Dh) * Dh;
  const float* gend = s.G + (kL - 1) * S;
  if (threadIdx.x < Dh) a.ws.decays[slot * Dh + threadIdx.x] = expf(gend[threadIdx.x]);
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
#pragma unroll 1
  for (int r = row; r < Dh; r += kL) {
    float acc[kLanes];
#pragma unroll
    for (int n = 0; n < kLanes; ++n) acc[n] = 0.0f;
    for (int j = 0; j < c.len; ++j) {
      const float kw = s.k[j * S + r] * expf(gend[r] - s.G[j * S + r]) * s.gate[j];
#pragma unroll
      for (int n = 0; n < kLanes; ++n) acc[n] = fmaf(kw, s.v[j * S + quad + kQuad * n], acc[n]);
    }
    float* out = a.ws.states + slot * dd + static_cast<int64_t>(r) * Dh;
#pragma unroll
    for (int n = 0; n < kLanes; ++n)
      if (quad + kQuad * n < Dh) out[quad + kQuad * n] = acc[n];
    if (!dE) continue;
#pragma unroll
    for (int n = 0; n < kLanes; ++n) acc[n] = 0.0f;
    for (int i = 0; i < c.len; ++i) {
      const float qd = s.gate[i] * s.p1h[i * S + r] * expf(s.G[i * S + r]);
#pragma unroll
      for (int n = 0; n < kLanes; ++n) acc[n] = fmaf(qd, dE[i * S + quad + kQuad * n], acc[n]);
    }
    out = a.ws.dstates + slot * dd + static_cast<int64_t>(r) * Dh;
#pragma unroll
    for (int n = 0; n < kLanes; ++n)
      if (quad + kQuad * n < Dh) out[quad + kQuad * n] = acc[n];
  }
}

// Scan over the chunks of one head, one thread per state element: buf holds each chunk's
// delta on entry and, on exit, the value before that chunk's step (forward: the state entering
// the chunk; reverse: dL/dC after it). s ← e^Γ ⊙ s + delta; the last s goes to `last` if given.
__global__ void __launch_bounds__(kThreads)
    chunk_scan_kernel(float* buf, const float* decays, float* last, int64_t chunks, int Dh,
                      bool reverse) {
  const int64_t dd = static_cast<int64_t>(Dh) * Dh;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t bh = blockIdx.y;
  if (e >= dd) return;
  float* col = buf + bh * chunks * dd + e;
  const float* decay_row = decays + bh * chunks * Dh + e / Dh;
  constexpr int kBatch = 8;  // loads issued ahead of the dependent chain
  float s = 0.0f;
  for (int64_t c0 = 0; c0 < chunks; c0 += kBatch) {
    float delta[kBatch], decay[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t step = c0 + u, c = reverse ? chunks - 1 - step : step;
      if (step < chunks) {
        delta[u] = col[c * dd];
        decay[u] = decay_row[c * Dh];
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t step = c0 + u, c = reverse ? chunks - 1 - step : step;
      if (step < chunks) {
        col[c * dd] = s;
        s = fmaf(decay[u], s, delta[u]);
      }
    }
  }
  if (last) last[bh * dd + e] = s;
}

// y of one chunk from its entering state: y_i = v_i + Σ_{j<i} A_ij S_j v_j + (q_i ⊙ e^{G_i})ᵀ C.
template <int kPadded>
__global__ void __launch_bounds__(kThreads) chunk_output_kernel(const LinearRelationArgs a) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  const ChunkTiles<kPadded> s = ChunkTiles<kPadded>::carve(smem);
  float* A = smem + ChunkTiles<kPadded>::kFloats;  // [64, 65]
  float* Ct = A + kL * kScoreStride;                // [16, stride] rows of C
  const ChunkPos c = ChunkPos::of_block(a.dims);
  load_chunk<kPadded>(s, nullptr, a, c);

  const int i = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  intra_scores<kPadded>(s, A, i, quad);
  __syncthreads();

  float acc[kLanes];
#pragma unroll
  for (int n = 0; n < kLanes; ++n) acc[n] = s.v[i * S + quad + kQuad * n];
  for (int j = 0; j < i; ++j) {
    const float aw = A[i * kScoreStride + j] * s.gate[j];
#pragma unroll
    for (int n = 0; n < kLanes; ++n) acc[n] = fmaf(aw, s.v[j * S + quad + kQuad * n], acc[n]);
  }

  const float* C = a.ws.states + c.slot(a.dims.chunks) * c.Dh * c.Dh;
  const float qscale = s.gate[i];
#pragma unroll 1
  for (int r0 = 0; r0 < kPadded; r0 += kStateTileRows) {
    __syncthreads();  // the previous rows are consumed
    load_state_rows<kPadded>(Ct, C, r0, c.Dh);
    __syncthreads();
#pragma unroll 4
    for (int rr = 0; rr < kStateTileRows; ++rr) {
      const int r = r0 + rr;
      const float qd = qscale * s.p1h[i * S + r] * expf(s.G[i * S + r]);
#pragma unroll
      for (int n = 0; n < kLanes; ++n) acc[n] = fmaf(qd, Ct[rr * S + quad + kQuad * n], acc[n]);
    }
  }

  if (i < c.len) {
    uint16_t* yr = a.y + c.base + i * c.row_stride;
#pragma unroll
    for (int n = 0; n < kLanes; ++n) {
      const int d = quad + kQuad * n;
      if (d < c.Dh) yr[d] = bf16_round(acc[n]);
    }
  }
}

// p̂ = p / max(‖p‖, eps) backward for one lane: dp from dp̂, with proj = p·dp̂ (whole row).
__device__ __forceinline__ float normalize_backward(float p, float dphat, float norm, float proj) {
  if (norm > kNormEps) {
    const float inv = 1.0f / norm;
    return (dphat - p * (proj * inv * inv)) * inv;
  }
  return dphat / kNormEps;
}

// Every input gradient of one chunk, given its entering state C (states[slot]), D = dL/dC after
// it (dstates[slot]) and the state after it (states[slot + 1], for dΓ):
//   dq_i = e^{G_i} ⊙ (C dE_i) + Σ_{j<i} dA_ij k_j ⊙ e^{G_i−G_j},          dA_ij = dE_i·w_j
//   dk_j = e^{Γ−G_j} ⊙ (D w_j) + Σ_{i>j} dA_ij q_i ⊙ e^{G_i−G_j}
//   dw_j = Dᵀ (k_j ⊙ e^{Γ−G_j}) + Σ_{i>j} A_ij dE_i
//   dG_i = q_i ⊙ dq_i − k_i ⊙ dk_i,   dΓ[r] = Σ_c D[r,c] C_next[r,c]   (the decay of C and the
//   writes' e^Γ together), dg_u = Σ_{i>=u} dG_i + dΓ;
// then through w = S v, q = S p̂1, k = p̂2, the normalizations and the gate.
template <int kPadded>
__global__ void __launch_bounds__(kThreads) chunk_grad_kernel(const LinearRelationArgs a) {
  constexpr int S = kStride<kPadded>;
  constexpr int kLanes = kPadded / kQuad;
  extern __shared__ float smem[];
  const ChunkTiles<kPadded> s = ChunkTiles<kPadded>::carve(smem);
  float* dE = smem + ChunkTiles<kPadded>::kFloats;  // [64, stride] dy
  float* A = dE + kL * S;                            // [64, 65]
  float* dA = A + kL * kScoreStride;                 // [64, 65]
  float* dgam = dA + kL * kScoreStride;              // [kPadded]
  float* Ct = A;                                     // [16, stride] rows of C, after A, dA
  float* Dt = A + kStateTileRows * S;                // [16, stride] rows of D
  const ChunkPos c = ChunkPos::of_block(a.dims);
  load_chunk<kPadded>(s, dE, a, c);

  const int Dh = c.Dh;
  const int64_t dd = static_cast<int64_t>(Dh) * Dh;
  const float* C = a.ws.states + c.slot(a.dims.chunks) * dd;
  const float* D = a.ws.dstates + c.slot(a.dims.chunks) * dd;
  {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool has_next = c.chunk + 1 < a.dims.chunks;  // else D = 0
    for (int r = warp; r < kPadded; r += kThreads / 32) {
      float sum = 0.0f;
      if (has_next && r < Dh)
        for (int col = lane; col < Dh; col += 32)
          sum = fmaf(D[r * Dh + col], C[dd + r * Dh + col], sum);
      sum = warp_sum(sum);
      if (lane == 0) dgam[r] = sum;
    }
  }

  const int t = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  intra_scores<kPadded>(s, A, t, quad);
  for (int m = 0; m < kL / kQuad; ++m) {
    const int j = quad + kQuad * m;
    float dot = 0.0f;
    if (j < t)
#pragma unroll 8
      for (int d = 0; d < kPadded; ++d) dot = fmaf(dE[t * S + d], s.v[j * S + d], dot);
    dA[t * kScoreStride + j] = dot * s.gate[j];
  }
  __syncthreads();

  const float* Gt = s.G + t * S;
  const float* gend = s.G + (kL - 1) * S;
  float dq[kLanes], dk[kLanes], dw[kLanes];
#pragma unroll
  for (int n = 0; n < kLanes; ++n) dq[n] = dk[n] = dw[n] = 0.0f;
  for (int j = 0; j < t; ++j) {
    const float da = dA[t * kScoreStride + j];
#pragma unroll
    for (int n = 0; n < kLanes; ++n) {
      const int r = quad + kQuad * n;
      dq[n] = fmaf(da * s.k[j * S + r], expf(Gt[r] - s.G[j * S + r]), dq[n]);
    }
  }
  for (int i = t + 1; i < c.len; ++i) {
    const float daq = dA[i * kScoreStride + t] * s.gate[i];
    const float ai = A[i * kScoreStride + t];
#pragma unroll
    for (int n = 0; n < kLanes; ++n) {
      const int r = quad + kQuad * n;
      dk[n] = fmaf(daq * s.p1h[i * S + r], expf(s.G[i * S + r] - Gt[r]), dk[n]);
      dw[n] = fmaf(ai, dE[i * S + r], dw[n]);
    }
  }

  // Through the state: 16 rows of C and D at a time.
#pragma unroll
  for (int r0 = 0; r0 < kPadded; r0 += kStateTileRows) {
    __syncthreads();  // A, dA or the previous rows are consumed
    load_state_rows<kPadded>(Ct, C, r0, Dh);
    load_state_rows<kPadded>(Dt, D, r0, Dh);
    __syncthreads();
#pragma unroll
    for (int m = 0; m < kStateTileRows / kQuad; ++m) {
      const int rr = quad + kQuad * m, r = r0 + rr, n = r0 / kQuad + m;  // r = quad + 4n
      float sq = 0.0f, sk = 0.0f;
#pragma unroll 8
      for (int d = 0; d < kPadded; ++d) {
        sq = fmaf(dE[t * S + d], Ct[rr * S + d], sq);
        sk = fmaf(s.v[t * S + d], Dt[rr * S + d], sk);
      }
      dq[n] = fmaf(expf(Gt[r]), sq, dq[n]);
      dk[n] = fmaf(s.gate[t] * expf(gend[r] - Gt[r]), sk, dk[n]);
    }
#pragma unroll 4
    for (int rr = 0; rr < kStateTileRows; ++rr) {
      const int r = r0 + rr;
      const float kd = s.k[t * S + r] * expf(gend[r] - Gt[r]);
#pragma unroll
      for (int n = 0; n < kLanes; ++n) dw[n] = fmaf(kd, Dt[rr * S + quad + kQuad * n], dw[n]);
    }
  }

  // dg: dG rows overwrite G (no longer read), then a reverse running sum per lane.
  const float St = s.gate[t];
  __syncthreads();
#pragma unroll
  for (int n = 0; n < kLanes; ++n) {
    const int r = quad + kQuad * n;
    s.G[t * S + r] = St * s.p1h[t * S + r] * dq[n] - s.k[t * S + r] * dk[n];
  }
  __syncthreads();
  if (threadIdx.x < kPadded) {
    float acc = dgam[threadIdx.x];
    for (int i = kL - 1; i >= 0; --i) {
      acc += s.G[i * S + threadIdx.x];
      s.G[i * S + threadIdx.x] = acc;
    }
  }
  __syncthreads();

  // Per token: dS = dq·p̂1 + dw·v, dv = dE + S dw, dp̂1 = S dq, dp̂2 = dk.
  const bool valid = t < c.len;
  const int64_t o = c.base + t * c.row_stride;
  float dS = 0.0f, proj1 = 0.0f, proj2 = 0.0f;
#pragma unroll
  for (int n = 0; n < kLanes; ++n) {
    const int r = quad + kQuad * n;
    dS = fmaf(dq[n], s.p1h[t * S + r], dS);
    dS = fmaf(dw[n], s.v[t * S + r], dS);
    if (valid && r < Dh) {
      proj1 = fmaf(bf16_load(a.p1[o + r]), St * dq[n], proj1);
      proj2 = fmaf(bf16_load(a.p2[o + r]), dk[n], proj2);
    }
  }
  dS = quad_sum(dS);
  proj1 = quad_sum(proj1);
  proj2 = quad_sum(proj2);
  if (!valid) return;
  const float du = dS * St * (1.0f - St) * a.gate_scale;
  const float n1 = s.norm1[t], n2 = s.norm2[t];
#pragma unroll
  for (int n = 0; n < kLanes; ++n) {
    const int r = quad + kQuad * n;
    if (r >= Dh) continue;
    const float x1 = bf16_load(a.p1[o + r]), x2 = bf16_load(a.p2[o + r]);
    a.dp1[o + r] = bf16_round(normalize_backward(x1, St * dq[n], n1, proj1) + du * x2);
    a.dp2[o + r] = bf16_round(normalize_backward(x2, dk[n], n2, proj2) + du * x1);
    a.dv[o + r] = bf16_round(dE[t * S + r] + St * dw[n]);
    a.dg[o + r] = s.G[t * S + r];
  }
}

// One decode step. Grid (B·H, column tiles of 32); block 32 columns × 8 row groups. Each
// thread updates the state rows y, y + 8, ... of its column and sums its part of E; the 8
// parts are added in a fixed order.
constexpr int kDecodeCols = 32;
constexpr int kDecodeRowGroups = 8;

__global__ void __launch_bounds__(kDecodeCols * kDecodeRowGroups)
    decode_step_kernel(const uint16_t* p1, const uint16_t* p2, const uint16_t* v, const float* g,
                       float* state, uint16_t* y, int Dh, float gate_scale) {
  __shared__ float q[kLinearRelationMaxHeadDim], k[kLinearRelationMaxHeadDim],
      alpha[kLinearRelationMaxHeadDim];
  __shared__ float partial[kDecodeRowGroups][kDecodeCols];
  __shared__ float gate_inv[3];
  const int64_t bh = blockIdx.x, o = bh * Dh;
  const int x = threadIdx.x % kDecodeCols, ry = threadIdx.x / kDecodeCols;
  if (ry == 0) {
    float dot = 0.0f, n1 = 0.0f, n2 = 0.0f;
    for (int r = x; r < Dh; r += kDecodeCols) {
      const float x1 = bf16_load(p1[o + r]), x2 = bf16_load(p2[o + r]);
      dot = fmaf(x1, x2, dot);
      n1 = fmaf(x1, x1, n1);
      n2 = fmaf(x2, x2, n2);
    }
    dot = warp_sum(dot);
    n1 = warp_sum(n1);
    n2 = warp_sum(n2);
    if (x == 0) {
      gate_inv[0] = sigmoid(dot * gate_scale);
      gate_inv[1] = 1.0f / fmaxf(sqrtf(n1), kNormEps);
      gate_inv[2] = 1.0f / fmaxf(sqrtf(n2), kNormEps);
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < Dh; r += blockDim.x) {
    q[r] = gate_inv[0] * (bf16_load(p1[o + r]) * gate_inv[1]);
    k[r] = gate_inv[0] * (bf16_load(p2[o + r]) * gate_inv[2]);
    alpha[r] = expf(g[o + r]);
  }
  __syncthreads();
  const int col = blockIdx.y * kDecodeCols + x;
  float e = 0.0f, vc = 0.0f;
  if (col < Dh) {
    vc = bf16_load(v[o + col]);
    float* Cc = state + bh * Dh * Dh + col;
    for (int r = ry; r < Dh; r += kDecodeRowGroups) {
      const float cm = alpha[r] * Cc[r * Dh];
      e = fmaf(q[r], cm, e);
      Cc[r * Dh] = fmaf(k[r], vc, cm);
    }
  }
  partial[ry][x] = e;
  __syncthreads();
  if (ry == 0 && col < Dh) {
    float E = 0.0f;
    for (int u = 0; u < kDecodeRowGroups; ++u) E += partial[u][x];
    y[o + col] = bf16_round(vc + E);
  }
}

__global__ void retention_gate_activation_kernel(float* g, const float* a_log,
                                                 const float* dt_bias, int64_t n, int64_t HD,
                                                 int64_t Dh) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % HD;
    g[idx] = -expf(a_log[j / Dh]) * softplus(g[idx] + dt_bias[j]);
  }
}

// One block per head h: 32 columns × 16 row groups over the head's columns, each thread summing
// its rows in order; the row groups are then added in a fixed order.
constexpr int kGateCols = 32;
constexpr int kGateRowGroups = 16;
constexpr int kGateThreads = kGateCols * kGateRowGroups;

// The gate's backward reduces over all N rows. Stage 1: block (h, r) takes rows
// [r·per, (r+1)·per) of head h, writes dz in place and its partial sums (dt_bias per column in
// float, a_log in double) to the scratch; stage 2 adds the R partials of each column and
// head in order. The scratch layout: R × HD floats (dt_bias), then R × H doubles (a_log).

// Row chunks per head: about 256 rows each, at most 1024, and as many as the scratch holds.
int64_t gate_row_chunks(int64_t N, int64_t H, int64_t Dh, size_t scratch_bytes) {
  const int64_t fit = (static_cast<int64_t>(scratch_bytes) - 8) / (H * Dh * 4 + H * 8);
  return std::max<int64_t>(1, std::min<int64_t>({(N + 255) / 256, 1024, fit}));
}

struct GatePartials {
  float* bias;  // [R][HD]
  double* da;   // [R][H], after the bias partials (8-byte aligned)
};
__device__ __forceinline__ GatePartials gate_partials(unsigned char* scratch, int64_t R, int64_t HD) {
  return {reinterpret_cast<float*>(scratch), reinterpret_cast<double*>(scratch + ((R * HD * 4 + 7) / 8) * 8)};
}

__global__ void __launch_bounds__(kGateThreads)
    retention_gate_backward_kernel(uint16_t* dr, const float* dg, const float* a_log,
                                   const float* dt_bias, int64_t N, int64_t H, int64_t Dh, int64_t R,
                                   unsigned char* scratch_bytes) {
  __shared__ float partial[kGateRowGroups][kGateCols];
  __shared__ double scratch[kGateThreads / 32];
  const int64_t h = blockIdx.x, r = blockIdx.y, HD = H * Dh;
  const int64_t per = (N + R - 1) / R, n0 = r * per, n1 = min(N, n0 + per);
  const GatePartials part = gate_partials(scratch_bytes, R, HD);
  const int x = threadIdx.x % kGateCols, ry = threadIdx.x / kGateCols;
  const float A = expf(a_log[h]);
  double da = 0.0;
  for (int64_t c0 = 0; c0 < Dh; c0 += kGateCols) {
    const int64_t col = h * Dh + c0 + x;
    const bool active = c0 + x < Dh;
    float dbias = 0.0f;
    if (active) {
      const float bias = dt_bias[col];
      for (int64_t n = n0 + ry; n < n1; n += kGateRowGroups) {
        const int64_t idx = n * HD + col;
        const float z = bf16_load(dr[idx]) + bias, dgv = dg[idx];
        da += static_cast<double>(dgv * (-A * softplus(z)));
        const float dz = -dgv * A * sigmoid(z);
        dbias += dz;
        dr[idx] = bf16_round(dz);
      }
    }
    partial[ry][x] = dbias;
    __syncthreads();
    if (ry == 0 && active) {
      float sum = 0.0f;
      for (int u = 0; u < kGateRowGroups; ++u) sum += partial[u][x];
      part.bias[r * HD + col] = sum;
    }
    __syncthreads();
  }
  const double total = block_sum_double(da, scratch);
  if (threadIdx.x == 0) part.da[r * H + h] = total;
}

__global__ void retention_gate_backward_sum_kernel(float* da_log, float* ddt_bias, int64_t H, int64_t Dh,
                                                   int64_t R, unsigned char* scratch_bytes) {
  const int64_t HD = H * Dh, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const GatePartials part = gate_partials(scratch_bytes, R, HD);
  if (i < HD) {
    float sum = 0.0f;
    for (int64_t r = 0; r < R; ++r) sum += part.bias[r * HD + i];
    ddt_bias[i] += sum;
  } else if (i < HD + H) {
    const int64_t h = i - HD;
    double sum = 0.0;
    for (int64_t r = 0; r < R; ++r) sum += part.da[r * H + h];
    da_log[h] += static_cast<float>(sum);
  }
}

template <int kPadded>
constexpr size_t delta_smem(bool with_dy) {
  return sizeof(float) *
         (ChunkTiles<kPadded>::kFloats + (with_dy ? kL * kStride<kPadded> : 0));
}
template <int kPadded>
constexpr size_t output_smem() {
  return sizeof(float) * (ChunkTiles<kPadded>::kFloats + kL * kScoreStride +
                          kStateTileRows * kStride<kPadded>);
}
template <int kPadded>
constexpr size_t grad_smem() {
  return sizeof(float) * (ChunkTiles<kPadded>::kFloats + kL * kStride<kPadded> +
                          2 * kL * kScoreStride + kPadded);
}
static_assert(2 * kStateTileRows * kStride<kLinearRelationMaxHeadDim> <= 2 * kL * kScoreStride,
              "the state rows of the backward reuse the score tiles");
static_assert(grad_smem<kLinearRelationMaxHeadDim>() <= 227 * 1024,
              "the backward's tiles must fit the opt-in shared memory of sm_90");

// Above 48 KiB a kernel must opt in to its dynamic shared memory; the attribute is per device,
// so it is set at every launch (a host-side call, allowed while capturing).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

dim3 chunk_grid(const LinearRelationDims& d) {
  return dim3(static_cast<unsigned>(d.chunks), static_cast<unsigned>(d.H),
              static_cast<unsigned>(d.B));
}

template <int kPadded>
void launch_delta(const LinearRelationArgs& args, cudaStream_t stream) {
  auto kernel = chunk_delta_kernel<kPadded>;
  const size_t smem = delta_smem<kPadded>(args.dy != nullptr);
  allow_smem(kernel, smem);
  kernel<<<chunk_grid(args.dims), kThreads, smem, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_scan(float* buf, const float* decays, float* last, const LinearRelationDims& d,
                 bool reverse, cudaStream_t stream) {
  const int64_t dd = d.Dh * d.Dh;
  const dim3 grid(static_cast<unsigned>((dd + kThreads - 1) / kThreads),
                  static_cast<unsigned>(d.heads()));
  chunk_scan_kernel<<<grid, kThreads, 0, stream>>>(buf, decays, last, d.chunks,
                                                   static_cast<int>(d.Dh), reverse);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <int kPadded>
void launch_linear_relation_forward(const LinearRelationArgs& args, cudaStream_t stream) {
  const LinearRelationDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.H == 0) return;
  LinearRelationArgs fwd = args;
  fwd.dy = nullptr;
  launch_delta<kPadded>(fwd, stream);
  launch_scan(fwd.ws.states, fwd.ws.decays, fwd.final_state, d, false, stream);
  auto kernel = chunk_output_kernel<kPadded>;
  constexpr size_t smem = output_smem<kPadded>();
  allow_smem(kernel, smem);
  kernel<<<chunk_grid(d), kThreads, smem, stream>>>(fwd);
  QV_CUDA_CHECK(cudaGetLastError());
}

template <int kPadded>
void launch_linear_relation_backward(const LinearRelationArgs& args, cudaStream_t stream) {
  const LinearRelationDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.H == 0) return;
  launch_delta<kPadded>(args, stream);
  launch_scan(args.ws.states, args.ws.decays, nullptr, d, false, stream);
  launch_scan(args.ws.dstates, args.ws.decays, nullptr, d, true, stream);
  auto kernel = chunk_grad_kernel<kPadded>;
  constexpr size_t smem = grad_smem<kPadded>();
  allow_smem(kernel, smem);
  kernel<<<chunk_grid(d), kThreads, smem, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

#define QUIVER_LINEAR_RELATION_INSTANTIATE(P)                                                 \
  template void launch_linear_relation_forward<P>(const LinearRelationArgs&, cudaStream_t); \
  template void launch_linear_relation_backward<P>(const LinearRelationArgs&, cudaStream_t);
QUIVER_LINEAR_RELATION_INSTANTIATE(16)
QUIVER_LINEAR_RELATION_INSTANTIATE(32)
QUIVER_LINEAR_RELATION_INSTANTIATE(48)
QUIVER_LINEAR_RELATION_INSTANTIATE(64)
QUIVER_LINEAR_RELATION_INSTANTIATE(80)
QUIVER_LINEAR_RELATION_INSTANTIATE(96)
QUIVER_LINEAR_RELATION_INSTANTIATE(112)
QUIVER_LINEAR_RELATION_INSTANTIATE(128)
#undef QUIVER_LINEAR_RELATION_INSTANTIATE

void launch_linear_relation_decode_step(const uint16_t* p1, const uint16_t* p2, const uint16_t* v,
                                        const float* g, float* state, uint16_t* y, int64_t heads,
                                        int64_t Dh, float gate_scale, cudaStream_t stream) {
  if (heads == 0) return;
  const dim3 grid(static_cast<unsigned>(heads),
                  static_cast<unsigned>((Dh + kDecodeCols - 1) / kDecodeCols));
  decode_step_kernel<<<grid, kDecodeCols * kDecodeRowGroups, 0, stream>>>(
      p1, p2, v, g, state, y, static_cast<int>(Dh), gate_scale);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_retention_gate_activation(float* g, const float* a_log, const float* dt_bias,
                                      int64_t N, int64_t H, int64_t Dh, cudaStream_t stream) {
  const int64_t n = N * H * Dh;
  if (n == 0) return;
  constexpr int threads = 256;
  retention_gate_activation_kernel<<<grid_for(n, threads), threads, 0, stream>>>(
      g, a_log, dt_bias, n, H * Dh, Dh);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_retention_gate_backward_elementwise(uint16_t* dr, const float* dg, const float* a_log,
                                                const float* dt_bias, float* da_log,
                                                float* ddt_bias, int64_t N, int64_t H, int64_t Dh,
                                                void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (H == 0) return;
  const int64_t R = gate_row_chunks(N, H, Dh, scratch_bytes);
  auto* bytes = static_cast<unsigned char*>(scratch);
  retention_gate_backward_kernel<<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(R)), kGateThreads, 0,
                                   stream>>>(dr, dg, a_log, dt_bias, N, H, Dh, R, bytes);
  QV_CUDA_CHECK(cudaGetLastError());
  const int64_t outputs = H * Dh + H;
  retention_gate_backward_sum_kernel<<<static_cast<unsigned>((outputs + 255) / 256), 256, 0, stream>>>(
      da_log, ddt_bias, H, Dh, R, bytes);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
