// The tiled flash mixer shared by causal attention (attention.cu) and FlashRelation
// (relation.cu): tile movement, mma fragments, and the forward, dK/dV and dQ kernels, all
// parametrized by a score rule. Included only by those two .cu files.
//
// Tensor-core layout (forward, dK/dV, dQ): a block of 4 warps, one warpgroup, over 64-row tiles
// of bf16 rows in shared memory, two stages deep for the tiles the block loops over, filled by TMA
// from one thread where the head width is a multiple of 8 (16-byte row strides; kTma), else by
// cp.async from every thread. Each warp owns 16 rows of the product it accumulates (fp32, mma.sync's fragment layout).
// The products are warpgroup products (wgmma.cuh), the tiles swizzled panels (kSwizzledTile):
//   forward  16 query rows a warp:  S = Q K^T (both from shared memory), P = online softmax of
//            the rule's logits in registers, O += P V (P, rounded to bf16, from registers).
//   dK/dV    16 key rows a warp:    S^T = K Q^T, dP^T = V dO^T, dS^T from the rule,
//            dV += P^T dO, dK += dS^T Q.
//   dQ       16 query rows a warp:  S = Q K^T, dP = dO V^T, dS from the rule, dQ += dS K.
// Above kWgmmaBackwardWidth the dK/dV and dQ kernels are mma.sync m16n8k16 ones instead (their
// tiles rows of kPadded + 8 elements, an odd number of 16-byte units, so the 8 rows of one
// ldmatrix fall in different banks). Fragment conventions of m16n8k16 (lane = 4 * grp + tig):
// accumulator c0, c1 at (row grp, cols 2 tig, 2 tig + 1), c2, c3 at row grp + 8; A = 4 registers
// (rows grp / grp + 8, k 2 tig and 2 tig + 8); B = 2 registers (k 2 tig and 2 tig + 8, col grp).
// A row-major tile gives A fragments by ldmatrix, B fragments of its transpose by ldmatrix, and B
// fragments of itself by ldmatrix.trans.
//
// The score rule (a small device struct passed by value to the kernels) supplies, with
// r = (b · Hq + h) · T + p the index of query row p of head h in [B, Hq, T] order:
//   kSelf                 whether the row has a Self entry outside the scan (its own q_p · k_p
//                         in the forward, row terms in the backward); such rules need Hq = Hkv.
//   scale                 d logit / d dot in natural units; dq and dk are scaled by it.
//   visible(p, j)         a history mask (j <= p or j < p); asked only on tiles that reach the
//                         diagonal, so every key of an earlier tile must be visible.
//   score(dot), score_log2  the forward's score z in the rule's units and its base-2 logits
//                         per unit (> 0): logit = score_log2 · z, and 2^logit is the weight.
//   finish_row(r, p, m2, l, self_dot, writer) -> RowWeights: after the scan (m2 the base-2
//                         running max, l the sum of exp2(logit − m2), self_dot = q_p · k_p when
//                         kSelf), y_p = hist · o_p + self · v_p with o_p the unnormalized
//                         Σ exp2(logit − m2) v_j; writes the row's statistics when `writer`.
//   row_norm2(r)          the backward's base-2 log normalizer of row p: P_pj = exp2(logit − it).
//   grad(dot, norm2, dP, D) -> ScoreGrad {P, dS}: the weight and d loss / d (dot · scale);
//                         D_p = dy_p · y_p comes precomputed per row (BackwardIo::delta), so
//                         the tile passes never load y.
//   kSelf only: key_self(r, dk, dv) sets the row terms of key row j = p of row r,
//                         dk_j += dk · q_j (before the scale) and dv_j += dv · dy_j;
//                         query_self(r) the coefficient of dq_p += it · k_p (before the scale).
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_launch.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/elementwise_launch.h"
#include "cuda/mma_ptx.cuh"
#include "cuda/tma.cuh"
#include "cuda/tma.h"
#include "cuda/wgmma.cuh"

namespace quiver::cuda::detail::flash {

inline constexpr int kTile = 64;  // key rows per tile; query rows per forward / dQ block
inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kWarpRows = 16;  // rows of the mma tile a warp owns
static_assert(kWarps * kWarpRows == kTile, "the warps of a block cover one 64-row tile");
static_assert(kTile == kAttentionTile && kAttentionPadStep == 16, "attention_launch.h's sizes");
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Sizes of one call, attention's (attention_launch.h): q rows [B, T, Hq, Dh], k and v rows
// [B, T, Hkv, Dh]; Hq % Hkv == 0 and query head h reads kv head h / (Hq / Hkv). FlashRelation
// has Hq = Hkv = H.
using Dims = AttentionDims;

struct ForwardIo {
  Dims dims;
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* y;  // shape of q
};

struct BackwardIo {
  Dims dims;
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* dy;
  const float* delta;  // [B, Hq, T]: D_p = dy_p · y_p, from the caller's row pass
  uint16_t* dq;
  uint16_t* dk;
  uint16_t* dv;
  // Null: dq by its own tile pass. Else (flash_dq_atomics, context.h) fp32 scratch of
  // flash_dq_sum_floats(dims) floats (layout: dq_sum_col) where the dK/dV pass adds dS·K by bulk
  // reductions (launch_backward zeroes it); a row pass rounds it.
  float* dq_accum;
};

struct RowWeights {
  float hist, self;
};

struct ScoreGrad {
  float prob, ds;
};

// ---- PTX wrappers (cp.async, ldmatrix, mma.sync: mma_ptx.cuh) ----------------------------
// tanh by the special-function unit (one MUFU.TANH; PTX ISA: relative error about 2^-11).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x by the special-function unit alone (one MUFU.EX2; exp2f adds a rescaling for subnormal
// results, which the weights never need: below 2^-126 they flush to 0). 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as a bf16 pair (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t pair) {
  return __uint_as_float(pair & 0xffff0000u);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- Tiles in shared memory -----------------------------------------------------------------
template <int kPadded>
inline constexpr int kRowStride = kPadded + 8;  // bf16 elements per shared tile row

// The wgmma kernels keep their 64-row tiles as swizzled panels (wgmma::Panels) instead: bf16
// elements per such tile.
template <int kPadded>
inline constexpr int kSwizzledTile = wgmma::Panels<kPadded>::kBytes / 2;

// Element (r, c) of a shared tile, in bf16 elements from its start: rows of kPadded + 8, or
// (kSwizzled; 64-row tiles only) swizzled panels. Pairs (c even, c + 1) and 16-byte
// pieces (c a multiple of 8) stay contiguous in both.
template <int kPadded, bool kSwizzled>
__device__ __forceinline__ int tile_offset(int r, int c) {
  if constexpr (kSwizzled)
    return static_cast<int>(wgmma::Panels<kPadded>::offset(r, c) / 2);
  else
    return r * kRowStride<kPadded> + c;
}

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

// The A fragment (16 rows x k [16 kk, 16 kk + 16)) of a warp's fp32 accumulators over
// key / query columns, rounded to bf16: n-tiles 2 kk and 2 kk + 1 of acc.
template <int kNTiles>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&acc)[kNTiles][4], int kk) {
  a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// acc (16 rows x kNTiles n-tiles of 8) += A · tile[n, k0 .. k0 + 16)^T over the tile's first
// 8 kNTiles rows, and acc2 the same of A2 and tile2: the scores of a warp's rows against a tile
// of rows, the loads of both products interleaved.
template <int kPadded, int kNTiles>
__device__ __forceinline__ void mma_by_rows(float (&acc)[kNTiles][4], const uint32_t (&a)[4],
                                            const uint16_t* tile, float (&acc2)[kNTiles][4],
                                            const uint32_t (&a2)[4], const uint16_t* tile2,
                                            int k0) {
#pragma unroll
  for (int np = 0; np < kNTiles / 2; ++np) {
    uint32_t b[4], b2[4];
    load_b_of_rows<kPadded>(b, tile, np * 16, k0);
    mma_bf16(acc[2 * np], a, b[0], b[1]);
    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    load_b_of_rows<kPadded>(b2, tile2, np * 16, k0);
    mma_bf16(acc2[2 * np], a2, b2[0], b2[1]);
    mma_bf16(acc2[2 * np + 1], a2, b2[2], b2[3]);
  }
}

// The backward's two score products of a warp's 16 rows over the head width, from zero:
// acc = A · tile^T and acc2 = A2 · tile2^T, where A, A2 are rows [row0, row0 + 16) of the shared
// tiles `rows`, `rows2`.
template <int kPadded, int kNTiles>
__device__ __forceinline__ void two_products(float (&acc)[kNTiles][4], const uint16_t* rows, const uint16_t* tile,
                                             float (&acc2)[kNTiles][4], const uint16_t* rows2,
                                             const uint16_t* tile2, int row0) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = acc2[nt][e] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < kPadded / 16; ++kc) {
    uint32_t a[4], a2[4];
    load_a<kPadded>(a, rows, row0, kc * 16);
    load_a<kPadded>(a2, rows2, row0, kc * 16);
    mma_by_rows<kPadded>(acc, a, tile, acc2, a2, tile2, kc * 16);
  }
}

// acc (16 rows x kPadded / 8 n-tiles over the head width) += A · tile[k0 .. k0 + 16, :): the
// weights of a warp's rows times 16 rows of a tile. Two-product form as mma_by_rows.
template <int kPadded>
__device__ __forceinline__ void mma_by_cols(float (&acc)[kPadded / 8][4], const uint32_t (&a)[4],
                                            const uint16_t* tile, int k0) {
#pragma unroll
  for (int dp = 0; dp < kPadded / 16; ++dp) {
    uint32_t b[4];
    load_b_of_cols<kPadded>(b, tile, k0, dp * 16);
    mma_bf16(acc[2 * dp], a, b[0], b[1]);
    mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
  }
}
template <int kPadded>
__device__ __forceinline__ void mma_by_cols(float (&acc)[kPadded / 8][4], const uint32_t (&a)[4],
                                            const uint16_t* tile, float (&acc2)[kPadded / 8][4],
                                            const uint32_t (&a2)[4], const uint16_t* tile2,
                                            int k0) {
#pragma unroll
  for (int dp = 0; dp < kPadded / 16; ++dp) {
    uint32_t b[4], b2[4];
    load_b_of_cols<kPadded>(b, tile, k0, dp * 16);
    mma_bf16(acc[2 * dp], a, b[0], b[1]);
    mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
    load_b_of_cols<kPadded>(b2, tile2, k0, dp * 16);
    mma_bf16(acc2[2 * dp], a2, b2[0], b2[1]);
    mma_bf16(acc2[2 * dp + 1], a2, b2[2], b2[3]);
  }
}

// The widest piece (in elements) that a head's rows can be copied in: 8 where Dh is a multiple
// of 8 (every row 16-byte aligned), 4 where it is a multiple of 4 (8-byte aligned: width 60),
// else 1. The arrays are the model's [B, T, H, Dh] tensors, whose bases are allocation-aligned.
__device__ __forceinline__ int load_piece(int Dh) { return Dh % 8 == 0 ? 8 : Dh % 4 == 0 ? 4 : 1; }

// Rows [row0, row0 + kRows) of a bf16 [*, row_stride] array into a shared tile, cols < kPadded;
// zero where row >= T or col >= Dh. With `vec` = 8 or 4 (load_piece) by cp.async in 16- or
// 8-byte pieces (complete after cp_async_wait; a piece lies within one 16-byte swizzle unit);
// otherwise by plain loads and stores (complete at the next barrier).
template <int kRows, int kPadded, bool kSwizzled = false>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* src, int64_t row0,
                                          int64_t T, int64_t row_stride, int Dh, int vec) {
  static_assert(!kSwizzled || kRows == kTile, "swizzled tiles have 64 rows");
  if (vec == 8) {
    constexpr int kPieces = kPadded / 8;
    for (int idx = threadIdx.x; idx < kRows * kPieces; idx += kThreads) {
      const int r = idx / kPieces, c = (idx % kPieces) * 8;
      const bool valid = row0 + r < T && c < Dh;
      const uint16_t* from = valid ? src + (row0 + r) * row_stride + c : src;
      cp_async_16(tile + tile_offset<kPadded, kSwizzled>(r, c), from, valid);
    }
  } else if (vec == 4) {
    constexpr int kPieces = kPadded / 4;
    for (int idx = threadIdx.x; idx < kRows * kPieces; idx += kThreads) {
      const int r = idx / kPieces, c = (idx % kPieces) * 4;
      const bool valid = row0 + r < T && c < Dh;
      const uint16_t* from = valid ? src + (row0 + r) * row_stride + c : src;
      cp_async<8>(tile + tile_offset<kPadded, kSwizzled>(r, c), from, valid);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * kPadded; idx += kThreads) {
      const int r = idx / kPadded, c = idx % kPadded;
      uint16_t x = 0;
      if (row0 + r < T && c < Dh) x = src[(row0 + r) * row_stride + c];
      tile[tile_offset<kPadded, kSwizzled>(r, c)] = x;
    }
  }
}

// The pipeline step of a loop over key tiles kt < n_kt (forward, dQ): start the cp.async loads
// of key and value tile kt + 1 into the other stage of ks, vs (2 stages of [64, kPadded + 8]),
// then wait until tile kt's stage is complete and visible to the block.
// kSwizzled (the wgmma forward): swizzled tiles, read next by the tensor cores' proxy, so every
// thread fences its copies into it before the barrier.
template <int kPadded, bool kSwizzled = false>
__device__ __forceinline__ void next_key_stage(uint16_t* ks, uint16_t* vs, const uint16_t* kb,
                                               const uint16_t* vb, int kt, int n_kt, int64_t T,
                                               int64_t kv_stride, int Dh, int vec) {
  constexpr int kStage = kSwizzled ? kSwizzledTile<kPadded> : kTile * kRowStride<kPadded>;
  const int next = (kt & 1) ^ 1;
  if (kt + 1 < n_kt) {
    load_tile<kTile, kPadded, kSwizzled>(ks + next * kStage, kb, (kt + 1) * kTile, T, kv_stride, Dh, vec);
    load_tile<kTile, kPadded, kSwizzled>(vs + next * kStage, vb, (kt + 1) * kTile, T, kv_stride, Dh, vec);
  }
  cp_async_commit();
  cp_async_wait<1>();
  if constexpr (kSwizzled) fence_proxy_async_shared();
  __syncthreads();
}

// A warp's 16 rows of fp32 accumulators (kPadded / 8 n-tiles), times `row_scale[half]`, plus
// `add_scale[half]` times the same rows of the bf16 tile `add` when it is not null, as bf16 into
// rows [row0, row0 + 16) of a shared tile that only this warp uses (`add` may be that tile).
template <int kPadded, bool kSwizzled = false>
__device__ __forceinline__ void stage_rows(uint16_t* tile, int row0,
                                           const float (&acc)[kPadded / 8][4],
                                           const float (&row_scale)[2],
                                           const uint16_t* add = nullptr,
                                           const float (&add_scale)[2] = {0.0f, 0.0f}) {
  const int lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
#pragma unroll
  for (int dt = 0; dt < kPadded / 8; ++dt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + grp + 8 * half, c = dt * 8 + 2 * tig;
      float lo = acc[dt][2 * half] * row_scale[half], hi = acc[dt][2 * half + 1] * row_scale[half];
      if (add != nullptr) {
        const uint32_t pair = *reinterpret_cast<const uint32_t*>(add + tile_offset<kPadded, kSwizzled>(r, c));
        lo = fmaf(add_scale[half], bf16_lo(pair), lo);
        hi = fmaf(add_scale[half], bf16_hi(pair), hi);
      }
      *reinterpret_cast<uint32_t*>(tile + tile_offset<kPadded, kSwizzled>(r, c)) = pack_bf16(lo, hi);
    }
}

// acc (a warp's 16 rows, accumulator layout) += coef[half] · row[half][col] for the bf16 rows
// `row[half]` of a global array (cols < Dh; null rows add nothing).
template <int kPadded>
__device__ __forceinline__ void add_rows(float (&acc)[kPadded / 8][4],
                                         const uint16_t* const (&row)[2], const float (&coef)[2],
                                         int Dh) {
  const int tig = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (row[half] == nullptr) continue;
#pragma unroll
    for (int dt = 0; dt < kPadded / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = dt * 8 + 2 * tig + e;
        if (c < Dh) acc[dt][2 * half + e] = fmaf(coef[half], bf16_load(row[half][c]), acc[dt][2 * half + e]);
      }
  }
}

// The warp stores rows [srow0, srow0 + 16) of a shared tile to rows [grow0, grow0 + 16) of a
// bf16 [*, row_stride] array (row < T, col < Dh only).
template <int kPadded, bool kSwizzled = false>
__device__ __forceinline__ void store_rows(uint16_t* dst, int64_t grow0, int64_t T,
                                           int64_t row_stride, int Dh, int vec,
                                           const uint16_t* tile, int srow0) {
  constexpr int kPieces = kPadded / 8;
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < kWarpRows * kPieces; idx += 32) {
    const int r = idx / kPieces, c = (idx % kPieces) * 8;
    const int64_t row = grow0 + r;
    if (row >= T || c >= Dh) continue;
    const uint16_t* from = tile + tile_offset<kPadded, kSwizzled>(srow0 + r, c);
    uint16_t* to = dst + row * row_stride + c;
    if (vec == 8) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else if (vec == 4) {  // Dh a multiple of 4: one or both 8-byte halves
      *reinterpret_cast<uint2*>(to) = *reinterpret_cast<const uint2*>(from);
      if (c + 4 < Dh) *reinterpret_cast<uint2*>(to + 4) = *reinterpret_cast<const uint2*>(from + 4);
    } else {
      for (int i = 0; i < 8 && c + i < Dh; ++i) to[i] = from[i];
    }
  }
}

// The dot of row r of two swizzled shared tiles, split over the 4 lanes of a quad (all 32 lanes
// of the warp call it; the quad's lanes get the same sum).
template <int kPadded>
__device__ __forceinline__ float quad_row_dot(const uint16_t* a, const uint16_t* b, int r) {
  const int tig = threadIdx.x % 4;
  float sum = 0.0f;
#pragma unroll
  for (int c = 2 * tig; c < kPadded; c += 8) {
    const uint32_t x = *reinterpret_cast<const uint32_t*>(a + tile_offset<kPadded, true>(r, c));
    const uint32_t y = *reinterpret_cast<const uint32_t*>(b + tile_offset<kPadded, true>(r, c));
    sum = fmaf(bf16_lo(x), bf16_lo(y), sum);
    sum = fmaf(bf16_hi(x), bf16_hi(y), sum);
  }
  return quad_sum(sum);
}

// The backward's wgmma kernels serve padded widths up to kWgmmaBackwardWidth
// (attention_launch.h); the mma.sync ones (dkdv_kernel with 32-row query tiles, dq_kernel) the
// wider. The forward is on wgmma at every width.
inline constexpr int kDkdvQueryTile = 32;  // query rows per tile of dkdv_kernel's loop

// ---- Forward ----------------------------------------------------------------------------------
// The forward's online softmax over one key tile for a warp's 16 rows row[0], row[1] (8 apart,
// the accumulator halves): the scores s (dots in; weights 2^(c (z − m)) out, for P V, with z =
// rule.score(dot) and c = rule.score_log2 > 0 its base-2 logits per unit), the running base-2
// maxima m (of c z) and sums l, and o rescaled to the new maxima. A tile's maxima are taken in
// the rule's units and c is applied in the exponential's FMA, which saves a multiply per
// score. `diagonal`: the
// tile reaches the rows' diagonal, so keys past T or outside the rule's mask get weight 0.
template <int kPadded, class Rule>
__device__ __forceinline__ void online_softmax_tile(const Rule& rule, float (&s)[kTile / 8][4], float (&m)[2],
                                                    float (&l)[2], float (&o)[kPadded / 8][4], bool diagonal,
                                                    int64_t j0, const int64_t (&row)[2], int64_t T) {
  constexpr int kKeyTiles = kTile / 8;
  constexpr int kDTiles = kPadded / 8;
  const int tig = threadIdx.x % 4;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e / 2;
      float x = rule.score(s[nt][e]);
      if (diagonal) {
        const int64_t j = j0 + nt * 8 + 2 * tig + (e & 1);
        if (!(j < T && rule.visible(row[half], j))) x = -INFINITY;
      }
      s[nt][e] = x;
      tile_max[half] = fmaxf(tile_max[half], x);
    }
  const float c = rule.score_log2;
  float base[2];  // minus the new maxima
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m_new = fmaxf(m[half], c * quad_max(tile_max[half]));
    // m_new = -inf: the row has seen no visible key yet (possible for rules with a strict
    // mask); exp2(-inf + 0) = 0 keeps the state at zero without NaN.
    base[half] = m_new == -INFINITY ? 0.0f : -m_new;
    const float alpha = exp2_approx(m[half] + base[half]);
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
      const float pr = exp2_approx(fmaf(s[nt][e], c, base[e / 2]));
      s[nt][e] = pr;
      l[e / 2] += pr;
    }
}

// The forward's occupancy (blocks per multiprocessor the registers must allow). At padded width
// 64 the compiler's 122 registers allow 4 blocks and shared memory 5; held to 96 registers (none
// spilled), 5 fit: FlashRelation forward 0.736 → 0.723 ms at (32, 2048, 8, 64) on the H200.
// Width 48 fits 5 blocks unbounded (93 registers); 80 and wider are bound by shared memory.
template <int kPadded>
inline constexpr int kForwardMinBlocks = kPadded == 64 ? 5 : 0;

// The TMA maps of the flash kernels that load by TMA: rank-4 maps of the [B, T, H, Dh] heads,
// boxes of one panel × 64 rows (tma_map_heads_bf16); the forward leaves dy unset.
struct HeadMaps {
  CUtensorMap q, dy;  // [B, T, Hq, Dh]
  CUtensorMap k, v;   // [B, T, Hkv, Dh]
};

// Rows row0 .. row0 + 63 of head h in batch b by TMA into the swizzled panels of a 64-row tile
// (one box per panel; rows past T and columns past Dh arrive as zeros), completing on `bar`,
// which must expect wgmma::Panels<kPadded>::kBytes for it. One thread issues it.
template <int kPadded>
__device__ __forceinline__ void tma_head_tile(uint16_t* dst, const CUtensorMap* map, uint64_t* bar, int64_t h,
                                              int64_t row0, int64_t b) {
  using Panels = wgmma::Panels<kPadded>;
#pragma unroll
  for (int pn = 0; pn < Panels::kBytes / Panels::kPanelBytes; ++pn)
    tma::load_4d(reinterpret_cast<unsigned char*>(dst) + pn * Panels::kPanelBytes, map, bar, pn * Panels::kPanelCols,
                 static_cast<int>(h), static_cast<int>(row0), static_cast<int>(b));
}

// Two tiles of the same rows of two maps (heads `head`, rows row0 ..) by TMA, on `bar`, which
// this arms for both. One thread issues it.
template <int kPadded>
__device__ __forceinline__ void tma_tile_pair(uint64_t* bar, uint16_t* a, const CUtensorMap* map_a, uint16_t* b,
                                              const CUtensorMap* map_b, int64_t head, int64_t row0, int64_t batch) {
  tma::arrive_expect(bar, 2 * wgmma::Panels<kPadded>::kBytes);
  tma_head_tile<kPadded>(a, map_a, bar, head, row0, batch);
  tma_head_tile<kPadded>(b, map_b, bar, head, row0, batch);
}

// The two-stage tile pairs of a loop filled by TMA (kTma): key and value tiles (forward, dQ
// pass) or query and dY tiles (dK/dV pass). Thread 0 arms stage it % 2's barrier and loads
// iteration it's pair, rows row0 .. of head `head`, into it; every thread waits for it before
// the iteration's products.
template <int kPadded>
struct TmaStages {
  uint16_t* a;     // 2 stages
  uint16_t* b;     // 2 stages
  uint64_t* full;  // 2 barriers
  const CUtensorMap* map_a;
  const CUtensorMap* map_b;
  int64_t batch;
  __device__ __forceinline__ void load(int64_t it, int64_t head, int64_t row0) const {
    constexpr int kT = kSwizzledTile<kPadded>;
    const int stage = static_cast<int>(it & 1);
    tma_tile_pair<kPadded>(&full[stage], a + stage * kT, map_a, b + stage * kT, map_b, head, row0, batch);
  }
  __device__ __forceinline__ void wait(int64_t it) const {
    tma::wait(&full[it & 1], static_cast<uint32_t>((it >> 1) & 1));
  }
  // Thread 0, first: the stages' barriers and `once_full` (the tiles the block loads once),
  // each with count 1.
  __device__ __forceinline__ void init(uint64_t* once_full) const {
    tma::init(&full[0], 1);
    tma::init(&full[1], 1);
    tma::init(once_full, 1);
    tma::fence_init();
  }
};

// The forward on wgmma (sm_90a). Grid (query tiles, Hq, B); tiles run heaviest (last) first. The
// block's 4 warps are one warpgroup: S = Q Kᵀ reads both operands from shared memory (K-major),
// O += P V takes P from the registers the online softmax leaves it in and V from shared memory
// (MN-major). The tiles are swizzled panels (kSwizzledTile) at 1024-byte aligned offsets, keys
// and values double-buffered: by cp.async from every thread, or (kTma; Dh a multiple of 8) by
// TMA from thread 0, which arms a stage's barrier and loads the next key and value tiles into
// the stage the block's last barrier freed, so the other threads issue no load instructions.
template <int kPadded, class Rule, int kMinBlocks = 0, bool kTma = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    forward_kernel(const ForwardIo a, const Rule rule, const __grid_constant__ HeadMaps maps) {
  constexpr int kChunks = kPadded / 16;  // k steps over the head width
  constexpr int kDTiles = kPadded / 8;   // n-tiles of the output
  constexpr int kKeyTiles = kTile / 8;   // n-tiles of the scores
  constexpr int kT = kSwizzledTile<kPadded>;
  using Panels = wgmma::Panels<kPadded>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* aligned = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  uint16_t* qs = reinterpret_cast<uint16_t*>(aligned);  // one tile; the output staging at the end
  uint16_t* ks = qs + kT;                               // 2 stages
  uint16_t* vs = ks + 2 * kT;                           // 2 stages
  // kTma: the barriers of the two key / value stages and of the query tile, after the tiles.
  uint64_t* full = reinterpret_cast<uint64_t*>(vs + 2 * kT);
  uint64_t* q_full = full + 2;

  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const TmaStages<kPadded> stages{ks, vs, full, &maps.k, &maps.v, b};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4;
  const int wrow = warp * kWarpRows;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t q_off = (b * T * d.Hq + h) * Dh;
  const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;
  const uint16_t* vb = a.v + (b * T * d.Hkv + g) * Dh;
  const int64_t row[2] = {p0 + wrow + grp, p0 + wrow + grp + 8};

  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      stages.init(q_full);
      tma::arrive_expect(q_full, Panels::kBytes);
      tma_head_tile<kPadded>(qs, &maps.q, q_full, h, p0, b);
      stages.load(0, g, 0);
    }
    __syncthreads();  // the barriers are initialized before anyone waits on them
  } else {
    load_tile<kTile, kPadded, true>(qs, a.q + q_off, p0, T, q_stride, Dh, vec);
    cp_async_commit();
    load_tile<kTile, kPadded, true>(ks, kb, 0, T, kv_stride, Dh, vec);
    load_tile<kTile, kPadded, true>(vs, vb, 0, T, kv_stride, Dh, vec);
    cp_async_commit();
  }

  float o[kDTiles][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  auto& o_flat = reinterpret_cast<float(&)[kPadded / 2]>(o);

  const int n_kt = static_cast<int>(p0 / kTile) + 1;  // key tiles up to the diagonal
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if constexpr (kTma) {
      // The other stage held tile kt − 1, which every thread finished with before the last
      // iteration's closing barrier.
      if (threadIdx.x == 0 && kt + 1 < n_kt) stages.load(kt + 1, g, static_cast<int64_t>(kt + 1) * kTile);
      if (kt == 0) tma::wait(q_full, 0);
      stages.wait(kt);
    } else {
      next_key_stage<kPadded, true>(ks, vs, kb, vb, kt, n_kt, T, kv_stride, Dh, vec);
    }
    const uint16_t* kst = ks + stage * kT;
    const uint16_t* vst = vs + stage * kT;

    float s[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    auto& s_flat = reinterpret_cast<float(&)[kTile / 2]>(s);
    wgmma::fence();
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      wgmma::mma<kTile, 0, 0>(s_flat, Panels::k_major(qs, kc * 16), Panels::k_major(kst, kc * 16), kc > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();

    online_softmax_tile<kPadded>(rule, s, m, l, o, kt == n_kt - 1, static_cast<int64_t>(kt) * kTile, row, T);

    // P as A fragments, all written before the fence that orders them for the tensor cores.
    uint32_t pa[kKeyTiles / 2][4];
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) pack_a(pa[kk], s, kk);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk)  // key rows 16 kk ..: 16 rows of 128 bytes in every panel
      wgmma::mma<kPadded, 1>(o_flat, pa[kk], Panels::mn_major(vst, kk * 16), true);
    wgmma::commit();
    wgmma::wait<0>();
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // The last stage still holds the diagonal key tile: rows p0.. of k and v, the Self rows.
  const uint16_t* k_diag = ks + ((n_kt - 1) & 1) * kT;
  const uint16_t* v_diag = vs + ((n_kt - 1) & 1) * kT;
  float hist[2], self[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l_row = quad_sum(l[half]);
    float self_dot = 0.0f;
    if constexpr (Rule::kSelf) self_dot = quad_row_dot<kPadded>(qs, k_diag, wrow + grp + 8 * half);
    RowWeights w{0.0f, 0.0f};
    if (row[half] < T)
      w = rule.finish_row((b * d.Hq + h) * T + row[half], row[half], m[half], l_row, self_dot,
                          lane % 4 == 0);
    hist[half] = w.hist;
    self[half] = w.self;
  }
  __syncwarp();  // the warp's rows of qs are read (above) before they are staged over
  stage_rows<kPadded, true>(qs, wrow, o, hist, Rule::kSelf ? v_diag : nullptr, self);
  __syncwarp();
  store_rows<kPadded, true>(a.y + q_off, p0 + wrow, T, q_stride, Dh, vec, qs, wrow);
}

// ---- Backward ---------------------------------------------------------------------------------
// The one-pass dQ's sums (BackwardIo::dq_accum): per (batch, query head) an fp32 block of
// [T rounded up to 64, kPadded], query row p's element c at column dq_sum_col(p % 64, c). The
// column swizzle by the row's low 3 bits spreads a warp's float2 fragment stores over all banks
// of the shared tile the dK/dV pass stages each share in.
template <int kPadded>
__device__ __forceinline__ int dq_sum_col(int r, int c) {
  return c ^ ((r & 7) << (kPadded % 32 == 0 ? 2 : 1));
}

// The dK/dV passes' rule step over one query tile for a warp's key rows key[0], key[1]: the
// scores S^T (st) and dP^T (dpt) in, P^T and dS^T out (zero outside the mask when the query tile
// starting at p0 reaches into the key tile starting at j0).
template <int kQueryTiles, class Rule>
__device__ __forceinline__ void key_tile_grads(const Rule& rule, float (&st)[kQueryTiles][4],
                                               float (&dpt)[kQueryTiles][4], const float* norm_t,
                                               const float* delta_t, int64_t p0, int64_t j0,
                                               const int64_t (&key)[2], int64_t T) {
  const int tig = threadIdx.x % 4;
  const bool masked = p0 < j0 + kTile;  // the query tile reaches into the key tile
#pragma unroll
  for (int nt = 0; nt < kQueryTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = nt * 8 + 2 * tig + (e & 1);
      ScoreGrad sg = rule.grad(st[nt][e], norm_t[c], dpt[nt][e], delta_t[c]);
      if (masked) {
        const int64_t p = p0 + c, j = key[e / 2];
        if (!(j < T && p < T && rule.visible(p, j))) sg = ScoreGrad{0.0f, 0.0f};
      }
      st[nt][e] = sg.prob;
      dpt[nt][e] = sg.ds;
    }
}

// The dK/dV passes' end for a warp's key rows: the Self row terms (kSelf rules), then dk (scaled)
// and dv staged through the warp's own rows of the key and value tiles ks, vs (the 64-row tiles
// starting at key j0; `warp` the warp's index in its warpgroup) and stored.
template <int kPadded, bool kSwizzled, class Rule>
__device__ __forceinline__ void finish_key_rows(const BackwardIo& a, const Rule& rule, float (&dk)[kPadded / 8][4],
                                                float (&dv)[kPadded / 8][4], uint16_t* ks, uint16_t* vs,
                                                int64_t j0, const int64_t (&key)[2], int warp) {
  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const int64_t T = d.T, g = blockIdx.y, b = blockIdx.z;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t kv_off = (b * T * d.Hkv + g) * Dh;
  if constexpr (Rule::kSelf) {  // Hq = Hkv: key row j of head g is also query row j of head g
    const uint16_t* q_row[2] = {nullptr, nullptr};
    const uint16_t* dy_row[2] = {nullptr, nullptr};
    float dk_coef[2] = {0.0f, 0.0f}, dv_coef[2] = {0.0f, 0.0f};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (key[half] >= T) continue;
      const int64_t off = (b * T * d.Hq + g) * Dh + key[half] * q_stride;
      q_row[half] = a.q + off;
      dy_row[half] = a.dy + off;
      rule.key_self((b * d.Hq + g) * T + key[half], dk_coef[half], dv_coef[half]);
    }
    add_rows<kPadded>(dk, q_row, dk_coef, Dh);
    add_rows<kPadded>(dv, dy_row, dv_coef, Dh);
  }

  // Each warp stages its own 16 rows of ks / vs (read by no other warp).
  __syncwarp();
  const float dk_scale[2] = {rule.scale, rule.scale}, one[2] = {1.0f, 1.0f};
  stage_rows<kPadded, kSwizzled>(ks, warp * kWarpRows, dk, dk_scale);
  stage_rows<kPadded, kSwizzled>(vs, warp * kWarpRows, dv, one);
  __syncwarp();
  const int64_t row0 = j0 + warp * kWarpRows;
  store_rows<kPadded, kSwizzled>(a.dk + kv_off, row0, T, kv_stride, Dh, vec, ks, warp * kWarpRows);
  store_rows<kPadded, kSwizzled>(a.dv + kv_off, row0, T, kv_stride, Dh, vec, vs, warp * kWarpRows);
}

// A warp's dK and dV accumulators (16 key rows × kPadded), zeroed.
template <int kPadded>
__device__ __forceinline__ void zero_key_grads(float (&dk)[kPadded / 8][4], float (&dv)[kPadded / 8][4]) {
#pragma unroll
  for (int dt = 0; dt < kPadded / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
}

// The dK/dV passes' loop for the block's keys from j0 on, of KV head g in batch b (the block's):
// over the group's query heads and the query tiles of kRows rows at or after j0 (causal, so the
// query rows before j0 see none of its keys). Iteration `it` covers query head head(it) and the
// query tile starting at tile(it).
template <int kRows>
struct KeyTileLoop {
  int64_t T, Hq, group, g, b, j0, nq, total;
  // The keys of 64-row key tile blockIdx.x.
  __device__ __forceinline__ explicit KeyTileLoop(const Dims& d)
      : T(d.T), Hq(d.Hq), group(d.Hq / d.Hkv), g(blockIdx.y), b(blockIdx.z),
        j0(static_cast<int64_t>(blockIdx.x) * kTile), nq((d.T - j0 + kRows - 1) / kRows), total(group * nq) {}
  __device__ __forceinline__ KeyTileLoop(const Dims& d, int64_t first_key)
      : T(d.T), Hq(d.Hq), group(d.Hq / d.Hkv), g(blockIdx.y), b(blockIdx.z), j0(first_key),
        nq((d.T - j0 + kRows - 1) / kRows), total(group * nq) {}
  __device__ __forceinline__ int64_t head(int64_t it) const { return g * group + it / nq; }
  __device__ __forceinline__ int64_t tile(int64_t it) const { return j0 + (it % nq) * kRows; }
  // The normalizer and D of query row tile(it) + r: past T +inf (so P = 0 there) and 0.
  template <class Rule>
  __device__ __forceinline__ float norm(const Rule& rule, int64_t it, unsigned r) const {
    const int64_t p = tile(it) + r;
    return p < T ? rule.row_norm2((b * Hq + head(it)) * T + p) : INFINITY;
  }
  __device__ __forceinline__ float delta(const float* rows, int64_t it, unsigned r) const {
    const int64_t p = tile(it) + r;
    return p < T ? rows[(b * Hq + head(it)) * T + p] : 0.0f;
  }
};

// dK, dV. Grid (key tiles, Hkv, B); the lowest key tiles (the most query tiles) run first.
// Loops over the group's query heads and the query tiles at or after the key tile, so dk and dv
// are summed in a fixed order:
//   (P_pj, dS_pj) = rule.grad(q_p·k_j, norm_p, dy_p·v_j, D_p),
//   dv_j = Σ_p P_pj dy_p,  dk_j = scale · Σ_p dS_pj q_p (plus the Self row terms).
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const BackwardIo a, const Rule rule) {
  static_assert(kPadded > kWgmmaBackwardWidth, "narrower heads take dkdv_wgmma_kernel");
  constexpr int S = kRowStride<kPadded>;
  constexpr int kDTiles = kPadded / 8;
  constexpr int kBr = kDkdvQueryTile;
  constexpr int kQueryTiles = kBr / 8;  // n-tiles of S^T
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw);  // [64, S] key tile; dk staging at the end
  uint16_t* vs = ks + kTile * S;                          // [64, S] value tile; dv staging
  uint16_t* qs = vs + kTile * S;                          // 2 stages of [kBr, S] each:
  uint16_t* dys = qs + 2 * kBr * S;                       //   query and dy tiles
  float* norm_s = reinterpret_cast<float*>(dys + 2 * kBr * S);  // 2 stages of [kBr], base 2
  float* delta_s = norm_s + 2 * kBr;                            // 2 stages of [kBr]

  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const KeyTileLoop<kBr> loop(d);
  const int64_t T = d.T, j0 = loop.j0, g = loop.g, b = loop.b, total = loop.total;
  const int warp = threadIdx.x / 32, grp = threadIdx.x % 32 / 4;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t kv_off = (b * T * d.Hkv + g) * Dh;
  const int64_t key[2] = {j0 + warp * kWarpRows + grp, j0 + warp * kWarpRows + grp + 8};
  auto issue = [&](int64_t it, int stage) {
    const int64_t q_off = (b * T * d.Hq + loop.head(it)) * Dh, p0 = loop.tile(it);
    load_tile<kBr, kPadded>(qs + stage * kBr * S, a.q + q_off, p0, T, q_stride, Dh, vec);
    load_tile<kBr, kPadded>(dys + stage * kBr * S, a.dy + q_off, p0, T, q_stride, Dh, vec);
  };

  load_tile<kTile, kPadded>(ks, a.k + kv_off, j0, T, kv_stride, Dh, vec);
  load_tile<kTile, kPadded>(vs, a.v + kv_off, j0, T, kv_stride, Dh, vec);
  cp_async_commit();
  issue(0, 0);
  cp_async_commit();
  if (threadIdx.x < kBr) {
    norm_s[threadIdx.x] = loop.norm(rule, 0, threadIdx.x);
    delta_s[threadIdx.x] = loop.delta(a.delta, 0, threadIdx.x);
  }

  float dk[kDTiles][4], dv[kDTiles][4];
  zero_key_grads<kPadded>(dk, dv);

  for (int64_t it = 0; it < total; ++it) {
    const int stage = static_cast<int>(it & 1);
    float norm_next = 0.0f, delta_next = 0.0f;
    if (it + 1 < total) {
      issue(it + 1, stage ^ 1);
      if (threadIdx.x < kBr) {
        norm_next = loop.norm(rule, it + 1, threadIdx.x);
        delta_next = loop.delta(a.delta, it + 1, threadIdx.x);
      }
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* qst = qs + stage * kBr * S;
    const uint16_t* dyst = dys + stage * kBr * S;
    const float* norm_t = norm_s + stage * kBr;
    const float* delta_t = delta_s + stage * kBr;

    float st[kQueryTiles][4], dpt[kQueryTiles][4];
    two_products<kPadded>(st, ks, qst, dpt, vs, dyst, warp * kWarpRows);

    const int64_t p0 = loop.tile(it);
    key_tile_grads(rule, st, dpt, norm_t, delta_t, p0, j0, key, T);

#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      pack_a(pa, st, kk);
      pack_a(dsa, dpt, kk);
      mma_by_cols<kPadded>(dv, pa, dyst, dk, dsa, qst, kk * 16);
    }
    if (threadIdx.x < kBr) {
      norm_s[(stage ^ 1) * kBr + threadIdx.x] = norm_next;
      delta_s[(stage ^ 1) * kBr + threadIdx.x] = delta_next;
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  finish_key_rows<kPadded, false>(a, rule, dk, dv, ks, vs, j0, key, warp);
}

// The two-pass wgmma backward's occupancy (blocks per multiprocessor the registers must allow,
// __launch_bounds__'s second argument). The passes are latency-bound with two 4-warp blocks per
// SM (ncu at width 64: tensor pipe 19% active, no pipe near its limit), so at padded widths 48
// and 64 dK/dV is held to 168 registers (3 blocks; at most 80 bytes spilled) and dQ to 128 (4
// blocks; none spilled). H200, FlashRelation backward: 1.462 → 1.213 ms at (64, 1024, 8, 48),
// 2.730 → 2.319 ms at (32, 2048, 8, 64). At width 80 the same bounds spill 280-440 bytes and
// were slower (2.90 → 3.88 ms), so other widths keep the compiler's choice (0: no minimum).
template <int kPadded>
inline constexpr int kDkdvMinBlocks = kPadded == 48 || kPadded == 64 ? 3 : 0;
template <int kPadded>
inline constexpr int kDqMinBlocks = kPadded == 48 || kPadded == 64 ? 4 : 0;

// The wgmma backward's two score products over the head width, from zero, waited for: acc =
// A · B^T and acc2 = A2 · B2^T for the swizzled 64-row tiles a, b, a2, b2 (all K-major).
template <int kPadded>
__device__ __forceinline__ void two_products_wgmma(float (&acc)[kTile / 8][4], const uint16_t* a, const uint16_t* b,
                                                   float (&acc2)[kTile / 8][4], const uint16_t* a2,
                                                   const uint16_t* b2) {
  using Panels = wgmma::Panels<kPadded>;
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = acc2[nt][e] = 0.0f;
  auto& flat = reinterpret_cast<float(&)[kTile / 2]>(acc);
  auto& flat2 = reinterpret_cast<float(&)[kTile / 2]>(acc2);
  wgmma::fence();
#pragma unroll
  for (int kc = 0; kc < kPadded / 16; ++kc) {
    wgmma::mma<kTile, 0, 0>(flat, Panels::k_major(a, kc * 16), Panels::k_major(b, kc * 16), kc > 0);
    wgmma::mma<kTile, 0, 0>(flat2, Panels::k_major(a2, kc * 16), Panels::k_major(b2, kc * 16), kc > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
}

// The two-pass dK/dV step after the rule step (st = P^T, dpt = dS^T, a warp's 16 key rows):
// dV += P^T dY and dK += dS^T Q, P^T and dS^T as A fragments from registers, dY and Q
// MN-major; waited for, so the query and dY tiles may be refilled on return.
template <int kPadded>
__device__ __forceinline__ void two_pass_products(const float (&st)[kTile / 8][4], const float (&dpt)[kTile / 8][4],
                                                  float (&dk_flat)[kPadded / 2], float (&dv_flat)[kPadded / 2],
                                                  const uint16_t* qst, const uint16_t* dyst) {
  using Panels = wgmma::Panels<kPadded>;
  uint32_t pa[kTile / 16][4], dsa[kTile / 16][4];
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    pack_a(pa[kk], st, kk);
    pack_a(dsa[kk], dpt, kk);
  }
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {  // k = query rows 16 kk .. of dO and Q (MN-major)
    wgmma::mma<kPadded, 1>(dv_flat, pa[kk], Panels::mn_major(dyst, kk * 16), true);
    wgmma::mma<kPadded, 1>(dk_flat, dsa[kk], Panels::mn_major(qst, kk * 16), true);
  }
  wgmma::commit();
  wgmma::wait<0>();
}

// The one-pass dK/dV step after the rule step of a warpgroup's 64 key rows against one 64-row
// query tile (st = P^T, dpt = dS^T, a warp's 16 rows, `warp` its index in the warpgroup): dS^T
// staged in dss (row = key, column = query), then dV += P^T dY (P^T from registers), dK +=
// dS^T Q (dS^T from dss, K-major, so its fragments are not held beside dQ's accumulators) and
// the tile's dQ share dS K (dS^T and K MN-major) written into the fp32 tile dqs as the sums
// a.dq_accum are laid out (dq_sum_col). `issuer`, the one thread of the warpgroup that issues
// its bulk reductions, first waits until the last share has left dqs; `sync()` synchronizes
// the threads that share dss and dqs. On return the share is fenced for a bulk reduction.
template <int kPadded, class Sync>
__device__ __forceinline__ void one_pass_products(const float (&st)[kTile / 8][4], const float (&dpt)[kTile / 8][4],
                                                  float (&dk_flat)[kPadded / 2], float (&dv_flat)[kPadded / 2],
                                                  const uint16_t* ks, const uint16_t* qst, const uint16_t* dyst,
                                                  uint16_t* dss, float* dqs, int warp, bool issuer, Sync sync) {
  using Panels = wgmma::Panels<kPadded>;
  constexpr int kDTiles = kPadded / 8;
  const int lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  uint32_t pa[kTile / 16][4];
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) pack_a(pa[kk], st, kk);
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int kr = warp * kWarpRows + grp + 8 * half, qc = nt * 8 + 2 * tig;
      *reinterpret_cast<uint32_t*>(dss + tile_offset<64, true>(kr, qc)) =
          pack_bf16(dpt[nt][2 * half], dpt[nt][2 * half + 1]);
    }
  fence_proxy_async_shared();
  if (issuer) bulk_wait_read();  // the last share has left dqs
  sync();
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    // k = query rows 16 kk .. of dO and Q (MN-major) and columns 16 kk .. of dS^T (K-major).
    wgmma::mma<kPadded, 1>(dv_flat, pa[kk], Panels::mn_major(dyst, kk * 16), true);
    wgmma::mma<kPadded, 0, 1>(dk_flat, wgmma::Panels<kTile>::k_major(dss, kk * 16), Panels::mn_major(qst, kk * 16),
                              true);
  }
  // dQ's share dS K, k = key rows 16 kk .. of dS^T and K (both MN-major).
  float dq[kDTiles][4];
  auto& dq_flat = reinterpret_cast<float(&)[kPadded / 2]>(dq);
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk)
    wgmma::mma<kPadded, 1, 1>(dq_flat, wgmma::Panels<kTile>::mn_major(dss, kk * 16), Panels::mn_major(ks, kk * 16),
                              kk > 0);
  wgmma::commit();
  wgmma::wait<0>();
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp * kWarpRows + grp + 8 * half, c = dt * 8 + 2 * tig;
      *reinterpret_cast<float2*>(dqs + r * kPadded + dq_sum_col<kPadded>(r, c)) =
          make_float2(dq[dt][2 * half], dq[dt][2 * half + 1]);
    }
  fence_proxy_async_shared();  // the share is read by a bulk reduction next
}

// dK and dV on wgmma (head widths up to kWgmmaBackwardWidth), one warpgroup over 64 keys:
// dkdv_kernel's grid, loop and rule step with 64-row query tiles, every product a warpgroup
// product over swizzled tiles (kSwizzledTile): S^T = K Q^T and dP^T = V dO^T from shared memory
// (K-major); dV += P^T dO and dK += dS^T Q with P^T, dS^T from registers and dO, Q MN-major.
// Tiles by cp.async, or (kTma) by TMA from thread 0 (the query and dY tiles as forward_kernel's
// key and value tiles; the row terms still from the threads, published by the iteration's
// closing barrier).
template <int kPadded, class Rule, int kMinBlocks = 0, bool kTma = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    dkdv_wgmma_kernel(const BackwardIo a, const Rule rule, const __grid_constant__ HeadMaps maps) {
  static_assert(kPadded <= 96, "the wgmma backward takes head widths up to 96");
  constexpr int kDTiles = kPadded / 8;
  constexpr int kQueryTiles = kTile / 8;  // n-tiles of S^T
  constexpr int kT = kSwizzledTile<kPadded>;
  using Panels = wgmma::Panels<kPadded>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* aligned = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  uint16_t* ks = reinterpret_cast<uint16_t*>(aligned);  // key tile; dk staging at the end
  uint16_t* vs = ks + kT;                                // value tile; dv staging
  uint16_t* qs = vs + kT;                                // 2 stages of query tiles
  uint16_t* dys = qs + 2 * kT;                           // 2 stages of dy tiles
  float* norm_s = reinterpret_cast<float*>(dys + 2 * kT);  // 2 stages of [64], base 2
  float* delta_s = norm_s + 2 * kTile;                     // 2 stages of [64]
  // kTma: the barriers of the two query / dY stages and of the key and value tiles.
  uint64_t* full = reinterpret_cast<uint64_t*>(delta_s + 2 * kTile);
  uint64_t* kv_full = full + 2;

  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const KeyTileLoop<kTile> loop(d);
  const int64_t T = d.T, j0 = loop.j0, g = loop.g, b = loop.b, total = loop.total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t kv_off = (b * T * d.Hkv + g) * Dh;
  const int64_t key[2] = {j0 + warp * kWarpRows + grp, j0 + warp * kWarpRows + grp + 8};
  auto issue = [&](int64_t it, int stage) {
    const int64_t q_off = (b * T * d.Hq + loop.head(it)) * Dh, p0 = loop.tile(it);
    load_tile<kTile, kPadded, true>(qs + stage * kT, a.q + q_off, p0, T, q_stride, Dh, vec);
    load_tile<kTile, kPadded, true>(dys + stage * kT, a.dy + q_off, p0, T, q_stride, Dh, vec);
  };

  const TmaStages<kPadded> stages{qs, dys, full, &maps.q, &maps.dy, b};

  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      stages.init(kv_full);
      tma_tile_pair<kPadded>(kv_full, ks, &maps.k, vs, &maps.v, g, j0, b);
      stages.load(0, loop.head(0), loop.tile(0));
    }
  } else {
    load_tile<kTile, kPadded, true>(ks, a.k + kv_off, j0, T, kv_stride, Dh, vec);
    load_tile<kTile, kPadded, true>(vs, a.v + kv_off, j0, T, kv_stride, Dh, vec);
    cp_async_commit();
    issue(0, 0);
    cp_async_commit();
  }
  if (threadIdx.x < kTile) {
    norm_s[threadIdx.x] = loop.norm(rule, 0, threadIdx.x);
    delta_s[threadIdx.x] = loop.delta(a.delta, 0, threadIdx.x);
  }
  if constexpr (kTma) __syncthreads();  // the barriers and the first row terms are in place

  float dk[kDTiles][4], dv[kDTiles][4];
  zero_key_grads<kPadded>(dk, dv);
  auto& dk_flat = reinterpret_cast<float(&)[kPadded / 2]>(dk);
  auto& dv_flat = reinterpret_cast<float(&)[kPadded / 2]>(dv);

  for (int64_t it = 0; it < total; ++it) {
    const int stage = static_cast<int>(it & 1);
    float norm_next = 0.0f, delta_next = 0.0f;
    if (it + 1 < total) {
      if constexpr (kTma) {
        // The other stage held iteration it − 1's tiles, which every thread finished with
        // before that iteration's closing barrier.
        if (threadIdx.x == 0) stages.load(it + 1, loop.head(it + 1), loop.tile(it + 1));
      } else {
        issue(it + 1, stage ^ 1);
      }
      if (threadIdx.x < kTile) {
        norm_next = loop.norm(rule, it + 1, threadIdx.x);
        delta_next = loop.delta(a.delta, it + 1, threadIdx.x);
      }
    }
    if constexpr (kTma) {
      if (it == 0) tma::wait(kv_full, 0);
      stages.wait(it);
    } else {
      cp_async_commit();
      cp_async_wait<1>();
      fence_proxy_async_shared();  // the tiles are read by the tensor cores
      __syncthreads();
    }
    const uint16_t* qst = qs + stage * kT;
    const uint16_t* dyst = dys + stage * kT;
    const float* norm_t = norm_s + stage * kTile;
    const float* delta_t = delta_s + stage * kTile;

    float st[kQueryTiles][4], dpt[kQueryTiles][4];
    two_products_wgmma<kPadded>(st, ks, qst, dpt, vs, dyst);

    const int64_t p0 = loop.tile(it);
    key_tile_grads(rule, st, dpt, norm_t, delta_t, p0, j0, key, T);

    two_pass_products<kPadded>(st, dpt, dk_flat, dv_flat, qst, dyst);
    if (threadIdx.x < kTile) {
      norm_s[(stage ^ 1) * kTile + threadIdx.x] = norm_next;
      delta_s[(stage ^ 1) * kTile + threadIdx.x] = delta_next;
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  finish_key_rows<kPadded, true>(a, rule, dk, dv, ks, vs, j0, key, warp);
}

// ---- The warp-specialized dK/dV ----------------------------------------------------------------
// FlashAttention-3's backward layout (kOnePass: with the one-pass dQ): a block of three warpgroups over 128
// key rows. Warpgroups 0 and 1 are consumers, each owning 64 key rows (its K and V tiles loaded
// once); warpgroup 2 is the producer, whose first warp walks the block's query tiles (those at
// or after the block's first key, of every query head of the KV head) and, per tile, fills one
// stage of a ring: its 32 lanes write the tile's normalizers and D into shared memory, and lane
// 0 arms the stage's full barrier and loads the query and dY tiles by TMA (rank-4 maps of the
// [B, T, H, Dh] heads, one box per panel, rows past T zero). Both consumers read every stage (the
// loads are shared), run dkdv_wgmma_kernel's iteration on it (S^T, dP^T, the rule step, dV, dK
// and the dQ share from the staged dS^T) and release it on the empty barrier (one arrival per
// consumer warp); each adds its own 64-key share into the sums by one bulk reduction. A consumer
// skips (waits and releases only) the query tiles that end before its keys. setmaxnreg gives the
// consumers 232 registers and the producer 40 (of 168 at launch). No __syncthreads after the
// start: the warpgroups synchronize by the barriers and named barriers 1 and 2 (one per
// consumer).
inline constexpr int kWsKeys = 2 * kTile;     // key rows per block
inline constexpr int kWsStages = 3;           // query / dY tiles in flight
inline constexpr int kWsThreads = 3 * 128;    // consumers 0, 1; the producer warpgroup 2

template <int kPadded, bool kOnePass>
struct WsLayout {
  using Panels = wgmma::Panels<kPadded>;
  static constexpr uint32_t kTileBytes = Panels::kBytes;
  // Per consumer: its K and V tiles; kOnePass: the dS^T tile (Panels<64>) and the fp32 dQ share.
  static constexpr uint32_t kConsumerBytes =
      2 * kTileBytes + (kOnePass ? wgmma::Panels<kTile>::kBytes + sizeof(float) * kTile * kPadded : 0);
  static_assert(kConsumerBytes % 1024 == 0, "the consumers' tiles stay 1024-byte aligned");
  static constexpr uint32_t kRingOffset = 2 * kConsumerBytes;
  // Stage s: its query and dY tiles at kRingOffset + 2 s kTileBytes; the stages' normalizers and
  // D after all tiles, then the barriers: full[kWsStages], empty[kWsStages], kv_full.
  static constexpr uint32_t kRowTermOffset = kRingOffset + kWsStages * 2 * kTileBytes;
  static constexpr uint32_t kBarrierOffset = kRowTermOffset + kWsStages * 2 * sizeof(float) * kTile;
  static constexpr size_t kSmem = 1024 + kBarrierOffset + (2 * kWsStages + 1) * sizeof(uint64_t);
};

template <int kPadded, class Rule, bool kOnePass>
__global__ void __launch_bounds__(kWsThreads, 1)
    dkdv_ws_kernel(const BackwardIo a, const Rule rule, const __grid_constant__ HeadMaps maps) {
  static_assert(kPadded <= kWgmmaBackwardWidth, "the wgmma backward takes head widths up to 96");
  using L = WsLayout<kPadded, kOnePass>;
  using Panels = wgmma::Panels<kPadded>;
  constexpr int kDTiles = kPadded / 8;
  constexpr int kQueryTiles = kTile / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  uint64_t* full = reinterpret_cast<uint64_t*>(base + L::kBarrierOffset);
  uint64_t* empty = full + kWsStages;
  uint64_t* kv_full = empty + kWsStages;
  auto q_stage = [&](int s) { return reinterpret_cast<uint16_t*>(base + L::kRingOffset + 2 * s * L::kTileBytes); };
  auto dy_stage = [&](int s) { return q_stage(s) + L::kTileBytes / 2; };
  auto norm_stage = [&](int s) { return reinterpret_cast<float*>(base + L::kRowTermOffset) + 2 * s * kTile; };
  auto delta_stage = [&](int s) { return norm_stage(s) + kTile; };

  const Dims& d = a.dims;
  const KeyTileLoop<kTile> loop(d, static_cast<int64_t>(blockIdx.x) * kWsKeys);
  const int64_t T = d.T, j0 = loop.j0, g = loop.g, b = loop.b, total = loop.total;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      tma::init(&full[s], 32);     // the producer warp's lanes (lane 0 also expects the bytes)
      tma::init(&empty[s], 8);     // the consumer warps
    }
    tma::init(kv_full, 1);
    tma::fence_init();
  }
  __syncthreads();

  if (wg == 2) {  // the producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp != 0) return;
    if (lane == 0) {  // both consumers' K and V tiles
      tma::arrive_expect(kv_full, 4 * L::kTileBytes);
      for (int c = 0; c < 2; ++c) {
        unsigned char* ct = base + c * L::kConsumerBytes;
        tma_head_tile<kPadded>(reinterpret_cast<uint16_t*>(ct), &maps.k, kv_full, g, j0 + c * kTile, b);
        tma_head_tile<kPadded>(reinterpret_cast<uint16_t*>(ct + L::kTileBytes), &maps.v, kv_full, g, j0 + c * kTile,
                               b);
      }
    }
    for (int64_t it = 0; it < total; ++it) {
      const int s = static_cast<int>(it % kWsStages);
      const int64_t use = it / kWsStages;
      if (use > 0) tma::wait(&empty[s], static_cast<uint32_t>((use - 1) & 1));  // its last tile was released
      const int64_t h = loop.head(it), p0 = loop.tile(it);
      for (unsigned r = lane; r < kTile; r += 32) {
        norm_stage(s)[r] = loop.norm(rule, it, r);
        delta_stage(s)[r] = loop.delta(a.delta, it, r);
      }
      if (lane == 0) {
        tma::arrive_expect(&full[s], 2 * L::kTileBytes);
        tma_head_tile<kPadded>(q_stage(s), &maps.q, &full[s], h, p0, b);
        tma_head_tile<kPadded>(dy_stage(s), &maps.dy, &full[s], h, p0, b);
      } else {
        tma::arrive(&full[s]);  // this lane's row terms are written
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int c = wg, tid = threadIdx.x % 128, grp = lane / 4;
  unsigned char* ct = base + c * L::kConsumerBytes;
  uint16_t* ks = reinterpret_cast<uint16_t*>(ct);
  uint16_t* vs = reinterpret_cast<uint16_t*>(ct + L::kTileBytes);
  uint16_t* dss = reinterpret_cast<uint16_t*>(ct + 2 * L::kTileBytes);
  float* dqs = reinterpret_cast<float*>(ct + 2 * L::kTileBytes + wgmma::Panels<kTile>::kBytes);
  const int64_t jc = j0 + c * kTile;  // this consumer's first key
  const int64_t key[2] = {jc + warp * kWarpRows + grp, jc + warp * kWarpRows + grp + 8};
  auto group_sync = [&] {  // this consumer warpgroup only (an immediate id)
    if (c == 0)
      asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else
      asm volatile("bar.sync 2, 128;\n" ::: "memory");
  };

  float dk[kDTiles][4], dv[kDTiles][4];
  zero_key_grads<kPadded>(dk, dv);
  auto& dk_flat = reinterpret_cast<float(&)[kPadded / 2]>(dk);
  auto& dv_flat = reinterpret_cast<float(&)[kPadded / 2]>(dv);
  tma::wait(kv_full, 0);

  for (int64_t it = 0; it < total; ++it) {
    const int s = static_cast<int>(it % kWsStages);
    tma::wait(&full[s], static_cast<uint32_t>((it / kWsStages) & 1));
    const int64_t p0 = loop.tile(it);
    const bool active = jc < T && p0 + kTile > jc;  // some query of the tile may see our keys
    if (active) {
      const uint16_t* qst = q_stage(s);
      const uint16_t* dyst = dy_stage(s);
      float st[kQueryTiles][4], dpt[kQueryTiles][4];
      two_products_wgmma<kPadded>(st, ks, qst, dpt, vs, dyst);
      key_tile_grads(rule, st, dpt, norm_stage(s), delta_stage(s), p0, jc, key, T);
      if constexpr (kOnePass) {
        one_pass_products<kPadded>(st, dpt, dk_flat, dv_flat, ks, qst, dyst, dss, dqs, warp, tid == 0, group_sync);
        __syncwarp();
        if (lane == 0) tma::arrive(&empty[s]);  // this warp is done with the stage
        group_sync();
        if (tid == 0)
          bulk_reduce_add_f32(a.dq_accum + ((b * d.Hq + loop.head(it)) * flash_dq_sum_rows(T) + p0) * kPadded, dqs,
                              sizeof(float) * kTile * kPadded);
      } else {
        two_pass_products<kPadded>(st, dpt, dk_flat, dv_flat, qst, dyst);
        __syncwarp();
        if (lane == 0) tma::arrive(&empty[s]);
      }
    } else {
      __syncwarp();
      if (lane == 0) tma::arrive(&empty[s]);
    }
  }
  if (kOnePass && tid == 0) bulk_wait();  // dqs stays allocated until the sums are complete

  finish_key_rows<kPadded, true>(a, rule, dk, dv, ks, vs, jc, key, warp);
}

// The dQ passes' rule step over one key tile (starting at j0) for a warp's query rows row[0],
// row[1] with their normalizers and D: the scores S and dP in, dS out in dp (zero outside the
// mask on the diagonal tile).
template <class Rule>
__device__ __forceinline__ void query_tile_grads(const Rule& rule, float (&s)[kTile / 8][4],
                                                 float (&dp)[kTile / 8][4], const float (&norm2)[2],
                                                 const float (&delta)[2], bool diagonal, int64_t j0,
                                                 const int64_t (&row)[2], int64_t T) {
  const int tig = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e / 2;
      float ds = rule.grad(s[nt][e], norm2[half], dp[nt][e], delta[half]).ds;
      if (diagonal) {
        const int64_t j = j0 + nt * 8 + 2 * tig + (e & 1);
        if (!(j < T && row[half] < T && rule.visible(row[half], j))) ds = 0.0f;
      }
      dp[nt][e] = ds;
    }
}

// The dQ passes' end for a warp's query rows: the Self row term (kSelf rules), then dq scaled,
// staged through the warp's own rows of the query tile qs and stored.
template <int kPadded, bool kSwizzled, class Rule>
__device__ __forceinline__ void finish_query_rows(const BackwardIo& a, const Rule& rule, float (&dq)[kPadded / 8][4],
                                                  uint16_t* qs, int64_t p0, const int64_t (&row)[2]) {
  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const int64_t T = d.T, h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int wrow = threadIdx.x / 32 * kWarpRows;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  if constexpr (Rule::kSelf) {  // Hq = Hkv: query row p of head h is also key row p of head h
    const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;
    const uint16_t* k_row[2] = {nullptr, nullptr};
    float coef[2] = {0.0f, 0.0f};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (row[half] >= T) continue;
      k_row[half] = kb + row[half] * kv_stride;
      coef[half] = rule.query_self((b * d.Hq + h) * T + row[half]);
    }
    add_rows<kPadded>(dq, k_row, coef, Dh);
  }

  // The warp stages its own 16 rows of qs (read by no other warp).
  const float dq_scale[2] = {rule.scale, rule.scale};
  stage_rows<kPadded, kSwizzled>(qs, wrow, dq, dq_scale);
  __syncwarp();
  store_rows<kPadded, kSwizzled>(a.dq + (b * T * d.Hq + h) * Dh, p0 + wrow, T, q_stride, Dh, vec, qs, wrow);
}

// The dQ passes' row terms of a thread's query rows row[0], row[1] of head h in batch b: the
// base-2 normalizer (+inf past T, so P = 0 there) and D.
template <class Rule>
__device__ __forceinline__ void query_row_terms(const BackwardIo& a, const Rule& rule, const int64_t (&row)[2],
                                                int64_t h, int64_t b, float (&norm2)[2], float (&delta)[2]) {
  const Dims& d = a.dims;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool valid = row[half] < d.T;
    const int64_t r = (b * d.Hq + h) * d.T + row[half];
    norm2[half] = valid ? rule.row_norm2(r) : INFINITY;
    delta[half] = valid ? a.delta[r] : 0.0f;
  }
}

// dQ. Grid (query tiles, Hq, B); tiles run heaviest first.
// dq_p = scale · Σ_j dS_pj k_j (plus the Self row term).
template <int kPadded, class Rule>
__global__ void __launch_bounds__(kThreads) dq_kernel(const BackwardIo a, const Rule rule) {
  static_assert(kPadded > kWgmmaBackwardWidth, "narrower heads take dq_wgmma_kernel");
  constexpr int S = kRowStride<kPadded>;
  constexpr int kDTiles = kPadded / 8;
  constexpr int kKeyTiles = kTile / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);  // [64, S] query tile; dq staging
  uint16_t* dys = qs + kTile * S;                         // [64, S] dy tile
  uint16_t* ks = dys + kTile * S;                         // 2 stages of [64, S]
  uint16_t* vs = ks + 2 * kTile * S;                      // 2 stages of [64, S]

  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4;
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
  float norm2[2], delta[2];
  query_row_terms(a, rule, row, h, b, norm2, delta);

  float dq[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  const int n_kt = static_cast<int>(p0 / kTile) + 1;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    next_key_stage<kPadded>(ks, vs, kb, vb, kt, n_kt, T, kv_stride, Dh, vec);
    const uint16_t* kst = ks + stage * kTile * S;
    const uint16_t* vst = vs + stage * kTile * S;

    float s[kKeyTiles][4], dp[kKeyTiles][4];
    two_products<kPadded>(s, qs, kst, dp, dys, vst, wrow);

    query_tile_grads(rule, s, dp, norm2, delta, kt == n_kt - 1, static_cast<int64_t>(kt) * kTile, row, T);

#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      uint32_t dsa[4];
      pack_a(dsa, dp, kk);
      mma_by_cols<kPadded>(dq, dsa, kst, kk * 16);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  finish_query_rows<kPadded, false>(a, rule, dq, qs, p0, row);
}

// dQ on wgmma (head widths up to kWgmmaBackwardWidth): dq_kernel's grid, loop and rule step,
// with S = Q K^T and dP = dO V^T from swizzled shared tiles (K-major) and dQ += dS K with dS from
// registers and K MN-major. Tiles by cp.async, or (kTma) by TMA as forward_kernel's.
template <int kPadded, class Rule, int kMinBlocks = 0, bool kTma = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    dq_wgmma_kernel(const BackwardIo a, const Rule rule, const __grid_constant__ HeadMaps maps) {
  constexpr int kDTiles = kPadded / 8;
  constexpr int kKeyTiles = kTile / 8;
  constexpr int kT = kSwizzledTile<kPadded>;
  using Panels = wgmma::Panels<kPadded>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* aligned = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  uint16_t* qs = reinterpret_cast<uint16_t*>(aligned);  // query tile; dq staging
  uint16_t* dys = qs + kT;                               // dy tile
  uint16_t* ks = dys + kT;                               // 2 stages
  uint16_t* vs = ks + 2 * kT;                            // 2 stages
  // kTma: the barriers of the two key / value stages and of the query and dy tiles.
  uint64_t* full = reinterpret_cast<uint64_t*>(vs + 2 * kT);
  uint64_t* q_full = full + 2;

  const Dims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int vec = load_piece(Dh);
  const int64_t T = d.T, ntiles = (T + kTile - 1) / kTile;
  const int64_t p0 = (ntiles - 1 - blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z, g = h / (d.Hq / d.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4;
  const int64_t q_stride = d.Hq * Dh, kv_stride = d.Hkv * Dh;
  const int64_t q_off = (b * T * d.Hq + h) * Dh;
  const uint16_t* kb = a.k + (b * T * d.Hkv + g) * Dh;
  const uint16_t* vb = a.v + (b * T * d.Hkv + g) * Dh;
  const int wrow = warp * kWarpRows;
  const int64_t row[2] = {p0 + wrow + grp, p0 + wrow + grp + 8};
  const TmaStages<kPadded> stages{ks, vs, full, &maps.k, &maps.v, b};

  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      stages.init(q_full);
      tma_tile_pair<kPadded>(q_full, qs, &maps.q, dys, &maps.dy, h, p0, b);
      stages.load(0, g, 0);
    }
    __syncthreads();  // the barriers are initialized before anyone waits on them
  } else {
    load_tile<kTile, kPadded, true>(qs, a.q + q_off, p0, T, q_stride, Dh, vec);
    load_tile<kTile, kPadded, true>(dys, a.dy + q_off, p0, T, q_stride, Dh, vec);
    cp_async_commit();
    load_tile<kTile, kPadded, true>(ks, kb, 0, T, kv_stride, Dh, vec);
    load_tile<kTile, kPadded, true>(vs, vb, 0, T, kv_stride, Dh, vec);
    cp_async_commit();
  }
  float norm2[2], delta[2];
  query_row_terms(a, rule, row, h, b, norm2, delta);

  float dq[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;
  auto& dq_flat = reinterpret_cast<float(&)[kPadded / 2]>(dq);

  const int n_kt = static_cast<int>(p0 / kTile) + 1;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if constexpr (kTma) {  // as in forward_kernel
      if (threadIdx.x == 0 && kt + 1 < n_kt) stages.load(kt + 1, g, static_cast<int64_t>(kt + 1) * kTile);
      if (kt == 0) tma::wait(q_full, 0);
      stages.wait(kt);
    } else {
      next_key_stage<kPadded, true>(ks, vs, kb, vb, kt, n_kt, T, kv_stride, Dh, vec);
    }
    const uint16_t* kst = ks + stage * kT;
    const uint16_t* vst = vs + stage * kT;

    float s[kKeyTiles][4], dp[kKeyTiles][4];
    two_products_wgmma<kPadded>(s, qs, kst, dp, dys, vst);

    query_tile_grads(rule, s, dp, norm2, delta, kt == n_kt - 1, static_cast<int64_t>(kt) * kTile, row, T);

    uint32_t dsa[kKeyTiles / 2][4];
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) pack_a(dsa[kk], dp, kk);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk)  // k = key rows 16 kk .. of K (MN-major)
      wgmma::mma<kPadded, 1>(dq_flat, dsa[kk], Panels::mn_major(kst, kk * 16), true);
    wgmma::commit();
    wgmma::wait<0>();
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  finish_query_rows<kPadded, true>(a, rule, dq, qs, p0, row);
}

// The one-pass dQ's rounding: dq = scale · (the fp32 sums + the Self row term), one warp per row
// of [B, T, Hq, Dh], as the dQ pass's epilogue computes it.
template <int kPadded, class Rule>
__global__ void __launch_bounds__(256) dq_finish_kernel(const BackwardIo a, const Rule rule) {
  const Dims& d = a.dims;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (row >= d.B * d.T * d.Hq) return;
  const int lane = threadIdx.x % 32;
  const int64_t h = row % d.Hq, p = (row / d.Hq) % d.T, b = row / (d.Hq * d.T);
  float coef = 0.0f;
  const uint16_t* k_row = nullptr;
  if constexpr (Rule::kSelf) {  // Hq = Hkv: query row p of head h is also key row p of head h
    coef = rule.query_self((b * d.Hq + h) * d.T + p);
    k_row = a.k + row * d.Dh;
  }
  const float* acc = a.dq_accum + ((b * d.Hq + h) * flash_dq_sum_rows(d.T) + p) * kPadded;
  for (int c = lane; c < d.Dh; c += 32) {
    float v = acc[dq_sum_col<kPadded>(static_cast<int>(p & 7), c)];
    if constexpr (Rule::kSelf) v = fmaf(coef, bf16_load(k_row[c]), v);
    a.dq[row * d.Dh + c] = bf16_round(rule.scale * v);
  }
}

// ---- Launch ---------------------------------------------------------------------------------
// Dynamic shared memory of the kernels, in bytes. The forward: five swizzled tiles, the TMA
// barriers and the slack to align them to 1024 bytes.
template <int kPadded>
constexpr size_t forward_smem() {
  return sizeof(uint16_t) * 5 * kSwizzledTile<kPadded> + 3 * sizeof(uint64_t) + 1024;
}
// Six swizzled tiles, the row terms, the TMA barriers and the alignment slack; the wgmma dQ
// pass: six swizzled tiles, the TMA barriers and the slack.
template <int kPadded>
constexpr size_t dkdv_wgmma_smem() {
  return sizeof(uint16_t) * 6 * kSwizzledTile<kPadded> + sizeof(float) * 4 * kTile + 3 * sizeof(uint64_t) + 1024;
}
template <int kPadded>
constexpr size_t dq_wgmma_smem() {
  return sizeof(uint16_t) * 6 * kSwizzledTile<kPadded> + 3 * sizeof(uint64_t) + 1024;
}
template <int kPadded>
constexpr size_t dkdv_smem() {
  return sizeof(uint16_t) * (2 * kTile + 4 * kDkdvQueryTile) * kRowStride<kPadded> + sizeof(float) * 4 * kDkdvQueryTile;
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

inline unsigned tiles_of(int64_t T) { return static_cast<unsigned>((T + kTile - 1) / kTile); }

// The TMA maps of q, dy (when not null), k and v for kPadded's panels (Dh a multiple of 8).
template <int kPadded>
HeadMaps head_maps(const Dims& d, const uint16_t* q, const uint16_t* dy, const uint16_t* k, const uint16_t* v) {
  constexpr int kCols = wgmma::Panels<kPadded>::kPanelCols;
  HeadMaps maps{};
  maps.q = tma_map_heads_bf16(q, d.B, d.T, d.Hq, d.Dh, kTile, kCols);
  if (dy != nullptr) maps.dy = tma_map_heads_bf16(dy, d.B, d.T, d.Hq, d.Dh, kTile, kCols);
  maps.k = tma_map_heads_bf16(k, d.B, d.T, d.Hkv, d.Dh, kTile, kCols);
  maps.v = tma_map_heads_bf16(v, d.B, d.T, d.Hkv, d.Dh, kTile, kCols);
  return maps;
}

// The forward on `stream`: grid (query tiles, Hq, B). Its tiles by TMA where Dh is a multiple of
// 8 (16-byte row strides), else by cp.async; so the two passes' dK/dV and dQ passes. H200,
// 2026-12-02, forward + backward at the Relation paper's scales, TMA against cp.async in one
// call: FlashRelation 1.541 → 1.267, 3.036 → 2.340 and 3.454 → 2.797 ms (10M, 30M, 100M), the
// forward at 30M 0.722 → 0.461 ms; attention 1.225 → 0.940, 2.422 → 1.663, 2.875 → 2.345 ms.
template <int kPadded, class Rule>
void launch_forward(const ForwardIo& io, const Rule& rule, cudaStream_t stream) {
  const Dims& d = io.dims;
  if (d.B == 0 || d.T == 0 || d.Hq == 0) return;
  const dim3 grid(tiles_of(d.T), static_cast<unsigned>(d.Hq), static_cast<unsigned>(d.B));
  constexpr size_t smem = forward_smem<kPadded>();
  const bool tma = d.Dh % 8 == 0;
  auto kernel = tma ? forward_kernel<kPadded, Rule, kForwardMinBlocks<kPadded>, true>
                    : forward_kernel<kPadded, Rule, kForwardMinBlocks<kPadded>, false>;
  allow_smem(kernel, smem);
  kernel<<<grid, kThreads, smem, stream>>>(io, rule,
                                           tma ? head_maps<kPadded>(d, io.q, nullptr, io.k, io.v) : HeadMaps{});
  QV_CUDA_CHECK(cudaGetLastError());
}

// The two passes' dK/dV is warp-specialized from this padded width on, where TMA can load the
// heads (Dh a multiple of 8). H200, 2026-12-01, backward at the Relation paper's scales: at
// width 80 it is faster than the one-warpgroup pass (FlashRelation 2.735 → 2.493 ms at (8,
// 4096, 8, 80), attention 2.305 → 2.085), at 48 and 64 slower (FlashRelation 1.212 → 1.303 and
// 2.308 → 2.332 ms), where the one-warpgroup pass keeps 3 blocks of 64 keys on an SM against
// the warp-specialized pass's one block of 128.
inline constexpr int kWsTwoPassWidth = 80;

// The backward's tile passes on `stream`: dK/dV, then dQ (grid (query tiles, Hq, B)); on wgmma
// up to kWgmmaBackwardWidth, on mma.sync above. io.delta holds D before they run (computed by
// the caller's row pass). dK/dV by dkdv_ws_kernel (blocks of 128 keys) where
// flash_dq_one_pass(Dh) holds from kWsTwoPassWidth on, else by one warpgroup per 64-key tile
// (grid (key tiles, Hkv, B)). With io.dq_accum where flash_dq_one_pass(Dh) holds, one pass: the
// warp-specialized dK/dV with the dQ shares, then their rounding.
template <int kPadded, class Rule>
void launch_backward(const BackwardIo& io, const Rule& rule, cudaStream_t stream) {
  const Dims& d = io.dims;
  if (d.B == 0 || d.T == 0 || d.Hq == 0) return;
  const dim3 key_grid(tiles_of(d.T), static_cast<unsigned>(d.Hkv), static_cast<unsigned>(d.B));
  const dim3 query_grid(tiles_of(d.T), static_cast<unsigned>(d.Hq), static_cast<unsigned>(d.B));
  if constexpr (kPadded <= kWgmmaBackwardWidth) {
    // The TMA maps, built once for whichever kernels load by TMA (Dh a multiple of 8).
    const bool tma = d.Dh % 8 == 0;  // the one-warpgroup passes' loads
    const bool one_pass = io.dq_accum != nullptr && flash_dq_one_pass(d.Dh);
    const bool ws = one_pass || (kPadded >= kWsTwoPassWidth && flash_dq_one_pass(d.Dh));
    const HeadMaps maps = tma || ws ? head_maps<kPadded>(d, io.q, io.dy, io.k, io.v) : HeadMaps{};
    auto dkdv_ws = [&](auto kind) {
      constexpr bool kOnePass = decltype(kind)::value;
      auto dkdv = dkdv_ws_kernel<kPadded, Rule, kOnePass>;
      constexpr size_t bytes = WsLayout<kPadded, kOnePass>::kSmem;
      allow_smem(dkdv, bytes);
      const dim3 grid(static_cast<unsigned>((d.T + kWsKeys - 1) / kWsKeys), static_cast<unsigned>(d.Hkv),
                      static_cast<unsigned>(d.B));
      dkdv<<<grid, kWsThreads, bytes, stream>>>(io, rule, maps);
      QV_CUDA_CHECK(cudaGetLastError());
    };
    if (one_pass) {  // dK/dV adds dQ's shares
      const int64_t rows = d.B * d.T * d.Hq;
      QV_CUDA_CHECK(cudaMemsetAsync(io.dq_accum, 0, sizeof(float) * flash_dq_sum_floats(d), stream));
      dkdv_ws(std::true_type{});
      dq_finish_kernel<kPadded, Rule><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(io, rule);
      QV_CUDA_CHECK(cudaGetLastError());
      return;
    }
    if (ws) {
      dkdv_ws(std::false_type{});
    } else {
      auto dkdv = tma ? dkdv_wgmma_kernel<kPadded, Rule, kDkdvMinBlocks<kPadded>, true>
                      : dkdv_wgmma_kernel<kPadded, Rule, kDkdvMinBlocks<kPadded>, false>;
      constexpr size_t bytes = dkdv_wgmma_smem<kPadded>();
      allow_smem(dkdv, bytes);
      dkdv<<<key_grid, kThreads, bytes, stream>>>(io, rule, maps);
      QV_CUDA_CHECK(cudaGetLastError());
    }
    auto dq = tma ? dq_wgmma_kernel<kPadded, Rule, kDqMinBlocks<kPadded>, true>
                  : dq_wgmma_kernel<kPadded, Rule, kDqMinBlocks<kPadded>, false>;
    constexpr size_t dq_bytes = dq_wgmma_smem<kPadded>();
    allow_smem(dq, dq_bytes);
    dq<<<query_grid, kThreads, dq_bytes, stream>>>(io, rule, maps);
    QV_CUDA_CHECK(cudaGetLastError());
  } else {
    auto dkdv = dkdv_kernel<kPadded, Rule>;
    auto dq = dq_kernel<kPadded, Rule>;
    allow_smem(dkdv, dkdv_smem<kPadded>());
    allow_smem(dq, dq_smem<kPadded>());
    dkdv<<<key_grid, kThreads, dkdv_smem<kPadded>(), stream>>>(io, rule);
    QV_CUDA_CHECK(cudaGetLastError());
    dq<<<query_grid, kThreads, dq_smem<kPadded>(), stream>>>(io, rule);
    QV_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace quiver::cuda::detail::flash
