// Fused algebraic-projection kernels (algproj_fused_launch.h): the row pass (forward and dX)
// and the weight pass (dW) over the tile plans of ops/algproj_tiles.h.
//
// Row pass, persistent blocks over the tiles: the tile's rows are gathered through the plan's row list (a
// type's rows may be strided, contiguous or arbitrary: the copy addresses each row anyway),
// and the reduction walks the tile's segments in chunks of kChunk columns, so both endpoint
// products of a Q_q row (x_α W_αδ and x_δ W_δδ) are accumulated in registers before the one
// bf16 rounding of the output. The weight chunk is [kChunk, cols] of W (forward, stored
// k-major: B fragments by ldmatrix.trans) or [cols, kChunk] of W's rows (dX, where the
// reduction runs along W's columns: B fragments by plain ldmatrix).
//
// Weight pass, one block per dW tile: A = xᵀ (x rows stored m-major, A fragments by
// ldmatrix.trans), B = dy rows; the reduction walks the tile's row list in chunks of kChunk
// rows.
//
// Warps split the block's output tile in a WM × WN grid; each warp owns a (16·MI) × (8·NI)
// piece and issues MI·NI mma.sync m16n8k16 per 16 reduction steps. Shared-memory rows are
// padded by 8 elements so the 8 rows of one ldmatrix fall in distinct banks.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/algproj_fused_launch.h"
#include "cuda/block_launch.cuh"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/mma_ptx.cuh"
#include "cuda/pdl.cuh"
#include "cuda/tma.cuh"

namespace quiver::cuda::detail {
namespace {


// A configuration's constants: the warp grid of a block and the mma tiles of one warp.
template <int BM_, int BN_, int WM_, int WN_, int kChunk_, int kStages_>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;
  static constexpr int kChunk = kChunk_, kStages = kStages_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int MI = BM / WM / 16, NI = BN / WN / 8;
  static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0 && BM % (16 * WM) == 0 && BN % (8 * WN) == 0,
                "warp tile must be whole m16 × (pairs of n8) tiles");
  static_assert(kChunk % 16 == 0 && kStages >= 2, "chunks of whole k16 steps, two stages at least");
};
template <const AlgKernelConfig* T, int I>
using CfgOf = Cfg<T[I].rows, T[I].cols, T[I].warps_m, T[I].warps_n, T[I].chunk, T[I].stages>;
template <int I>
using RowCfg = CfgOf<kAlgRowConfigs, I>;
template <int I>
using WeightCfg = CfgOf<kAlgWeightConfigs, I>;

// One kChunk-deep step of the warp's MI × NI tiles: A fragments from a [rows][kChunk + 8]
// tile (row-major, k contiguous) or, kATrans, from a [kChunk][rows + 8] tile (m-major); B
// fragments from a [kChunk][cols + 8] tile (kBTrans = false: k-major) or [cols][kChunk + 8].
template <int kChunk, int MI, int NI, bool kATrans, bool kBTrans, int A_LD, int B_LD>
__device__ __forceinline__ void mma_chunk(float (&acc)[MI][NI][4], const uint16_t* sA, const uint16_t* sB,
                                          int warp_row0, int warp_col0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kChunk; kk += 16) {
    uint32_t a[MI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const int r0 = warp_row0 + mi * 16;
      if constexpr (!kATrans)
        ldmatrix_x4(a[mi], sA + (r0 + (lane & 15)) * A_LD + kk + (lane >> 4) * 8);
      else
        ldmatrix_x4_trans(a[mi], sA + (kk + (lane & 7) + (lane >> 4) * 8) * A_LD + r0 + ((lane >> 3) & 1) * 8);
    }
#pragma unroll
    for (int ni = 0; ni < NI; ni += 2) {
      const int c0 = warp_col0 + ni * 8;
      uint32_t b[4];
      if constexpr (!kBTrans)
        ldmatrix_x4_trans(b, sB + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * B_LD + c0 + (lane >> 4) * 8);
      else
        ldmatrix_x4(b, sB + (c0 + (lane & 7) + (lane >> 4) * 8) * B_LD + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        mma_bf16(acc[mi][ni], a[mi], b[0], b[1]);
        mma_bf16(acc[mi][ni + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// A piece of a split reduction (row or weight pass): the warp's fp32 accumulators, rows below
// `rows` and columns below `cols` of the tile, into its slot (row-major, BN columns), for the
// reduce kernel to add in order.
template <int BN, int MI, int NI>
__device__ __forceinline__ void store_slot(const float (&acc)[MI][NI][4], float* slot, int warp_row0, int warp_col0,
                                           int grp, int tig, int rows, int cols) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_row0 + mi * 16 + grp + h * 8;
      if (r >= rows) continue;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = warp_col0 + ni * 8 + 2 * tig;
        if (col < cols)
          *reinterpret_cast<float2*>(slot + r * BN + col) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }
    }
}

// ---- Row pass -------------------------------------------------------------------------------
// Persistent: a block takes tiles blockIdx.x, blockIdx.x + gridDim.x, ... and its pipeline runs
// across them, so the next tile's first chunks load while a tile finishes and writes out (the
// tiles are short: a Q_q forward tile reduces over 2·K/q columns). The loader and the compute
// side each fetch the record of their next tile one tile ahead, so starting a tile waits on
// the loads that record points to (rows, segments), not on the record too.
// At most 128 registers a thread (as many blocks as 128 registers leave room for): unbounded,
// the prefetched records took most configurations from 128 to 164-168 registers, which left a
// 256-thread block alone on its multiprocessor; bounded, ptxas spills a few dozen to a few
// hundred bytes in some, and calibration timed them as before or faster (docs/decisions.md).
// Packed configurations (AlgKernelConfig::packed) walk a packed plan's pieces: a chunk is the
// run of pieces from one whose kpos is 0 to the next such; each position of the chunk reads the
// reduction index of the piece laid there (zeros where none is), and a weight row only the
// columns its piece applies to.
template <int I, bool kBTrans, int VEC>
__global__ void __launch_bounds__(RowCfg<I>::kThreads, std::max(1, 65536 / (RowCfg<I>::kThreads * 128)))
    algproj_rows_kernel(const __grid_constant__ AlgRowArgs p) {
  using G = RowCfg<I>;
  constexpr bool kPacked = kAlgRowConfigs[I].packed, kStaged = kAlgRowConfigs[I].staged;
  static_assert(!(kPacked && kBTrans), "packed plans are forward plans");
  constexpr int kThreads = G::kThreads, MI = G::MI, NI = G::NI, BM = G::BM, BN = G::BN, WM = G::WM, WN = G::WN;
  constexpr int kChunk = G::kChunk, kStages = G::kStages;
  constexpr int A_LD = kChunk + 8;
  constexpr int B_ROWS = kBTrans ? BN : kChunk, B_LD = kBTrans ? kChunk + 8 : BN + 8;
  constexpr int kAStage = BM * A_LD, kBStage = B_ROWS * B_LD;
  constexpr int kAVecs = BM * (kChunk / VEC);                   // copies of one A chunk
  constexpr int kAPerThread = (kAVecs + kThreads - 1) / kThreads;  // fixed (row, col) slots per thread
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* sA = smem;
  uint16_t* sB = smem + kStages * kAStage;
  // Per stage: whether its chunk is the last of its tile. The loader writes it with the chunk and
  // the compute side reads it after the barrier that makes the chunk visible, so neither side
  // counts a tile's chunks from its segment records.
  __shared__ int s_last[kStages];
  __shared__ int32_t s_rows[kStaged ? BM : 1];  // staged epilogue: the tile's output rows
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // ---- loader: walks (tile, segment, offset) one chunk at a time ----
  int lt = blockIdx.x;  // tile being loaded
  ops::AlgRowTile ltile{};
  int lnext_i = blockIdx.x;  // the tile whose record lnext holds
  ops::AlgRowTile lnext = lnext_i < p.num_tiles ? p.tiles[lnext_i] : ops::AlgRowTile{};
  ops::AlgSegment lseg{0, 0};
  int lseg_i = 0, loff = 0;
  int32_t a_row[kAPerThread];  // this thread's A rows in the loaded tile (-1: none)
  auto begin_tile = [&] {
    for (; lt < p.num_tiles; lt += gridDim.x) {
      ltile = lt == lnext_i ? lnext : p.tiles[lt];
      if (ltile.seg_count > 0) break;  // tiles without segments only write zeros
    }
    if (lt >= p.num_tiles) return;
    lnext_i = lt + gridDim.x;
    if (lnext_i < p.num_tiles) lnext = p.tiles[lnext_i];
    lseg_i = 0;
    loff = 0;
    lseg = p.segments[ltile.seg_begin];
#pragma unroll
    for (int j = 0; j < kAPerThread; ++j) {
      const int i = tid + j * kThreads, r = i / (kChunk / VEC);
      a_row[j] = i < kAVecs && r < ltile.row_count ? p.rows[ltile.row_begin + r] : -1;
    }
  };
  auto load_packed = [&](int stage) {
    struct Piece {
      int k0, len, pos, c0, c1;
    };
    // The records of the next kAlgPackMaxPieces segments are read at once (whether a segment
    // belongs to the chunk depends on its record, so reading them in turn would wait on each).
    ops::AlgSegmentPlace pl[ops::kAlgPackMaxPieces];
    ops::AlgSegment sg[ops::kAlgPackMaxPieces];
#pragma unroll
    for (int i = 0; i < ops::kAlgPackMaxPieces; ++i) {
      const bool have = lseg_i + i < ltile.seg_count;
      pl[i] = have ? p.places[ltile.seg_begin + lseg_i + i] : ops::AlgSegmentPlace{0, 0, 0, 0};
      sg[i] = have ? p.segments[ltile.seg_begin + lseg_i + i] : ops::AlgSegment{0, 0};
    }
    Piece pc[ops::kAlgPackMaxPieces];  // the chunk's pieces, by constant index (registers)
    int taken = 0;
#pragma unroll
    for (int i = 0; i < ops::kAlgPackMaxPieces; ++i) {
      pc[i] = Piece{0, 0, kChunk, 0, 0};
      if (taken == i && lseg_i + i < ltile.seg_count && (i == 0 || pl[i].kpos != 0)) {
        pc[i] = Piece{sg[i].k0, sg[i].len, pl[i].kpos, pl[i].c0, pl[i].c1};
        taken = i + 1;
      }
    }
    // Chunk position v -> its reduction index (-1: none) and the tile columns it applies to.
    auto find = [&](int v, int& k, int& c0, int& c1) {
      k = -1, c0 = 0, c1 = 0;
#pragma unroll
      for (int i = 0; i < ops::kAlgPackMaxPieces; ++i)
        if (v >= pc[i].pos && v < pc[i].pos + pc[i].len) k = pc[i].k0 + v - pc[i].pos, c0 = pc[i].c0, c1 = pc[i].c1;
    };
    // A: a thread's copies share one chunk column (the block's threads are a multiple of the
    // vectors in a row), so one lookup serves them all.
    static_assert(kThreads % (kChunk / VEC) == 0, "a packed A copy keeps its column");
    uint16_t* a_dst = sA + stage * kAStage;
    const int ac = (tid % (kChunk / VEC)) * VEC;
    int ak, c0, c1;
    find(ac, ak, c0, c1);
#pragma unroll
    for (int j = 0; j < kAPerThread; ++j) {
      const int i = tid + j * kThreads;
      if (i >= kAVecs) break;
      const bool ok = a_row[j] >= 0 && ak >= 0;
      cp_async<2 * VEC>(a_dst + (i / (kChunk / VEC)) * A_LD + ac,
                        ok ? p.a + static_cast<int64_t>(a_row[j]) * p.lda + ak : p.a, ok);
    }
    // B: a warp takes whole weight rows (one lookup a row), its lanes the columns.
    constexpr int kWarps = kThreads / 32;
    static_assert(kChunk % kWarps == 0, "a packed chunk's rows split evenly over the warps");
    uint16_t* b_dst = sB + stage * kBStage;
#pragma unroll
    for (int kr = warp; kr < kChunk; kr += kWarps) {
      int k;
      find(kr, k, c0, c1);
      const uint16_t* src = p.w + static_cast<int64_t>(k < 0 ? 0 : k) * p.ldw + ltile.col0;
#pragma unroll
      for (int c = lane * VEC; c < BN; c += 32 * VEC) {
        const bool ok = k >= 0 && c >= c0 && c < c1 && c < ltile.ncols;
        cp_async<2 * VEC>(b_dst + kr * B_LD + c, ok ? src + c : p.w, ok);
      }
    }
    lseg_i += taken;
    if (lseg_i >= ltile.seg_count) {
      if (tid == 0) s_last[stage] = 1;
      lt += gridDim.x;
      begin_tile();
    } else if (tid == 0) {
      s_last[stage] = 0;
    }
  };
  auto load = [&](int stage) {
    if (lt >= p.num_tiles) return;
    if constexpr (kPacked) {
      load_packed(stage);
      return;
    }
    const int k0 = lseg.k0 + loff, klen = min(kChunk, lseg.len - loff);
    uint16_t* a_dst = sA + stage * kAStage;
#pragma unroll
    for (int j = 0; j < kAPerThread; ++j) {
      const int i = tid + j * kThreads;
      if (i >= kAVecs) break;
      const int r = i / (kChunk / VEC), c = (i % (kChunk / VEC)) * VEC;
      const bool ok = a_row[j] >= 0 && c < klen;
      cp_async<2 * VEC>(a_dst + r * A_LD + c, ok ? p.a + static_cast<int64_t>(a_row[j]) * p.lda + k0 + c : p.a, ok);
    }
    uint16_t* b_dst = sB + stage * kBStage;
    if constexpr (!kBTrans) {
      for (int i = tid; i < kChunk * (BN / VEC); i += kThreads) {
        const int kr = i / (BN / VEC), c = (i % (BN / VEC)) * VEC;
        const bool ok = kr < klen && c < ltile.ncols;
        cp_async<2 * VEC>(b_dst + kr * B_LD + c,
                          ok ? p.w + static_cast<int64_t>(k0 + kr) * p.ldw + ltile.col0 + c : p.w, ok);
      }
    } else {
      for (int i = tid; i < BN * (kChunk / VEC); i += kThreads) {
        const int j = i / (kChunk / VEC), c = (i % (kChunk / VEC)) * VEC;
        const bool ok = j < ltile.ncols && c < klen;
        cp_async<2 * VEC>(b_dst + j * B_LD + c,
                          ok ? p.w + static_cast<int64_t>(ltile.col0 + j) * p.ldw + k0 + c : p.w, ok);
      }
    }
    loff += kChunk;
    const bool last = loff >= lseg.len && lseg_i + 1 >= ltile.seg_count;
    if (tid == 0) s_last[stage] = last;
    if (loff >= lseg.len) {
      if (!last) {
        lseg = p.segments[ltile.seg_begin + ++lseg_i];
        loff = 0;
      } else {
        lt += gridDim.x;
        begin_tile();
      }
    }
  };

  // ---- compute: the same tile sequence, one chunk per loop step ----
  const int warp_row0 = (warp / WN) * (BM / WM), warp_col0 = (warp % WN) * (BN / WN);
  const int grp = lane >> 2, tig = lane & 3;
  begin_tile();
  pdl_trigger();  // a programmatic dependent (block_launch.cuh): the plan before, x, W and c after
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    load(s);
    cp_async_commit();
  }
  int step = 0;  // chunks consumed by this block
  ops::AlgRowTile tnext = blockIdx.x < p.num_tiles ? p.tiles[blockIdx.x] : ops::AlgRowTile{};
  for (int ct = blockIdx.x; ct < p.num_tiles; ct += gridDim.x) {
    const ops::AlgRowTile t = tnext;
    if (ct + gridDim.x < p.num_tiles) tnext = p.tiles[ct + gridDim.x];
    int32_t out_row[MI][2];  // output rows of this thread's accumulators (-1: none)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_row0 + mi * 16 + grp + h * 8;
        out_row[mi][h] = r < t.row_count ? p.rows[t.row_begin + r] : -1;
      }
    float acc[MI][NI][4] = {};
    // The tile's chunks, up to the one its loader marked last (tiles without segments have none).
    for (bool last = t.seg_count == 0; !last; ++step) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      last = s_last[step % kStages];
      load((step + kStages - 1) % kStages);
      cp_async_commit();
      const int stage = step % kStages;
      mma_chunk<kChunk, MI, NI, false, kBTrans, A_LD, B_LD>(acc, sA + stage * kAStage, sB + stage * kBStage,
                                                            warp_row0, warp_col0, lane);
    }
    if (t.slot >= 0) {  // a piece of a split reduction: fp32 partial sums into its slot
      store_slot<BN>(acc, p.partials + static_cast<int64_t>(t.slot) * (BM * BN), warp_row0, warp_col0, grp, tig,
                     t.row_count, t.ncols);
      continue;
    }
    if constexpr (kStaged) {
      if (!p.accumulate) {
        // The tile's products in bf16 after the ring (on a 128-byte boundary): [BM][BN + 8] (rows
        // 528 bytes apart for BN = 256: a quad's 8 rows fall in distinct banks), then along its
        // rows; or, leaving by a TMA store (p.y_rows > 0), the box's rows of t.ncols (400 bytes
        // apart for Qwen3-32B's 200 columns: again 8 distinct banks).
        uint16_t* sC = reinterpret_cast<uint16_t*>(
            (reinterpret_cast<uintptr_t>(smem + kStages * (kAStage + kBStage)) + 127) & ~uintptr_t{127});
        const bool by_tma = p.y_rows > 0;
        const int c_ld = by_tma ? t.ncols : BN + 8;
        if (by_tma && tid == 0) bulk_wait_read();  // the previous tile's store has read sC
        __syncthreads();  // the previous tile's copy has read sC (a tile without chunks has no barrier)
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
              const int r = warp_row0 + mi * 16 + grp + h * 8, col = warp_col0 + ni * 8 + 2 * tig;
              if (!by_tma || col < t.ncols)
                *reinterpret_cast<__nv_bfloat162*>(sC + r * c_ld + col) =
                    __floats2bfloat162_rn(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        if (by_tma) {  // rows past y_rows were laid out past the box: not stored
          fence_proxy_async_shared();
          __syncthreads();
          if (tid == 0) {
            const int r0 = out_row[0][0];  // the tile's first row
            tma::store_3d(&p.y, sC, t.col0, r0 % p.y_stride, r0 / p.y_stride);
            tma::bulk_commit();
          }
          continue;
        }
        constexpr int C_LD = BN + 8;
        // The output rows of the tile's rows, from the threads that hold them.
        if (warp_col0 == 0 && tig == 0)
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) s_rows[warp_row0 + mi * 16 + grp + h * 8] = out_row[mi][h];
        __syncthreads();
        const int align = static_cast<int>(p.ldc | t.col0 | t.ncols) | static_cast<int>(reinterpret_cast<uintptr_t>(p.c) / 2);
        auto copy_out = [&](auto width) {  // a warp a row, its lanes along it
          constexpr int OV = decltype(width)::value;  // elements a thread moves at once
          using V = std::conditional_t<OV == 8, uint4, std::conditional_t<OV == 4, uint2, uint32_t>>;
          for (int r = warp; r < t.row_count; r += kThreads / 32) {
            uint16_t* dst = p.c + static_cast<int64_t>(s_rows[r]) * p.ldc + t.col0;
            for (int c = lane * OV; c < t.ncols; c += 32 * OV)
              *reinterpret_cast<V*>(dst + c) = *reinterpret_cast<const V*>(sC + r * C_LD + c);
          }
        };
        if (align % 8 == 0)
          copy_out(std::integral_constant<int, 8>{});
        else if (align % 4 == 0)
          copy_out(std::integral_constant<int, 4>{});
        else
          copy_out(std::integral_constant<int, 2>{});
        continue;
      }
    }
    // Whole 32-byte sectors: the quad's threads swap halves of two neighbouring n8 tiles, so
    // each writes 4 consecutive columns and one store instruction covers 16 columns of a row.
    const bool wide = ((p.ldc | t.col0 | t.ncols) & 3) == 0 && (reinterpret_cast<uintptr_t>(p.c) & 7) == 0;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t orow = out_row[mi][h];
        uint16_t* out = p.c + static_cast<int64_t>(orow < 0 ? 0 : orow) * p.ldc + t.col0;
        if (wide) {
#pragma unroll
          for (int ni = 0; ni < NI; ni += 2) {
            const bool odd = tig & 1;
            const float s0 = odd ? acc[mi][ni][2 * h] : acc[mi][ni + 1][2 * h];
            const float s1 = odd ? acc[mi][ni][2 * h + 1] : acc[mi][ni + 1][2 * h + 1];
            const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
            float v[4];
            if (!odd) {
              v[0] = acc[mi][ni][2 * h], v[1] = acc[mi][ni][2 * h + 1], v[2] = r0, v[3] = r1;
            } else {
              v[0] = r0, v[1] = r1, v[2] = acc[mi][ni + 1][2 * h], v[3] = acc[mi][ni + 1][2 * h + 1];
            }
            const int col = warp_col0 + (ni + (odd ? 1 : 0)) * 8 + 2 * (tig & 2);
            if (orow < 0 || col >= t.ncols) continue;
            auto* dst = reinterpret_cast<uint2*>(out + col);
            if (p.accumulate) {
              const uint2 old = *dst;
              const float2 o0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&old.x));
              const float2 o1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&old.y));
              v[0] += o0.x, v[1] += o0.y, v[2] += o1.x, v[3] += o1.y;
            }
            const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
            *dst = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
          }
          continue;
        }
        if (orow < 0) continue;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int col = warp_col0 + ni * 8 + 2 * tig;
          if (col >= t.ncols) continue;
          float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
          auto* dst = reinterpret_cast<__nv_bfloat162*>(out + col);
          if (p.accumulate) {
            const float2 old = __bfloat1622float2(*dst);
            v0 += old.x;
            v1 += old.y;
          }
          *dst = __floats2bfloat162_rn(v0, v1);
        }
      }
  }
  cp_async_wait<0>();
  if (kStaged && tid == 0 && p.y_rows > 0) bulk_wait();  // the tiles' stores have left shared memory
}

// ---- Weight pass ----------------------------------------------------------------------------
template <int I, int VEC>
__global__ void __launch_bounds__(WeightCfg<I>::kThreads)
    algproj_weights_kernel(const AlgWeightArgs p) {
  using G = WeightCfg<I>;
  constexpr int kThreads = G::kThreads, MI = G::MI, NI = G::NI, BM = G::BM, BN = G::BN, WN = G::WN, WM = G::WM;
  constexpr int kChunk = G::kChunk, kStages = G::kStages;
  constexpr int A_LD = BM + 8, B_LD = BN + 8;
  constexpr int kAStage = kChunk * A_LD, kBStage = kChunk * B_LD;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* sA = smem;
  uint16_t* sB = smem + kStages * kAStage;

  const ops::AlgWeightTile t = p.tiles[blockIdx.x];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int chunks = (t.list_count + kChunk - 1) / kChunk;
  const int32_t* list = p.rows + t.list_begin;
  auto load = [&](int chunk, int stage) {
    const int m0 = chunk * kChunk;
    uint16_t* a_dst = sA + stage * kAStage;
    for (int i = tid; i < kChunk * (BM / VEC); i += kThreads) {
      const int rr = i / (BM / VEC), c = (i % (BM / VEC)) * VEC;
      const bool ok = m0 + rr < t.list_count && c < t.nk;
      cp_async<2 * VEC>(a_dst + rr * A_LD + c, ok ? p.x + static_cast<int64_t>(list[m0 + rr]) * p.ldx + t.k0 + c : p.x,
                        ok);
    }
    uint16_t* b_dst = sB + stage * kBStage;
    for (int i = tid; i < kChunk * (BN / VEC); i += kThreads) {
      const int rr = i / (BN / VEC), c = (i % (BN / VEC)) * VEC;
      const bool ok = m0 + rr < t.list_count && c < t.ncols;
      cp_async<2 * VEC>(b_dst + rr * B_LD + c,
                        ok ? p.dy + static_cast<int64_t>(list[m0 + rr]) * p.ldy + t.col0 + c : p.dy, ok);
    }
  };

  float acc[MI][NI][4] = {};
  const int warp_row0 = (warp / WN) * (BM / WM), warp_col0 = (warp % WN) * (BN / WN);
  pdl_trigger();  // a programmatic dependent (block_launch.cuh): x, dY and dW only after the wait
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) load(s, s);
    cp_async_commit();
  }
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (c + kStages - 1 < chunks) load(c + kStages - 1, (c + kStages - 1) % kStages);
    cp_async_commit();
    const int stage = c % kStages;
    mma_chunk<kChunk, MI, NI, true, false, A_LD, B_LD>(acc, sA + stage * kAStage, sB + stage * kBStage, warp_row0,
                                               warp_col0, lane);
  }

  const int grp = lane >> 2, tig = lane & 3;
  if (t.slot >= 0) {  // a piece of a split row list: fp32 partial sums into its slot
    store_slot<BN>(acc, p.partials + static_cast<int64_t>(t.slot) * (BM * BN), warp_row0, warp_col0, grp, tig, t.nk,
                   t.ncols);
    return;
  }
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = warp_row0 + mi * 16 + grp + h * 8;
      if (i >= t.nk) continue;
      float* out = p.dw + static_cast<int64_t>(t.k0 + i) * p.lddw + t.col0;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = warp_col0 + ni * 8 + 2 * tig;
        if (col >= t.ncols) continue;
        float2 v = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        auto* dst = reinterpret_cast<float2*>(out + col);
        if (p.accumulate) {
          const float2 old = *dst;
          v.x += old.x;
          v.y += old.y;
        }
        *dst = v;
      }
    }
}

// ---- Split reductions ---------------------------------------------------------------------
// One block per split output block: the slots are added in order (deterministic), once
// rounded to bf16 (+ the old value when accumulating).
__global__ void __launch_bounds__(256) algproj_reduce_kernel(const AlgReduceArgs p) {
  const ops::AlgSplit sp = p.splits[blockIdx.x];
  const int64_t slot_elems = static_cast<int64_t>(p.slot_rows) * p.slot_cols;
  const float* base = p.partials + sp.slot0 * slot_elems;
  for (int i = threadIdx.x; i < sp.row_count * sp.ncols; i += blockDim.x) {
    const int r = i / sp.ncols, c = i % sp.ncols;
    float v = 0;
    for (int k = 0; k < sp.parts; ++k) v += base[k * slot_elems + r * p.slot_cols + c];
    uint16_t* dst = p.c + static_cast<int64_t>(p.rows[sp.row_begin + r]) * p.ldc + sp.col0 + c;
    if (p.accumulate) v += __bfloat162float(__ushort_as_bfloat16(*dst));
    *dst = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// dW's second pass: one block per split block adds its slots in order (+ dW when accumulating).
__global__ void __launch_bounds__(256) algproj_reduce_weights_kernel(const AlgWeightReduceArgs p) {
  const ops::AlgWeightSplit sp = p.splits[blockIdx.x];
  const int64_t slot_elems = static_cast<int64_t>(p.slot_rows) * p.slot_cols;
  const float* base = p.partials + sp.slot0 * slot_elems;
  for (int e = threadIdx.x; e < sp.nk * sp.ncols; e += blockDim.x) {
    const int i = e / sp.ncols, j = e % sp.ncols;
    float v = 0;
    for (int k = 0; k < sp.parts; ++k) v += base[k * slot_elems + i * p.slot_cols + j];
    float* dst = p.dw + static_cast<int64_t>(sp.k0 + i) * p.lddw + sp.col0 + j;
    *dst = p.accumulate ? *dst + v : v;
  }
}

// ---- Few-row forward (decode) -----------------------------------------------------------------
// p.slices blocks of 256 threads per tile, one thread-block cluster: each block takes an equal
// share of the tile's weight rows (its segments laid end to end), each thread 8 output columns
// of the tile (one 16-byte weight vector per weight row) and a stripe of the block's rows, and
// accumulates all R rows of the tile in fp32; warps then reduce by shuffles and the block
// through shared memory, and the cluster's blocks add each other's sums over distributed
// shared memory, all in a fixed order. A weight row is read once per tile, by kLanes threads
// in one 128- or 64-byte run. So a decode step with few column tiles still has blocks on most
// multiprocessors, with no second launch; a plan's split reductions write fp32 slots.
// Launched as a programmatic dependent (pdl.cuh): the plan's metadata, constant since the plan
// was uploaded, is read while the kernel before it finishes; x and the outputs only after.
// blockIdx.y = 1 runs the tile against the second weight bank into the second output (p.w2, p.c2).
// kSwiGlu: each block accumulates the tile against both banks (gate p.w, up p.w2) and writes
// SwiGLU of the two products, each rounded to bf16 first as a separate SwiGLU would read them.
constexpr int kGemvThreads = 256;

template <int R, int COLS, bool kSwiGlu>
__global__ void __launch_bounds__(kGemvThreads) algproj_gemv_kernel(const AlgRowArgs p) {
  constexpr int kLanes = COLS / 8;                    // threads per weight row
  constexpr int kRowsPerPass = kGemvThreads / kLanes;  // weight rows per pass of the block
  constexpr int kWarps = kGemvThreads / 32;
  constexpr int kBanks = kSwiGlu ? 2 : 1;              // weight banks a block reads
  __shared__ float partial[kBanks][kWarps][R][COLS];
  const int slices = p.slices, slice = static_cast<int>(blockIdx.x) % slices;
  const ops::AlgRowTile t = p.tiles[blockIdx.x / slices];
  const uint16_t* const bank0 = kSwiGlu || blockIdx.y == 0 ? p.w : p.w2;  // the block's (first) bank
  uint16_t* out = blockIdx.y == 0 ? p.c : p.c2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c = (tid % kLanes) * 8, krow = tid / kLanes;
  const bool col_ok = c < t.ncols;
  int64_t row_off[R];
#pragma unroll
  for (int r = 0; r < R; ++r) row_off[r] = r < t.row_count ? static_cast<int64_t>(p.rows[t.row_begin + r]) * p.lda : -1;
  // The block's share [lo, hi) of the tile's weight rows, its segments laid end to end.
  int lo = 0, hi = INT32_MAX;
  if (slices > 1) {
    int total = 0;
    for (int s = 0; s < t.seg_count; ++s) total += p.segments[t.seg_begin + s].len;
    lo = static_cast<int>(static_cast<int64_t>(total) * slice / slices);
    hi = static_cast<int>(static_cast<int64_t>(total) * (slice + 1) / slices);
  }
  pdl_trigger();
  pdl_wait();
  float acc[kBanks][R][8] = {};
  for (int s = 0, base = 0; s < t.seg_count; ++s) {
    const ops::AlgSegment seg = p.segments[t.seg_begin + s];
    const int first = max(lo - base, 0), last = min(hi - base, seg.len);
    base += seg.len;
#pragma unroll 4
    for (int k = first + krow; k < last; k += kRowsPerPass) {
      const int kk = seg.k0 + k;
      float wf[kBanks][8];
#pragma unroll
      for (int bk = 0; bk < kBanks; ++bk) {
        uint4 wv = make_uint4(0, 0, 0, 0);
        if (col_ok)
          wv = __ldg(reinterpret_cast<const uint4*>((bk == 0 ? bank0 : p.w2) + static_cast<int64_t>(kk) * p.ldw +
                                                    t.col0 + c));
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(pairs[j]);
          wf[bk][2 * j] = f.x;
          wf[bk][2 * j + 1] = f.y;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (row_off[r] < 0) continue;
        const float xv = __bfloat162float(__ushort_as_bfloat16(__ldg(p.a + row_off[r] + kk)));
#pragma unroll
        for (int bk = 0; bk < kBanks; ++bk)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[bk][r][j] = fmaf(xv, wf[bk][j], acc[bk][r][j]);
      }
    }
  }
#pragma unroll
  for (int off = kLanes; off < 32; off <<= 1)
#pragma unroll
    for (int bk = 0; bk < kBanks; ++bk)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[bk][r][j] += __shfl_xor_sync(0xffffffffu, acc[bk][r][j], off);
  if (lane < kLanes)
#pragma unroll
    for (int bk = 0; bk < kBanks; ++bk)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) partial[bk][warp][r][c + j] = acc[bk][r][j];
  __syncthreads();
  // Output element i = r * COLS + col of the tile, from its sums v.
  const auto in_tile = [&](int i) { return i / COLS < t.row_count && i % COLS < t.ncols; };
  const auto store = [&](int i, float* v) {
    uint16_t* dst = out + static_cast<int64_t>(p.rows[t.row_begin + i / COLS]) * p.ldc + t.col0 + i % COLS;
    if constexpr (kSwiGlu) {  // no splits, no accumulation (the host checks)
      const float g = __bfloat162float(__float2bfloat16_rn(v[0])), u = __bfloat162float(__float2bfloat16_rn(v[1]));
      *dst = bf16_round(swiglu_value(g, u));
      return;
    }
    if (t.slot >= 0) {  // a piece of a split reduction
      p.partials[static_cast<int64_t>(t.slot) * (R * COLS) + i] = v[0];
      return;
    }
    if (p.accumulate) v[0] += __bfloat162float(__ushort_as_bfloat16(*dst));
    *dst = __bfloat16_as_ushort(__float2bfloat16_rn(v[0]));
  };
  if (slices == 1) {
    for (int i = tid; i < R * COLS; i += kGemvThreads) {
      if (!in_tile(i)) continue;
      float v[kBanks] = {};
#pragma unroll
      for (int bk = 0; bk < kBanks; ++bk)
#pragma unroll
        for (int wp = 0; wp < kWarps; ++wp) v[bk] += partial[bk][wp][i / COLS][i % COLS];
      store(i, v);
    }
    return;
  }
  // A cluster: each block sums its warps in place of warp 0's partials, then the blocks share
  // the tile's outputs, each adding the blocks' sums in rank order.
  for (int i = tid; i < R * COLS; i += kGemvThreads)
#pragma unroll
    for (int bk = 0; bk < kBanks; ++bk) {
      float v = partial[bk][0][i / COLS][i % COLS];
#pragma unroll
      for (int wp = 1; wp < kWarps; ++wp) v += partial[bk][wp][i / COLS][i % COLS];
      partial[bk][0][i / COLS][i % COLS] = v;
    }
  namespace cg = cooperative_groups;
  cg::this_cluster().sync();  // every block's sums, visible to the cluster
  for (int i = slice * kGemvThreads + tid; i < R * COLS; i += slices * kGemvThreads) {
    if (!in_tile(i)) continue;
    float v[kBanks] = {};
    for (int sl = 0; sl < slices; ++sl) {
      const float* sums = cg::this_cluster().map_shared_rank(&partial[0][0][0][0], sl);
#pragma unroll
      for (int bk = 0; bk < kBanks; ++bk) v[bk] += sums[bk * (kWarps * R * COLS) + i];
    }
    store(i, v);
  }
  cg::this_cluster().sync();  // no block leaves while another reads its sums
}

template <int... I>
void gemv_configs(const AlgRowArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  auto one = [&](auto index) {
    constexpr AlgGemvConfig cfg = kAlgGemvConfigs[decltype(index)::value];
    if (a.num_tiles == 0) return;
    // One block, or a cluster of a.slices blocks, per tile; y = 1 the second bank (AlgRowArgs::w2).
    const dim3 grid(static_cast<unsigned>(a.num_tiles * a.slices), a.w2 != nullptr && !a.swiglu ? 2u : 1u);
    auto kernel = a.swiglu ? algproj_gemv_kernel<cfg.rows, cfg.cols, true> : algproj_gemv_kernel<cfg.rows, cfg.cols, false>;
    cudaLaunchAttribute attrs[2]{pdl_attribute(), {}};
    attrs[1].id = cudaLaunchAttributeClusterDimension;  // only for clusters: it costs ~0.5 µs
    attrs[1].val.clusterDim.x = static_cast<unsigned>(a.slices);
    attrs[1].val.clusterDim.y = attrs[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t launch{};
    launch.gridDim = grid;
    launch.blockDim = dim3(kGemvThreads);
    launch.stream = stream;
    launch.attrs = attrs;
    launch.numAttrs = a.slices > 1 ? 2 : 1;
    QV_CUDA_CHECK(cudaLaunchKernelEx(&launch, kernel, a));
  };
  ((config == I ? one(std::integral_constant<int, I>{}) : void()), ...);
}

template <int I, int VEC>
void rows_config(const AlgRowArgs& a, cudaStream_t stream) {
  using G = RowCfg<I>;
  // The ring (A and B stages), then the staging of staged configurations.
  const size_t a_bytes = size_t(G::kStages) * G::BM * (G::kChunk + 8) * 2 +
                         (kAlgRowConfigs[I].staged ? size_t(G::BM) * (G::BN + 8) * 2 + 128 : 0);
  if constexpr (kAlgRowConfigs[I].packed) {  // forward only (AlgProj::run_fused checks)
    launch<algproj_rows_kernel<I, false, VEC>>(G::kThreads, a_bytes + size_t(G::kStages) * G::kChunk * (G::BN + 8) * 2,
                                               a.num_tiles, true, a, stream);
  } else if (a.w_transposed)
    launch<algproj_rows_kernel<I, true, VEC>>(G::kThreads, a_bytes + size_t(G::kStages) * G::BN * (G::kChunk + 8) * 2,
                                              a.num_tiles, true, a, stream);
  else
    launch<algproj_rows_kernel<I, false, VEC>>(G::kThreads, a_bytes + size_t(G::kStages) * G::kChunk * (G::BN + 8) * 2,
                                               a.num_tiles, true, a, stream);
}

template <int VEC, int... I>
void rows_vec(const AlgRowArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? rows_config<I, VEC>(a, stream) : void()), ...);
}

template <int I, int VEC>
void weights_config(const AlgWeightArgs& a, cudaStream_t stream) {
  using G = WeightCfg<I>;
  const size_t smem = size_t(G::kStages) * G::kChunk * ((G::BM + 8) + (G::BN + 8)) * 2;
  launch<algproj_weights_kernel<I, VEC>>(G::kThreads, smem, a.num_tiles, false, a, stream);
}

template <int VEC, int... I>
void weights_vec(const AlgWeightArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? weights_config<I, VEC>(a, stream) : void()), ...);
}

}  // namespace

void launch_algproj_rows(const AlgRowArgs& args, int config, int vec, cudaStream_t stream) {
  const auto configs = std::make_integer_sequence<int, kAlgRowConfigCount>{};
  if (vec == 8)
    rows_vec<8>(args, config, stream, configs);
  else if (vec == 4)
    rows_vec<4>(args, config, stream, configs);
  else
    rows_vec<2>(args, config, stream, configs);
}

void launch_algproj_reduce(const AlgReduceArgs& args, cudaStream_t stream) {
  if (args.num_splits == 0) return;
  algproj_reduce_kernel<<<args.num_splits, 256, 0, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_algproj_reduce_weights(const AlgWeightReduceArgs& args, cudaStream_t stream) {
  if (args.num_splits == 0) return;
  algproj_reduce_weights_kernel<<<args.num_splits, 256, 0, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_algproj_gemv(const AlgRowArgs& args, int config, cudaStream_t stream) {
  gemv_configs(args, config, stream, std::make_integer_sequence<int, kAlgGemvConfigCount>{});
}

void launch_algproj_weights(const AlgWeightArgs& args, int config, int vec, cudaStream_t stream) {
  const auto configs = std::make_integer_sequence<int, kAlgWeightConfigCount>{};
  if (vec == 8)
    weights_vec<8>(args, config, stream, configs);
  else if (vec == 4)
    weights_vec<4>(args, config, stream, configs);
  else
    weights_vec<2>(args, config, stream, configs);
}

}  // namespace quiver::cuda::detail
