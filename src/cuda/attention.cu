// Flash attention kernels (forward, backward, decode step) and their launchers; see attention.h
// for the contract and attention_launch.h for the launcher interface.
//
// Tensor-core layout (forward, dK/dV, dQ): a block of 4 warps; tiles of bf16 rows live in shared
// memory with a row stride of kPadded + 8 elements (an odd number of 16-byte units, so the 8 rows
// of one ldmatrix fall in different banks) and are filled by cp.async, two stages deep for the
// tiles the block loops over. Each warp owns 16 rows of the product it accumulates and issues
// mma.sync m16n8k16 (bf16 operands, fp32 accumulators):
//   forward  warp = 16 query rows:  S = Q K^T (Q held as A fragments), P = online softmax of S in
//            registers, O += P V (the S accumulators, rounded to bf16, are the A fragments).
//   dK/dV    warp = 16 key rows:    S^T = K Q^T, dP^T = V dO^T, dS^T = P^T (dP^T - D),
//            dV += P^T dO, dK += dS^T Q.
//   dQ       warp = 16 query rows:  S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
// Fragment conventions of m16n8k16 (lane = 4 * grp + tig): accumulator c0, c1 at (row grp,
// cols 2 tig, 2 tig + 1), c2, c3 at row grp + 8; A = 4 registers (rows grp / grp + 8, k 2 tig
// and 2 tig + 8); B = 2 registers (k 2 tig and 2 tig + 8, col grp). A row-major tile gives A
// fragments by ldmatrix, B fragments of its transpose by ldmatrix, and B fragments of itself by
// ldmatrix.trans.
//
// Decode: one block per (head, batch); teams of lanes (8 head-width lanes each) take positions
// in turn with an online softmax per team, merged by shuffles in the warp and through shared
// memory across warps.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention_launch.h"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kTile = kAttentionTile;  // key rows per tile; query rows per forward / dQ block
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;  // rows of the mma tile a warp owns
static_assert(kWarps * kWarpRows == kTile, "the warps of a block cover one 64-row tile");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- Score rule -----------------------------------------------------------------------------
// The score rule of softmax attention: logit = scale · (q·k), keys visible causally (j <= p).
// The mixer owns the tiles, the products and the normalization; it asks the rule for
// visibility and the logit of a dot product (in base-2 units: log2(e) is folded into the
// scale, so the exponentials are exp2f). Visibility is asked only on tiles that reach the
// diagonal: every key of an earlier tile must be visible (a history mask: j <= p or j < p).
struct CausalSoftmaxRule {
  float scale;       // 1 / sqrt(Dh): d logit / d dot in natural units
  float scale_log2;  // scale · log2(e)
  __device__ __forceinline__ bool visible(int64_t p, int64_t j) const { return j <= p; }
  __device__ __forceinline__ float logit(float dot) const { return dot * scale_log2; }
  // Backward: P = exp(logit − lse) with lse in base-2 units; d loss / d dot = ds() · scale.
  __device__ __forceinline__ float probability(float dot, float lse2) const {
    return exp2f(logit(dot) - lse2);
  }
  __device__ __forceinline__ float ds(float prob, float dprob, float delta) const {
    return prob * (dprob - delta);
  }
};

CausalSoftmaxRule softmax_rule(int64_t Dh) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  return CausalSoftmaxRule{scale, scale * kLog2e};
}

// ---- PTX wrappers ---------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a · b for one m16n8k16 tile, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- Tiles in shared memory -----------------------------------------------------------------
template <int kPadded>
constexpr int kRowStride = kPadded + 8;  // bf16 elements per shared tile row

// A fragment of rows [row0, row0 + 16) x cols [k0, k0 + 16) of a row-major shared tile.
template <int kPadded>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* tile, int row0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + (row0 + lane % 16) * kRowStride<kPadded> + k0 + (lane / 16) * 8);
}
// B fragments of the transpose of rows [n0, n0 + 16) x cols [k0, k0 + 16): b[0], b[1] for the
// n-tile n0 (rows n0..n0+7), b[2], b[3] for the n-tile n0 + 8.
template <int kPadded>
__device__ __forceinline__ void load_b_of_rows(uint32_t (&b)[4], const uint16_t* tile, int n0,
                                               int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * kRowStride<kPadded> + k0 +
                     ((lane / 8) % 2) * 8);
}
// B fragments of the tile itself, k = rows [k0, k0 + 16), n = cols [n0, n0 + 16): b[0], b[1] for
// cols n0..n0+7, b[2], b[3] for cols n0+8..n0+15.
template <int kPadded>
__device__ __forceinline__ void load_b_of_cols(uint32_t (&b)[4], const uint16_t* tile, int k0,
                                               int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * kRowStride<kPadded> + n0 +
                           (lane / 16) * 8);
}

// Rows [row0, row0 + kRows) of a bf16 [*, row_stride] array into a shared tile, cols < kPadded;
// zero where row >= T or col >= Dh. With `vec` (Dh % 8 == 0, so every row is 16-byte aligned)
// by cp.async in 16-byte pieces (complete after cp_async_wait); otherwise by plain loads and
// stores (complete at the next barrier).
template <int kRows, int kPadded>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* src, int64_t row0,
                                          int64_t T, int64_t row_stride, int Dh, bool vec) {
  constexpr int kPieces = kPadded / 8;
  if (vec) {
    for (int idx = threadIdx.x; idx < kRows * kPieces; idx += kThreads) {
      const int r = idx / kPieces, c = (idx % kPieces) * 8;
      const bool valid = row0 + r < T && c < Dh;
      const uint16_t* from = valid ? src + (row0 + r) * row_stride + c : src;
      cp_async_16(tile + r * kRowStride<kPadded> + c, from, valid);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * kPadded; idx += kThreads) {
      const int r = idx / kPadded, c = idx % kPadded;
      uint16_t x = 0;
      if (row0 + r < T && c < Dh) x = src[(row0 + r) * row_stride + c];
      tile[r * kRowStride<kPadded> + c] = x;
    }
  }
}

// A warp's 16 rows of fp32 accumulators (kPadded / 8 n-tiles), times `row_scale[half]`, as bf16
// into rows [row0, row0 + 16) of a shared tile that only this warp uses.
template <int kPadded>
__device__ __forceinline__ void stage_rows(uint16_t* tile, int row0, const float (&acc)[kPadded / 8][4],
                                           const float (&row_scale)[2]) {
  const int lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
#pragma unroll
  for (int dt = 0; dt < kPadded / 8; ++dt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + grp + 8 * half, c = dt * 8 + 2 * tig;
      *reinterpret_cast<uint32_t*>(tile + r * kRowStride<kPadded> + c) =
          pack_bf16(acc[dt][2 * half] * row_scale[half], acc[dt][2 * half + 1] * row_scale[half]);
    }
}

// The warp stores rows [srow0, srow0 + 16) of a shared tile to rows [grow0, grow0 + 16) of a
// bf16 [*, row_stride] array (row < T, col < Dh only).
template <int kPadded>
__device__ __forceinline__ void store_rows(uint16_t* dst, int64_t grow0, int64_t T,
                                           int64_t row_stride, int Dh, bool vec,
                                           const uint16_t* tile, int srow0) {
  constexpr int kPieces = kPadded / 8;
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < kWarpRows * kPieces; idx += 32) {
    const int r = idx / kPieces, c = (idx % kPieces) * 8;
    const int64_t row = grow0 + r;
    if (row >= T || c >= Dh) continue;
    const uint16_t* from = tile + (srow0 + r) * kRowStride<kPadded> + c;
    uint16_t* to = dst + row * row_stride + c;
    if (vec) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
      for (int i = 0; i < 8 && c + i < Dh; ++i) to[i] = from[i];
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A fragments (K, V in dK/dV; Q, dy in dQ) are held in registers for the whole loop up to this
// width; wider heads reload them from shared memory per tile (the accumulators grow with the
// width). Measured on the H200: capping the dK/dV kernel at 168 registers (3 blocks per SM,
// 32-row query tiles) was 4-7% slower than 255 registers and 2 blocks per SM.
template <int kPadded>
constexpr bool kDkdvHold = kPadded <= 64;
template <int kPadded>
constexpr bool kDqHold = kPadded <= 64;
// Query rows per tile of the dK/dV loop (the S^T and dP^T accumulators of a warp are
// 16 x kDkdvQueryTile each, beside dK and dV of 16 x kPadded).
template <int kPadded>
constexpr int kDkdvQueryTile = kPadded <= 96 ? 64 : 32;

// ---- Forward ----------------------------------------------------------------------------------
// Grid (query tiles, Hq, B); tiles run heaviest (last) first.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const AttentionForwardArgs a, const Rule rule) {
  constexpr int S = kRowStride<kPadded>;
  constexpr int kChunks = kPadded / 16;  // k steps over the head width
  constexpr int kDTiles = kPadded / 8;   // n-tiles of the output
  constexpr int kKeyTiles = kTile / 8;   // n-tiles of the scores
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);  // [64, S]; the output staging at the end
  uint16_t* ks = qs + kTile * S;                          // 2 stages of [64, S]
  uint16_t* vs = ks + 2 * kTile * S;                      // 2 stages of [64, S]

  const AttentionDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const bool vec = Dh % 8 == 0;
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t q_off = (b * T * d.Hq + h) * Dh;  // query row p at q_off + p * q_stride
  const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;
  const uint16_t* vb = a.v + (b * T * d.Hkv + g) * Dh;
  const int64_t row[2] = {p0 + warp * kWarpRows + grp, p0 + warp * kWarpRows + grp + 8};

  load_tile<kTile, kPadded>(qs, a.q + q_off, p0, T, q_stride, Dh, vec);
  cp_async_commit();
  load_tile<kTile, kPadded>(ks, kb, 0, T, kv_stride, Dh, vec);
  load_tile<kTile, kPadded>(vs, vb, 0, T, kv_stride, Dh, vec);
  cp_async_commit();

  uint32_t qf[kChunks][4];
  float o[kDTiles][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

  const int n_kt = static_cast<int>(p0 / kTile) + 1;  // key tiles up to the diagonal
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {
      load_tile<kTile, kPadded>(ks + (stage ^ 1) * kTile * S, kb, (kt + 1) * kTile, T, kv_stride,
                                Dh, vec);
      load_tile<kTile, kPadded>(vs + (stage ^ 1) * kTile * S, vb, (kt + 1) * kTile, T, kv_stride,
                                Dh, vec);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kc = 0; kc < kChunks; ++kc) load_a<kPadded>(qf[kc], qs, warp * kWarpRows, kc * 16);
    }
    const uint16_t* kst = ks + stage * kTile * S;
    const uint16_t* vst = vs + stage * kTile * S;

    float s[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc)
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t kf[4];
        load_b_of_rows<kPadded>(kf, kst, np * 16, kc * 16);
        mma_bf16(s[2 * np], qf[kc], kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qf[kc], kf[2], kf[3]);
      }

    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    const bool diagonal = kt == n_kt - 1;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        float x = rule.logit(s[nt][e]);
        if (diagonal) {
          const int64_t j = j0 + nt * 8 + 2 * tig + (e & 1);
          if (!(j < T && rule.visible(row[half], j))) x = -INFINITY;
        }
        s[nt][e] = x;
        tile_max[half] = fmaxf(tile_max[half], x);
      }
    float base[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_new = fmaxf(m[half], quad_max(tile_max[half]));
      // m_new = -inf: the row has seen no visible key yet (possible for rules with a strict
      // mask); exp2(-inf - 0) = 0 keeps the state at zero without NaN.
      base[half] = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[half] - base[half]);
      m[half] = m_new;
      l[half] *= alpha;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[dt][2 * half] *= alpha;
        o[dt][2 * half + 1] *= alpha;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = exp2f(s[nt][e] - base[e / 2]);
        s[nt][e] = pr;
        l[e / 2] += pr;
      }

#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kChunks; ++dp) {
        uint32_t vf[4];
        load_b_of_cols<kPadded>(vf, vst, kk * 16, dp * 16);
        mma_bf16(o[2 * dp], pa, vf[0], vf[1]);
        mma_bf16(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] = quad_sum(l[half]);
    inv[half] = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
  }
  stage_rows<kPadded>(qs, warp * kWarpRows, o, inv);
  __syncwarp();
  store_rows<kPadded>(a.y + q_off, p0 + warp * kWarpRows, T, q_stride, Dh, vec, qs,
                      warp * kWarpRows);
  if (tig == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (row[half] < T)
        a.lse[(b * d.Hq + h) * T + row[half]] =
            l[half] > 0.0f ? (m[half] + log2f(l[half])) * kLn2 : -INFINITY;
  }
}

// ---- Backward ---------------------------------------------------------------------------------
// D_r = dy_r · y_r for the kRows rows of two shared tiles, by kThreads / kRows consecutive
// threads per row reading 8 lanes at a time; written to delta[r] (visible after the next
// barrier).
__device__ __forceinline__ float dot8(uint4 x, uint4 y) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum = fmaf(__uint_as_float(xs[i] << 16), __uint_as_float(ys[i] << 16), sum);
    sum = fmaf(__uint_as_float(xs[i] & 0xffff0000u), __uint_as_float(ys[i] & 0xffff0000u), sum);
  }
  return sum;
}
template <int kRows, int kPadded>
__device__ __forceinline__ void tile_delta(float* delta, const uint16_t* dys, const uint16_t* ys) {
  constexpr int kPerRow = kThreads / kRows;
  static_assert(kPerRow >= 1 && kPerRow <= 32 && (kPerRow & (kPerRow - 1)) == 0, "row split");
  const int r = threadIdx.x / kPerRow, part = threadIdx.x % kPerRow;
  float sum = 0.0f;
#pragma unroll
  for (int c = part * 8; c < kPadded; c += kPerRow * 8)
    sum += dot8(*reinterpret_cast<const uint4*>(dys + r * kRowStride<kPadded> + c),
                *reinterpret_cast<const uint4*>(ys + r * kRowStride<kPadded> + c));
#pragma unroll
  for (int off = kPerRow / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (part == 0) delta[r] = sum;
}

// dK, dV. Grid (key tiles, Hkv, B); the lowest key tiles (the most query tiles) run first.
// Loops over the group's query heads and the query tiles at or after the key tile, so dk and dv
// are summed in a fixed order.
//   P_pj = exp(logit_pj − lse_p), dS_pj = P_pj (dy_p·v_j − D_p),
//   dv_j = Σ_p P_pj dy_p,  dk_j = scale · Σ_p dS_pj q_p.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(const AttentionBackwardArgs a, const Rule rule) {
  constexpr int S = kRowStride<kPadded>;
  constexpr int kChunks = kPadded / 16;
  constexpr int kDTiles = kPadded / 8;
  constexpr int kBr = kDkdvQueryTile<kPadded>;
  constexpr int kQueryTiles = kBr / 8;  // n-tiles of S^T
  constexpr bool kHold = kDkdvHold<kPadded>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw);  // [64, S] key tile; dk staging at the end
  uint16_t* vs = ks + kTile * S;                          // [64, S] value tile; dv staging
  uint16_t* qs = vs + kTile * S;                          // 2 stages of [kBr, S] each:
  uint16_t* dys = qs + 2 * kBr * S;                       //   query, dy and y tiles
  uint16_t* ys = dys + 2 * kBr * S;
  float* lse_s = reinterpret_cast<float*>(ys + 2 * kBr * S);  // 2 stages of [kBr], base 2
  float* delta_s = lse_s + 2 * kBr;                           // 2 stages of [kBr]

  const AttentionDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const bool vec = Dh % 8 == 0;
  const int64_t T = d.T, group = d.Hq / d.Hkv;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t g = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t kv_off = (b * T * d.Hkv + g) * Dh;
  const int64_t key[2] = {j0 + warp * kWarpRows + grp, j0 + warp * kWarpRows + grp + 8};

  // Iteration `it` covers query head g·group + it / nq and query tile j0 + (it % nq)·kBr:
  // causal, so the query rows before j0 see none of this tile's keys.
  const int64_t nq = (T - j0 + kBr - 1) / kBr;
  const int64_t total = group * nq;
  auto head_of = [&](int64_t it) { return g * group + it / nq; };
  auto tile_of = [&](int64_t it) { return j0 + (it % nq) * kBr; };
  auto issue = [&](int64_t it, int stage) {
    const int64_t q_off = (b * T * d.Hq + head_of(it)) * Dh, p0 = tile_of(it);
    load_tile<kBr, kPadded>(qs + stage * kBr * S, a.q + q_off, p0, T, q_stride, Dh, vec);
    load_tile<kBr, kPadded>(dys + stage * kBr * S, a.dy + q_off, p0, T, q_stride, Dh, vec);
    load_tile<kBr, kPadded>(ys + stage * kBr * S, a.y + q_off, p0, T, q_stride, Dh, vec);
  };
  // lse of query row tile_of(it) + threadIdx.x in base 2; +inf past T (so P = 0 there).
  auto lse_of = [&](int64_t it) {
    const int64_t p = tile_of(it) + threadIdx.x;
    return p < T ? a.lse[(b * d.Hq + head_of(it)) * T + p] * kLog2e : INFINITY;
  };

  load_tile<kTile, kPadded>(ks, a.k + kv_off, j0, T, kv_stride, Dh, vec);
  load_tile<kTile, kPadded>(vs, a.v + kv_off, j0, T, kv_stride, Dh, vec);
  cp_async_commit();
  issue(0, 0);
  cp_async_commit();
  if (threadIdx.x < kBr) lse_s[threadIdx.x] = lse_of(0);

  uint32_t kf[kHold ? kChunks : 1][4], vf[kHold ? kChunks : 1][4];
  float dk[kDTiles][4], dv[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  for (int64_t it = 0; it < total; ++it) {
    const int stage = static_cast<int>(it & 1);
    float lse_next = 0.0f;
    if (it + 1 < total) {
      issue(it + 1, stage ^ 1);
      if (threadIdx.x < kBr) lse_next = lse_of(it + 1);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* qst = qs + stage * kBr * S;
    const uint16_t* dyst = dys + stage * kBr * S;
    const float* lse_t = lse_s + stage * kBr;
    const float* delta_t = delta_s + stage * kBr;
    tile_delta<kBr, kPadded>(delta_s + stage * kBr, dyst, ys + stage * kBr * S);
    if constexpr (kHold) {
      if (it == 0) {
#pragma unroll
        for (int kc = 0; kc < kChunks; ++kc) {
          load_a<kPadded>(kf[kc], ks, warp * kWarpRows, kc * 16);
          load_a<kPadded>(vf[kc], vs, warp * kWarpRows, kc * 16);
        }
      }
    }
    __syncthreads();  // delta_t is complete

    float st[kQueryTiles][4], dpt[kQueryTiles][4];
#pragma unroll
    for (int nt = 0; nt < kQueryTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      uint32_t ka[4], va[4];
      if constexpr (kHold) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ka[i] = kf[kc][i];
          va[i] = vf[kc][i];
        }
      } else {
        load_a<kPadded>(ka, ks, warp * kWarpRows, kc * 16);
        load_a<kPadded>(va, vs, warp * kWarpRows, kc * 16);
      }
#pragma unroll
      for (int qp = 0; qp < kBr / 16; ++qp) {
        uint32_t qb[4], dyb[4];
        load_b_of_rows<kPadded>(qb, qst, qp * 16, kc * 16);
        mma_bf16(st[2 * qp], ka, qb[0], qb[1]);
        mma_bf16(st[2 * qp + 1], ka, qb[2], qb[3]);
        load_b_of_rows<kPadded>(dyb, dyst, qp * 16, kc * 16);
        mma_bf16(dpt[2 * qp], va, dyb[0], dyb[1]);
        mma_bf16(dpt[2 * qp + 1], va, dyb[2], dyb[3]);
      }
    }

    const int64_t p0 = tile_of(it);
    const bool masked = p0 < j0 + kTile;  // the query tile reaches into the key tile
#pragma unroll
    for (int nt = 0; nt < kQueryTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * tig + (e & 1);
        float pr = rule.probability(st[nt][e], lse_t[c]);
        if (masked) {
          const int64_t p = p0 + c, j = key[e / 2];
          if (!(j < T && p < T && rule.visible(p, j))) pr = 0.0f;
        }
        st[nt][e] = pr;
        dpt[nt][e] = rule.ds(pr, dpt[nt][e], delta_t[c]);
      }

#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(st[2 * kk][0], st[2 * kk][1]),
                              pack_bf16(st[2 * kk][2], st[2 * kk][3]),
                              pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                              pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const uint32_t dsa[4] = {pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]),
                               pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                               pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                               pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kChunks; ++dp) {
        uint32_t yb[4], qb[4];
        load_b_of_cols<kPadded>(yb, dyst, kk * 16, dp * 16);
        mma_bf16(dv[2 * dp], pa, yb[0], yb[1]);
        mma_bf16(dv[2 * dp + 1], pa, yb[2], yb[3]);
        load_b_of_cols<kPadded>(qb, qst, kk * 16, dp * 16);
        mma_bf16(dk[2 * dp], dsa, qb[0], qb[1]);
        mma_bf16(dk[2 * dp + 1], dsa, qb[2], qb[3]);
      }
    }
    if (threadIdx.x < kBr) lse_s[(stage ^ 1) * kBr + threadIdx.x] = lse_next;
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // Each warp stages its own 16 rows of ks / vs (read by no other warp).
  __syncwarp();
  const float dk_scale[2] = {rule.scale, rule.scale}, one[2] = {1.0f, 1.0f};
  stage_rows<kPadded>(ks, warp * kWarpRows, dk, dk_scale);
  stage_rows<kPadded>(vs, warp * kWarpRows, dv, one);
  __syncwarp();
  const int64_t row0 = j0 + warp * kWarpRows;
  store_rows<kPadded>(a.dk + kv_off, row0, T, kv_stride, Dh, vec, ks, warp * kWarpRows);
  store_rows<kPadded>(a.dv + kv_off, row0, T, kv_stride, Dh, vec, vs, warp * kWarpRows);
}

// dQ. Grid (query tiles, Hq, B); tiles run heaviest first. dq_p = scale · Σ_j dS_pj k_j.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const AttentionBackwardArgs a, const Rule rule) {
  constexpr int S = kRowStride<kPadded>;
  constexpr int kChunks = kPadded / 16;
  constexpr int kDTiles = kPadded / 8;
  constexpr int kKeyTiles = kTile / 8;
  constexpr bool kHold = kDqHold<kPadded>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);  // [64, S] query tile; dq staging
  uint16_t* dys = qs + kTile * S;                         // [64, S] dy tile
  uint16_t* ks = dys + kTile * S;                         // 2 stages of [64, S]
  uint16_t* vs = ks + 2 * kTile * S;                      // 2 stages of [64, S]

  const AttentionDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const bool vec = Dh % 8 == 0;
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t q_off = (b * T * d.Hq + h) * Dh;
  const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;
  const uint16_t* vb = a.v + (b * T * d.Hkv + g) * Dh;
  const int wrow = warp * kWarpRows;  // the warp's first row in the tile
  const int64_t row[2] = {p0 + wrow + grp, p0 + wrow + grp + 8};

  load_tile<kTile, kPadded>(qs, a.q + q_off, p0, T, q_stride, Dh, vec);
  load_tile<kTile, kPadded>(dys, a.dy + q_off, p0, T, q_stride, Dh, vec);
  cp_async_commit();
  load_tile<kTile, kPadded>(ks, kb, 0, T, kv_stride, Dh, vec);
  load_tile<kTile, kPadded>(vs, vb, 0, T, kv_stride, Dh, vec);
  cp_async_commit();
  // lse (base 2; +inf past T, so P = 0 there) and D of the thread's two rows, the quad's lanes
  // splitting the head width of D.
  float lse2[2], delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool valid = row[half] < T;
    lse2[half] = valid ? a.lse[(b * d.Hq + h) * T + row[half]] * kLog2e : INFINITY;
    float sum = 0.0f;
    if (valid) {
      const int64_t off = q_off + row[half] * q_stride;
      for (int c = tig; c < Dh; c += 4) sum = fmaf(bf16_load(a.y[off + c]), bf16_load(a.dy[off + c]), sum);
    }
    delta[half] = quad_sum(sum);
  }

  uint32_t qf[kHold ? kChunks : 1][4], dyf[kHold ? kChunks : 1][4];
  float dq[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  const int n_kt = static_cast<int>(p0 / kTile) + 1;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {
      load_tile<kTile, kPadded>(ks + (stage ^ 1) * kTile * S, kb, (kt + 1) * kTile, T, kv_stride,
                                Dh, vec);
      load_tile<kTile, kPadded>(vs + (stage ^ 1) * kTile * S, vb, (kt + 1) * kTile, T, kv_stride,
                                Dh, vec);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (kHold) {
      if (kt == 0) {
#pragma unroll
        for (int kc = 0; kc < kChunks; ++kc) {
          load_a<kPadded>(qf[kc], qs, wrow, kc * 16);
          load_a<kPadded>(dyf[kc], dys, wrow, kc * 16);
        }
      }
    }
    const uint16_t* kst = ks + stage * kTile * S;
    const uint16_t* vst = vs + stage * kTile * S;

    float s[kKeyTiles][4], dp[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      uint32_t qa[4], dya[4];
      if constexpr (kHold) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          qa[i] = qf[kc][i];
          dya[i] = dyf[kc][i];
        }
      } else {
        load_a<kPadded>(qa, qs, wrow, kc * 16);
        load_a<kPadded>(dya, dys, wrow, kc * 16);
      }
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t kf[4], vf[4];
        load_b_of_rows<kPadded>(kf, kst, np * 16, kc * 16);
        mma_bf16(s[2 * np], qa, kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qa, kf[2], kf[3]);
        load_b_of_rows<kPadded>(vf, vst, np * 16, kc * 16);
        mma_bf16(dp[2 * np], dya, vf[0], vf[1]);
        mma_bf16(dp[2 * np + 1], dya, vf[2], vf[3]);
      }
    }

    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    const bool diagonal = kt == n_kt - 1;
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        float pr = rule.probability(s[nt][e], lse2[half]);
        if (diagonal) {
          const int64_t j = j0 + nt * 8 + 2 * tig + (e & 1);
          if (!(j < T && row[half] < T && rule.visible(row[half], j))) pr = 0.0f;
        }
        dp[nt][e] = rule.ds(pr, dp[nt][e], delta[half]);
      }

#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      const uint32_t dsa[4] = {pack_bf16(dp[2 * kk][0], dp[2 * kk][1]),
                               pack_bf16(dp[2 * kk][2], dp[2 * kk][3]),
                               pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                               pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
      for (int dpair = 0; dpair < kChunks; ++dpair) {
        uint32_t kf[4];
        load_b_of_cols<kPadded>(kf, kst, kk * 16, dpair * 16);
        mma_bf16(dq[2 * dpair], dsa, kf[0], kf[1]);
        mma_bf16(dq[2 * dpair + 1], dsa, kf[2], kf[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // The warp stages its own 16 rows of qs (read by no other warp).
  const float dq_scale[2] = {rule.scale, rule.scale};
  stage_rows<kPadded>(qs, wrow, dq, dq_scale);
  __syncwarp();
  store_rows<kPadded>(a.dq + q_off, p0 + wrow, T, q_stride, Dh, vec, qs, wrow);
}

// ---- Decode -----------------------------------------------------------------------------------
constexpr int kDecodeThreads = 512;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeBatch = 4;  // positions a team loads before it uses the first

// 8 head-width lanes [c, c + 8) of a bf16 row as fp32; zero at c + i >= Dh or when !valid.
__device__ __forceinline__ void load8(float (&x)[8], const uint16_t* row, int c, int Dh, bool vec,
                                      bool valid) {
  if (vec) {
    uint4 u = make_uint4(0, 0, 0, 0);
    if (valid && c < Dh) u = *reinterpret_cast<const uint4*>(row + c);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = valid && c + i < Dh ? bf16_load(row[c + i]) : 0.0f;
  }
}

// One block per (query head, batch). A team of kTeam lanes (kTeam · 8 >= Dh) holds one position
// at a time, lane i of the team the head-width lanes [8i, 8i + 8); the teams of the block take
// positions round-robin, kDecodeBatch at a time. Rows j < pos come from the cache, row pos from
// the new k, v (the block of the group's first query head writes it into the cache; no block
// reads cache row pos, so there is no race).
template <int kTeam>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_kernel(const AttentionDecodeArgs a, float scale_log2) {
  constexpr int kTeamsPerWarp = 32 / kTeam;
  constexpr int kTeams = kDecodeThreads / kTeam;
  __shared__ float warp_m[kDecodeWarps], warp_l[kDecodeWarps];
  __shared__ float warp_acc[kDecodeWarps][kTeam * 8];

  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t group = a.Hq / a.Hkv, g = h / group;
  const int Dh = static_cast<int>(a.Dh);
  const bool vec = Dh % 8 == 0;
  const int64_t pos = *a.pos;
  const int64_t row_stride = a.Hkv * a.Dh;
  const uint16_t* k_new = a.k + (b * a.Hkv + g) * a.Dh;
  const uint16_t* v_new = a.v + (b * a.Hkv + g) * a.Dh;
  const uint16_t* k_cache = a.cache_k + (b * a.capacity * a.Hkv + g) * a.Dh;
  const uint16_t* v_cache = a.cache_v + (b * a.capacity * a.Hkv + g) * a.Dh;

  if (h % group == 0) {
    const int64_t at = ((b * a.capacity + pos) * a.Hkv + g) * a.Dh;
    for (int i = threadIdx.x; i < Dh; i += kDecodeThreads) {
      a.cache_k[at + i] = k_new[i];
      a.cache_v[at + i] = v_new[i];
    }
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c = (lane % kTeam) * 8;
  float q[8];
  load8(q, a.q + (b * a.Hq + h) * a.Dh, c, Dh, vec, true);
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] *= scale_log2;

  float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;

  // The loop bound is the warp's first position, so all lanes of a warp run it alike (full-mask
  // shuffles); a team past pos sees only invisible positions.
  for (int64_t base = static_cast<int64_t>(warp) * kTeamsPerWarp; base <= pos;
       base += static_cast<int64_t>(kTeams) * kDecodeBatch) {
    float kx[kDecodeBatch][8], vx[kDecodeBatch][8];
#pragma unroll
    for (int u = 0; u < kDecodeBatch; ++u) {
      const int64_t j = base + lane / kTeam + static_cast<int64_t>(u) * kTeams;
      const bool valid = j <= pos;
      const uint16_t* kr = j < pos ? k_cache + j * row_stride : k_new;
      const uint16_t* vr = j < pos ? v_cache + j * row_stride : v_new;
      load8(kx[u], kr, c, Dh, vec, valid);
      load8(vx[u], vr, c, Dh, vec, valid);
    }
    float s[kDecodeBatch], s_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kDecodeBatch; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(q[i], kx[u][i], dot);
#pragma unroll
      for (int off = kTeam / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const int64_t j = base + lane / kTeam + static_cast<int64_t>(u) * kTeams;
      s[u] = j <= pos ? dot : -INFINITY;
      s_max = fmaxf(s_max, s[u]);
    }
    const float m_new = fmaxf(m, s_max);
    if (m_new == -INFINITY) continue;  // the team has no visible position yet
    const float alpha = exp2f(m - m_new);
    l *= alpha;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] *= alpha;
#pragma unroll
    for (int u = 0; u < kDecodeBatch; ++u) {
      const float pr = exp2f(s[u] - m_new);
      l += pr;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(pr, vx[u][i], acc[i]);
    }
    m = m_new;
  }

  // Merge the teams of the warp (lanes kTeam apart hold the same head-width lanes).
#pragma unroll
  for (int off = kTeam; off < 32; off *= 2) {
    const float m_o = __shfl_xor_sync(0xffffffffu, m, off);
    const float l_o = __shfl_xor_sync(0xffffffffu, l, off);
    const float m_new = fmaxf(m, m_o);
    const float sa = m == -INFINITY ? 0.0f : exp2f(m - m_new);
    const float sb = m_o == -INFINITY ? 0.0f : exp2f(m_o - m_new);
    l = l * sa + l_o * sb;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float acc_o = __shfl_xor_sync(0xffffffffu, acc[i], off);
      acc[i] = acc[i] * sa + acc_o * sb;
    }
    m = m_new;
  }
  if (lane < kTeam) {
    if (lane == 0) {
      warp_m[warp] = m;
      warp_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) warp_acc[warp][c + i] = acc[i];
  }
  __syncthreads();

  // Merge the warps: thread t writes head-width lane t (position pos is visible to every
  // query, so the block's maximum is finite).
  if (threadIdx.x < Dh) {
    float m_all = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
    float l_all = 0.0f, y = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float sw = warp_m[w] == -INFINITY ? 0.0f : exp2f(warp_m[w] - m_all);
      l_all = fmaf(warp_l[w], sw, l_all);
      y = fmaf(warp_acc[w][threadIdx.x], sw, y);
    }
    a.y[(b * a.Hq + h) * a.Dh + threadIdx.x] = bf16_round(y / l_all);
  }
}

// Dynamic shared memory of the kernels, in bytes.
template <int kPadded>
constexpr size_t forward_smem() {
  return sizeof(uint16_t) * 5 * kTile * kRowStride<kPadded>;
}
template <int kPadded>
constexpr size_t dkdv_smem() {
  constexpr int kBr = kDkdvQueryTile<kPadded>;
  return sizeof(uint16_t) * (2 * kTile + 6 * kBr) * kRowStride<kPadded> +
         sizeof(float) * 4 * kBr;
}
template <int kPadded>
constexpr size_t dq_smem() {
  return sizeof(uint16_t) * 6 * kTile * kRowStride<kPadded>;
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

void launch_attention_decode(const AttentionDecodeArgs& args, cudaStream_t stream) {
  if (args.B == 0 || args.Hq == 0) return;
  const float scale_log2 = softmax_rule(args.Dh).scale_log2;
  const dim3 grid(static_cast<unsigned>(args.Hq), static_cast<unsigned>(args.B));
  const int64_t pieces = (args.Dh + 7) / 8;  // 8 head-width lanes per team lane
  if (pieces <= 1) {
    attention_decode_kernel<1><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else if (pieces <= 2) {
    attention_decode_kernel<2><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else if (pieces <= 4) {
    attention_decode_kernel<4><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else if (pieces <= 8) {
    attention_decode_kernel<8><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else {
    attention_decode_kernel<16><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  }
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
