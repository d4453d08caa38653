// The algebraic projection's Hopper row pass, forward and dX (algproj_fused_launch.h:
// AlgTmaArgs). Tiles are 64 rows of one row class × BN output columns. A block has `groups`
// consumer warpgroups and one producer warp, and walks the tiles blockIdx.x, blockIdx.x +
// gridDim.x, ...: one block per tile (grid = tiles), or persistent (grid = the blocks that fit
// at once), its consumer warpgroups taking its tiles in turn. The producer's lane 0 walks the
// block's tiles' segments in 64-deep chunks, in order; per chunk it waits for a free stage of
// the ring, arms its full barrier with the chunk's bytes and issues two TMA loads: the A box
// (the tile's rows of x, or of dY for dX, as one box of a strided view, reduction columns
// k0 .. k0 + 63) and the W box: forward, W rows k0 .. k0 + 63 and the tile's columns (one box
// per 64-column panel, MN-major); dX (kTransW), W rows = the tile's dX columns, W columns
// k0 .. k0 + 63 (one box of BN 128-byte rows, K-major). So the producer runs ahead into the
// next tile while the consumers finish one. A segment's tail (fewer than 64 k left) comes as
// 16-deep slices instead (kSlice): x's slice one 32-byte-swizzled panel of 64 rows, W's its 16
// rows of each 64-column panel (forward) or one 32-byte-swizzled panel of BN rows (dX), so a
// tail of 16, 32 or 48 moves only its own bytes. A consumer warpgroup counts the chunks of the
// tiles it skips (the other warpgroup's), waits until the other has issued the products of the
// tile before (an order barrier each way), waits for its own chunks' stages, runs their four k16
// steps as wgmma m64nBNk16 (operands swizzled as TMA wrote them; a tail's steps past its slices
// read zero operands), keeps one chunk's products in flight and releases the stage before it
// (each warp's lane 0 arrives), and the last one at the tile's end. A tail whose length is not a
// multiple of 16 has the rest of its last slice (the next group's columns) zeroed first
// (zero_slice_past). The epilogue rounds once to bf16 (+ the old value when accumulating) while
// the other warpgroup's products run.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/algproj_fused_launch.h"
#include "cuda/block_launch.cuh"
#include "cuda/check.h"
#include "cuda/mma_ptx.cuh"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"

namespace quiver::cuda::detail {
namespace {

constexpr int kGroupThreads = 128;

template <int BN, int kStages>
struct TmaLayout {
  using A = wgmma::Panels<kAlgTmaChunk>;  // A chunk: 64 rows × 64 k (K-major)
  using B = wgmma::Panels<BN>;            // forward W chunk: 64 k × BN columns (MN-major)
  // dX's W chunk is BN rows × 64 k, one K-major panel of 128-byte rows: A's layout, BN rows.
  static constexpr uint32_t kBBytes = BN * 128;
  static_assert(kBBytes == B::kBytes, "both W chunk layouts take the same bytes");
  static constexpr uint32_t kStageBytes = A::kBytes + kBBytes;
  // full[kStages], empty[kStages], order[2] barriers after the stages, then (1024-byte aligned)
  // the zero operands of a tail's steps past its slices: one A slice (64 rows × 16 k) and BN × 16
  // of W.
  static constexpr uint32_t kZeroBytes = (kAlgTmaRows + BN) * 16 * 2;
  static_assert((2 * kStages + 2) * sizeof(uint64_t) <= 1024, "the barriers fit below the zero operands");
  static constexpr size_t kSmem = 1024 + size_t(kStages) * kStageBytes + 1024 + kZeroBytes;

  // The ring in the block's dynamic shared memory (1024-byte aligned for the 128-byte swizzle).
  struct Ring {
    unsigned char* base;
    __device__ explicit Ring(unsigned char* raw) : base(raw + (1024 - smem_addr(raw) % 1024) % 1024) {}
    __device__ unsigned char* a(int s) const { return base + s * kStageBytes; }
    __device__ unsigned char* b(int s) const { return a(s) + A::kBytes; }
    __device__ uint64_t* full() const { return reinterpret_cast<uint64_t*>(base + kStages * kStageBytes); }
    __device__ uint64_t* empty() const { return full() + kStages; }
    __device__ uint64_t* order() const { return empty() + kStages; }
    __device__ unsigned char* zero_a() const { return base + kStages * kStageBytes + 1024; }
    __device__ unsigned char* zero_b() const { return zero_a() + kAlgTmaRows * 16 * 2; }  // after one A slice
    // By every thread, before a __syncthreads: the zero operands.
    __device__ void zero() const {
      for (uint32_t o = 16 * threadIdx.x; o < kZeroBytes; o += 16 * blockDim.x)
        *reinterpret_cast<uint4*>(zero_a() + o) = make_uint4(0, 0, 0, 0);
      fence_proxy_async_shared();  // read by the tensor cores
    }
    // By one thread, before a __syncthreads: each full barrier completes on the producer's
    // arrival and its bytes, each empty and order barrier on one arrival per consumer warp.
    __device__ void init() const {
      for (int s = 0; s < kStages; ++s) {
        tma::init(&full()[s], 1);
        tma::init(&empty()[s], kGroupThreads / 32);
      }
      for (int g = 0; g < 2; ++g) tma::init(&order()[g], kGroupThreads / 32);
      tma::fence_init();
    }
  };
};

// The 64-deep chunks of a tile: one per started 64 columns of each segment (producer and
// consumers count the same).
__device__ __forceinline__ int tile_chunks(const AlgTmaArgs& p, const ops::AlgRowTile& t) {
  int n = 0;
  for (int sg = 0; sg < t.seg_count; ++sg) n += (p.segments[t.seg_begin + sg].len + kAlgTmaChunk - 1) / kAlgTmaChunk;
  return n;
}

// A segment's tail: `valid` < 64 of its k, loaded as ceil(valid / 16) slices of 16 k.
inline constexpr int kSlice = 16;
__host__ __device__ constexpr int tail_slices(int valid) { return (valid + kSlice - 1) / kSlice; }
// Bytes of one slice: A's 64 rows × 16 k and W's 16 k × BN columns (both 32 bytes a row or column).
template <int BN>
inline constexpr uint32_t kSliceBytes = (kAlgTmaRows + BN) * kSlice * 2;
using SlicePanel = wgmma::Panels<kSlice>;  // a slice as a K-major operand: 32-byte rows
__device__ __forceinline__ unsigned char* a_slice(unsigned char* a, int s) {
  return a + s * kAlgTmaRows * kSlice * 2;
}
template <int BN>
__device__ __forceinline__ unsigned char* w_slice_t(unsigned char* b, int s) {  // dX: BN rows × 16 k
  return b + s * BN * kSlice * 2;
}

// A tail whose last slice runs past the segment (valid % 16 != 0): the consumer warpgroup zeroes
// that slice's x columns and W rows (forward) or columns (dX) from `valid` on, so that its k16
// step adds nothing of the next group. tid: the thread's index in its warpgroup; barrier: the
// warpgroup's named barrier (1 or 2).
template <int BN, bool kTransW>
__device__ __forceinline__ void zero_slice_past(unsigned char* a, unsigned char* b, int valid, int tid, int barrier) {
  using B = wgmma::Panels<BN>;
  const int s = valid / kSlice, from = valid % kSlice, width = kSlice - from;
  unsigned char* as = a_slice(a, s);
  for (int e = tid; e < kAlgTmaRows * width; e += kGroupThreads)
    *reinterpret_cast<uint16_t*>(as + SlicePanel::offset(e / width, from + e % width)) = 0;
  if constexpr (kTransW) {  // the slice's W columns from `from` on, in each of its BN rows
    unsigned char* bs = w_slice_t<BN>(b, s);
    for (int e = tid; e < BN * width; e += kGroupThreads)
      *reinterpret_cast<uint16_t*>(bs + SlicePanel::offset(e / width, from + e % width)) = 0;
  } else {  // W's rows from `valid` on, within the slice
    for (int e = tid; e < width * (BN / 8); e += kGroupThreads)
      *reinterpret_cast<uint4*>(b + B::offset(valid + e / (BN / 8), e % (BN / 8) * 8)) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_shared();  // the tensor cores read them next
  if (barrier == 1)  // this warpgroup only (an immediate id: ptxas counts a register id as all 16)
    asm volatile("bar.sync 1, %0;\n" ::"n"(kGroupThreads));
  else
    asm volatile("bar.sync 2, %0;\n" ::"n"(kGroupThreads));
}

// The four k16 steps of one stage: a whole chunk's, or a tail's `slices` slices and then steps
// over the zero operands (zero_a: a slice of A, zero_b: BN × 16 of W as either operand), so
// that every chunk issues the same instructions (a data-dependent count puts the wgmma on a
// divergent path, which ptxas serializes); only the descriptors are selected.
template <int BN, bool kTransW>
__device__ __forceinline__ void chunk_products(float (&acc)[BN / 2], unsigned char* a, unsigned char* b, int slices,
                                               const unsigned char* zero_a, const unsigned char* zero_b) {
  using A = wgmma::Panels<kAlgTmaChunk>;
  using B = wgmma::Panels<BN>;
  constexpr int kSteps = kAlgTmaChunk / kSlice;
  const bool tail = slices < kSteps;
  uint64_t da[kSteps], db[kSteps];  // all selected before the fence (ptxas fences registers set after it)
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const bool zero = kk >= slices;
    da[kk] = !tail ? A::k_major(a, kSlice * kk) : SlicePanel::k_major(zero ? zero_a : a_slice(a, kk), 0);
    if constexpr (kTransW)
      db[kk] = !tail ? A::k_major(b, kSlice * kk) : SlicePanel::k_major(zero ? zero_b : w_slice_t<BN>(b, kk), 0);
    else  // zero_b as 16 rows of each 64-column panel, 2 KiB apart
      db[kk] = zero ? wgmma::descriptor<128>(zero_b, kSlice * 128, 8 * 128) : B::mn_major(b, kSlice * kk);
  }
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    if constexpr (kTransW)
      wgmma::mma<BN, 0, 0>(acc, da[kk], db[kk], true);
    else
      wgmma::mma<BN, 0, 1>(acc, da[kk], db[kk], true);
  }
}

template <int BN, int kStages, bool kTransW, int kGroups>
__global__ void __launch_bounds__(kGroups * kGroupThreads + 32, 1)
    algproj_tma_kernel(const __grid_constant__ AlgTmaArgs p) {
  using L = TmaLayout<BN, kStages>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const typename L::Ring ring(smem_raw);
  uint64_t* full = ring.full();
  uint64_t* empty = ring.empty();
  uint64_t* order = ring.order();  // order[g]: the other warpgroup has issued its tile's products
  if (threadIdx.x == 0) ring.init();
  ring.zero();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == kGroups * kGroupThreads / 32) {  // the producer
    if (lane != 0) return;
    const int s_rows = p.row_stride;
    int c = 0;
    for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
      const ops::AlgRowTile t = p.tiles[tile];
      const int r_first = p.rows[t.row_begin], cls = r_first % s_rows, i0 = r_first / s_rows;
      for (int sg = 0; sg < t.seg_count; ++sg) {
        const ops::AlgSegment seg = p.segments[t.seg_begin + sg];
        for (int k0 = seg.k0; k0 < seg.k0 + seg.len; k0 += kAlgTmaChunk, ++c) {
          const int stage = c % kStages;
          if (c >= kStages) tma::wait(&empty[stage], ((c / kStages) & 1) ^ 1);  // its last chunk was consumed
          const int valid = min(kAlgTmaChunk, seg.k0 + seg.len - k0);
          unsigned char* a = ring.a(stage);
          unsigned char* b = ring.b(stage);
          if (valid == kAlgTmaChunk) {
            tma::arrive_expect(&full[stage], L::kStageBytes);
            if (s_rows > 1)
              tma::load_3d(a, &p.x, &full[stage], k0, cls, i0);
            else
              tma::load_2d(a, &p.x, &full[stage], k0, r_first);
            if constexpr (kTransW) {
              tma::load_2d(b, &p.w, &full[stage], k0, t.col0);
            } else {
#pragma unroll
              for (int pn = 0; pn < BN / 64; ++pn)
                tma::load_2d(b + pn * L::B::kPanelBytes, &p.w, &full[stage], t.col0 + 64 * pn, k0);
            }
          } else {  // the tail, slice by slice
            const int n = tail_slices(valid);
            tma::arrive_expect(&full[stage], n * kSliceBytes<BN>);
            for (int sl = 0; sl < n; ++sl) {
              const int k = k0 + kSlice * sl;
              if (s_rows > 1)
                tma::load_3d(a_slice(a, sl), &p.x16, &full[stage], k, cls, i0);
              else
                tma::load_2d(a_slice(a, sl), &p.x16, &full[stage], k, r_first);
              if constexpr (kTransW) {
                tma::load_2d(w_slice_t<BN>(b, sl), &p.w16, &full[stage], k, t.col0);
              } else {  // W rows k .. k + 15 where a whole chunk would put them
#pragma unroll
                for (int pn = 0; pn < BN / 64; ++pn)
                  tma::load_2d(b + pn * L::B::kPanelBytes + sl * kSlice * 128, &p.w16, &full[stage], t.col0 + 64 * pn,
                               k);
              }
            }
          }
        }
      }
    }
    return;
  }

  const int group = warp / 4, gwarp = warp % 4, tid = threadIdx.x % kGroupThreads;
  const int grp = lane / 4, tig = lane % 4;
  float acc[BN / 2];
  int c = 0, j = 0, mine = 0;  // the block's chunks and tiles so far, this warpgroup's tiles
  for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x, ++j) {
    const ops::AlgRowTile t = p.tiles[tile];
    if (j % kGroups != group) {  // the other warpgroup's tile: skip its chunks
      c += tile_chunks(p, t);
      continue;
    }
    // Two warpgroups issue their tiles' products in the block's tile order (one's epilogue
    // runs during the other's products). This also keeps the full barriers' parity exact: every
    // chunk before this tile's has been waited for, so a stage's previous use has completed.
    if constexpr (kGroups > 1) {
      if (group == 1) tma::wait(&order[1], mine & 1);  // warpgroup 0's tile before this one
      else if (mine > 0) tma::wait(&order[0], (mine - 1) & 1);  // warpgroup 1's tile before
    }
    ++mine;
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] = 0.0f;
    int pending = -1;  // the stage whose products are still in flight
    for (int sg = 0; sg < t.seg_count; ++sg) {
      const ops::AlgSegment seg = p.segments[t.seg_begin + sg];
      for (int k0 = seg.k0; k0 < seg.k0 + seg.len; k0 += kAlgTmaChunk, ++c) {
        const int stage = c % kStages;
        tma::wait(&full[stage], (c / kStages) & 1);
        const int valid = min(kAlgTmaChunk, seg.k0 + seg.len - k0);
        unsigned char* a = ring.a(stage);
        unsigned char* b = ring.b(stage);
        if (valid % kSlice != 0) zero_slice_past<BN, kTransW>(a, b, valid, tid, kGroups == 1 ? 1 : 1 + group);
        chunk_products<BN, kTransW>(acc, a, b, tail_slices(valid), ring.zero_a(), ring.zero_b());
        wgmma::commit();
        // The previous chunk's products are done: its stage is free once every warp's share of
        // the warpgroup's products has read it (wait_group completes the executing warp's).
        wgmma::wait<1>();
        if (pending >= 0 && lane == 0) tma::arrive(&empty[pending]);
        pending = stage;
      }
    }
    if constexpr (kGroups > 1) {
      if (lane == 0) tma::arrive(&order[1 - group]);  // the other warpgroup's next tile may start
    }
    wgmma::wait<0>();
    if (pending >= 0 && lane == 0) tma::arrive(&empty[pending]);  // the tile's last stage

    // Accumulator (row 16 warp + grp (+ 8), columns 8 j + 2 tig, + 1) → bf16 pairs.
    const int r_first = p.rows[t.row_begin];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * gwarp + grp + 8 * half;
      if (i >= t.row_count) continue;
      uint16_t* out = p.c + static_cast<int64_t>(r_first + p.row_stride * i) * p.ldc + t.col0;
#pragma unroll
      for (int jj = 0; jj < BN / 8; ++jj) {
        const int col = 8 * jj + 2 * tig;
        if (col >= t.ncols) continue;
        float v0 = acc[4 * jj + 2 * half], v1 = acc[4 * jj + 2 * half + 1];
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
}

// ---- Weight pass ----------------------------------------------------------------------------
// One block per dW tile: warp 4 the producer (lane 0 walks the tile's chunks), warps 0-3 one
// consumer warpgroup. A chunk of `count` < 64 rows has its boxes' rows from count on (the
// progression's next rows, of other pieces) zeroed first.
template <int BN>
__device__ __forceinline__ void zero_rows_past(unsigned char* a, unsigned char* b, int count) {
  using A = wgmma::Panels<kAlgTmaChunk>;
  using B = wgmma::Panels<BN>;
  const int rows = ops::kAlgTmaChunkRows - count;
  for (int e = threadIdx.x; e < rows * (kAlgTmaChunk / 8); e += kGroupThreads)
    *reinterpret_cast<uint4*>(a + A::offset(count + e / (kAlgTmaChunk / 8), e % (kAlgTmaChunk / 8) * 8)) =
        make_uint4(0, 0, 0, 0);
  for (int e = threadIdx.x; e < rows * (BN / 8); e += kGroupThreads)
    *reinterpret_cast<uint4*>(b + B::offset(count + e / (BN / 8), e % (BN / 8) * 8)) = make_uint4(0, 0, 0, 0);
  fence_proxy_async_shared();  // the tensor cores read them next
  asm volatile("bar.sync 1, %0;\n" ::"n"(kGroupThreads));
}

template <int BN, int kStages>
__global__ void __launch_bounds__(kGroupThreads + 32, 1)
    algproj_tma_weights_kernel(const __grid_constant__ AlgTmaWeightArgs p) {
  static_assert(ops::kAlgTmaChunkRows == 64, "a chunk's rows are one box of 64");
  using L = TmaLayout<BN, kStages>;  // A: 64 rows × 64 K columns; B: 64 rows × BN N columns
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const typename L::Ring ring(smem_raw);
  uint64_t* full = ring.full();
  uint64_t* empty = ring.empty();
  if (threadIdx.x == 0) ring.init();
  __syncthreads();

  const ops::AlgWeightTile t = p.tiles[blockIdx.x];
  const int c_begin = p.tile_begin[blockIdx.x], chunks = p.tile_begin[blockIdx.x + 1] - c_begin;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == kGroupThreads / 32) {  // the producer
    if (lane != 0) return;
    for (int c = 0; c < chunks; ++c) {
      const int stage = c % kStages;
      if (c >= kStages) tma::wait(&empty[stage], ((c / kStages) & 1) ^ 1);
      tma::arrive_expect(&full[stage], L::kStageBytes);
      const ops::AlgWeightChunk ch = p.chunks[c_begin + c];
      if (ch.strided) {
        const int cls = ch.row0 % p.stride, i0 = ch.row0 / p.stride;
        tma::load_3d(ring.a(stage), &p.xs, &full[stage], t.k0, cls, i0);
#pragma unroll
        for (int pn = 0; pn < BN / 64; ++pn)
          tma::load_3d(ring.b(stage) + pn * L::B::kPanelBytes, &p.dys, &full[stage], t.col0 + 64 * pn, cls, i0);
      } else {
        tma::load_2d(ring.a(stage), &p.x, &full[stage], t.k0, ch.row0);
#pragma unroll
        for (int pn = 0; pn < BN / 64; ++pn)
          tma::load_2d(ring.b(stage) + pn * L::B::kPanelBytes, &p.dy, &full[stage], t.col0 + 64 * pn, ch.row0);
      }
    }
    return;
  }

  float acc[BN / 2] = {};
  int pending = -1;
  for (int c = 0; c < chunks; ++c) {
    const int stage = c % kStages;
    tma::wait(&full[stage], (c / kStages) & 1);
    const int count = p.chunks[c_begin + c].count;
    if (count < ops::kAlgTmaChunkRows) zero_rows_past<BN>(ring.a(stage), ring.b(stage), count);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < ops::kAlgTmaChunkRows / 16; ++kk)
      wgmma::mma<BN, 1, 1>(acc, L::A::mn_major(ring.a(stage), 16 * kk), L::B::mn_major(ring.b(stage), 16 * kk), true);
    wgmma::commit();
    wgmma::wait<1>();  // the previous chunk's products are done (this warp's share)
    if (pending >= 0 && lane == 0) tma::arrive(&empty[pending]);
    pending = stage;
  }
  wgmma::wait<0>();

  // Accumulator (dW row 16 warp + grp (+ 8), columns 8 j + 2 tig, + 1) → fp32 pairs, into dW
  // or the tile's slot.
  const int grp = lane / 4, tig = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * warp + grp + 8 * half;
    if (i >= t.nk) continue;
    float* out = t.slot >= 0 ? p.partials + static_cast<int64_t>(t.slot) * (kAlgTmaChunk * BN) + i * BN
                             : p.dw + static_cast<int64_t>(t.k0 + i) * p.lddw + t.col0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = 8 * j + 2 * tig;
      if (col >= t.ncols) continue;
      float2 v = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      auto* dst = reinterpret_cast<float2*>(out + col);
      if (p.accumulate && t.slot < 0) {
        const float2 old = *dst;
        v.x += old.x;
        v.y += old.y;
      }
      *dst = v;
    }
  }
}

template <int I>
void tma_weight_config(const AlgTmaWeightArgs& a, cudaStream_t stream) {
  constexpr AlgTmaConfig cfg = kAlgTmaWeightConfigs[I];
  launch<algproj_tma_weights_kernel<cfg.cols, cfg.stages>>(kGroupThreads + 32, TmaLayout<cfg.cols, cfg.stages>::kSmem,
                                                           a.num_tiles, false, a, stream);
}

template <int... I>
void tma_weight_configs(const AlgTmaWeightArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? tma_weight_config<I>(a, stream) : void()), ...);
}

template <int I, bool kTransW>
void tma_config(const AlgTmaArgs& a, cudaStream_t stream) {
  constexpr AlgTmaConfig cfg = kAlgTmaConfigs[I];
  launch<algproj_tma_kernel<cfg.cols, cfg.stages, kTransW, cfg.groups>>(
      cfg.groups * kGroupThreads + 32, TmaLayout<cfg.cols, cfg.stages>::kSmem, a.num_tiles, cfg.persistent, a, stream);
}

template <int... I>
void tma_configs(const AlgTmaArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? (a.w_transposed ? tma_config<I, true>(a, stream) : tma_config<I, false>(a, stream)) : void()), ...);
}

}  // namespace

void launch_algproj_tma(const AlgTmaArgs& args, int config, cudaStream_t stream) {
  tma_configs(args, config, stream, std::make_integer_sequence<int, kAlgTmaConfigCount>{});
}

void launch_algproj_tma_weights(const AlgTmaWeightArgs& args, int config, cudaStream_t stream) {
  tma_weight_configs(args, config, stream, std::make_integer_sequence<int, kAlgTmaWeightConfigCount>{});
}

}  // namespace quiver::cuda::detail
