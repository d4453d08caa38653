// The algebraic projection's Hopper row pass, forward and dX (algproj_fused_launch.h:
// AlgTmaArgs). Tiles are 64 rows of one row class × BT output columns. A block has `groups`
// consumer warpgroups of BN columns and one producer warp, and walks the tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...: one block per tile (grid = tiles), or persistent (grid = the
// blocks that fit at once), its consumer warpgroups taking its tiles in turn (BT = BN), or
// cooperative: side by side on each tile (BT = groups · BN), each on its BN columns of every
// stage, so that the tile's x is read from L2 once for all of them, or tall: two warpgroups one
// above the other on tiles of 128 rows (a stage holds both 64-row A chunks and one W chunk), so
// that the tile's W is read from L2 once for both (tiles of two output groups, ops::plan_two_group_pass,
// and the long dX tiles of a cluster plan, ops::plan_cluster_split, have kernels of their own
// below). The pass moves far more
// bytes than it has products for (a tile reduces over 2·K/q), so its time follows the bytes its
// tiles read: W's two blocks and x's two segments per tile.
//
// The producer warp reads the plan (tiles, rows, segments) 32 tiles at a time and its lane 0
// walks each tile's segments in 64-deep chunks, in order; per chunk it waits for a free stage of
// the ring, arms its full barrier with the chunk's bytes and issues the TMA loads: the A box
// (the tile's rows of x, or of dY for dX, as one box of a strided view, reduction columns
// k0 .. k0 + 63) and the W boxes: forward, W rows k0 .. k0 + 63 and the tile's columns (one box
// per 64-column panel, MN-major); dX (kTransW), W rows = the tile's dX columns, W columns
// k0 .. k0 + 63 (one box of BN 128-byte rows per warpgroup's share, K-major). Boxes wholly past
// the tile's columns (a narrow group, or its last tile) are not loaded. A tile's first stage
// also carries the tile's header (TileMeta, in shared memory beside the barriers), so the
// consumers read no plan metadata from global memory: under Nsight Compute, Qwen3-8B's forward
// stalled most on those loads before. The producer runs ahead into the next tile while the
// consumers finish one. A segment's tail (fewer than 64 k left) comes as 16-deep slices instead
// (kSlice): x's slice one 32-byte-swizzled panel of 64 rows, W's its 16 rows of each 64-column
// panel (forward) or one 32-byte-swizzled panel of BN rows (dX), so a tail of 16, 32 or 48
// moves only its own bytes. In a configuration with extra slices (AlgTmaConfig::extra), a tail of
// that many slices or fewer comes after the segment's last whole chunk, in the same stage (its
// slices after the chunk's A and W, TmaLayout::kXBytes each), so that it takes no stage of its own
// (tma_chunk_len).
//
// A stage is released by the warpgroups that compute on it: every warpgroup of a cooperative or
// tall tile, the tile's own warpgroup where two take tiles in turn. Those two start their tiles'
// products in the block's tile order (an order barrier each way, ping-pong): a warpgroup that has
// issued its tile's last products tells the other the stage its tile ended at, and so where the
// next tile's header is; the other's products then run while it finishes and stores its tile, and
// the producer refills each stage as soon as its one reader is done with it, so the whole ring is
// look-ahead for the warpgroup computing. The order also keeps the full barriers' parity exact:
// every chunk before a warpgroup's tile has been waited for, so a stage's previous use has
// completed. Per chunk a warpgroup runs the four k16 steps as wgmma m64nBNk16 (operands swizzled
// as TMA wrote them; a tail's steps past its slices read zero operands), keeps one chunk's products
// in flight and releases the stage before it (each warp's lane 0 arrives), and the last one at the
// tile's end; a block of one warpgroup, and an eager configuration's warpgroups, wait for each
// chunk's products and release its stage at once.
// A tail whose length is not a multiple of 16 has the rest of its last slice (the next group's
// columns) zeroed first (zero_slice_past). The epilogue rounds once to bf16 (+ the old value
// when accumulating), while the other warpgroup's products run when they take tiles in turn;
// with one staging (AlgTmaConfig::one_staging) their epilogues take the one staging in the
// block's tile order, each after the one before has had its stores read it (an mbarrier), so
// that the ring has room for another stage; with the staging in the ring
// (AlgTmaConfig::ring_staging, cooperative tiles), each warpgroup lays its products out in its own
// columns of the W chunk of the tile's last stage, which the block's warpgroups hold until the
// stores have read it, releasing it during the next tile's products.
//
// Ablations (bench/tma_ablation.cpp builds this file with them; the library never does): with
// QUIVER_TMA_ABLATE_LOADS the producer arrives on each stage without loading it (the products
// read stale shared memory), QUIVER_TMA_ABLATE_PRODUCTS issues no wgmma, QUIVER_TMA_ABLATE_STORES
// skips the epilogue. The results are wrong by design; the times show which part sets the pass's.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/algproj_fused_launch.h"
#include "cuda/block_launch.cuh"
#include "cuda/check.h"
#include "cuda/mma_ptx.cuh"
#include "cuda/pdl.cuh"
#include "cuda/tma.cuh"
#include "cuda/wgmma.cuh"

namespace quiver::cuda::detail {
namespace {

constexpr int kGroupThreads = 128;

// A row-pass tile as the producer warp reads it, and as its first stage's header tells the
// consumers (in shared memory beside the ring's barriers, written before the stage's full
// barrier is armed and read after it completes, so the consumers read no plan metadata from
// global memory): the tile's record, its first row and its first kMetaSegs segments (the rest,
// rare, from the plan). Every tile takes at least one stage: one with no segments takes one
// that carries only its header (its output is zero). A header with row_count 0 ends the walk.
// The producer warp reads the block's tiles kMetaBatch at a time: lane l loads tile first +
// l · stride, so the walk pays one global-load latency per batch instead of a chain per tile.
inline constexpr int kMetaBatch = 32, kMetaSegs = 4;
struct TileMeta {
  ops::AlgRowTile t;
  int r_first;
  ops::AlgSegment seg[kMetaSegs];
};
// Segment sg of a tile, from its header where it holds it.
__device__ __forceinline__ ops::AlgSegment tile_segment(const TileMeta& m, const AlgTmaArgs& p, int sg) {
  ops::AlgSegment seg{};
  if (sg < kMetaSegs) {
#pragma unroll
    for (int s = 0; s < kMetaSegs; ++s)  // by constant index: m stays in registers
      if (s == sg) seg = m.seg[s];
  } else {
    seg = p.segments[m.t.seg_begin + sg];
  }
  return seg;
}
__device__ __forceinline__ TileMeta load_tile_meta(const AlgTmaArgs& p, int tile) {
  TileMeta m{};
  if (tile < p.num_tiles) {
    m.t = p.tiles[tile];
    m.r_first = p.rows[m.t.row_begin];
#pragma unroll
    for (int s = 0; s < kMetaSegs; ++s)
      if (s < m.t.seg_count) m.seg[s] = p.segments[m.t.seg_begin + s];
  }
  return m;
}
__device__ __forceinline__ TileMeta shfl_tile_meta(const TileMeta& m, int src) {
  TileMeta r;
  r.t.row_begin = __shfl_sync(0xffffffffu, m.t.row_begin, src);
  r.t.row_count = __shfl_sync(0xffffffffu, m.t.row_count, src);
  r.t.col0 = __shfl_sync(0xffffffffu, m.t.col0, src);
  r.t.ncols = __shfl_sync(0xffffffffu, m.t.ncols, src);
  r.t.seg_begin = __shfl_sync(0xffffffffu, m.t.seg_begin, src);
  r.t.seg_count = __shfl_sync(0xffffffffu, m.t.seg_count, src);
  r.t.slot = -1;
  r.r_first = __shfl_sync(0xffffffffu, m.r_first, src);
#pragma unroll
  for (int s = 0; s < kMetaSegs; ++s) {
    r.seg[s].k0 = __shfl_sync(0xffffffffu, m.seg[s].k0, src);
    r.seg[s].len = __shfl_sync(0xffffffffu, m.seg[s].len, src);
  }
  return r;
}

// The producer warp's walk of a row pass's tiles, the block's (blockIdx.x, + gridDim.x, ...) in
// order: every lane loads one tile's header of each batch, and lane 0 calls on_tile with each
// in turn. The first batch's plan loads run before pdl_wait (the plan is no output of the kernel
// before).
template <class OnTile>
__device__ __forceinline__ void walk_tiles(const AlgTmaArgs& p, int lane, OnTile&& on_tile) {
  for (int first = blockIdx.x; first < p.num_tiles; first += kMetaBatch * gridDim.x) {
    const TileMeta mine = load_tile_meta(p, first + lane * gridDim.x);
    if (first == blockIdx.x) pdl_wait();
    for (int b = 0; b < kMetaBatch && first + b * gridDim.x < p.num_tiles; ++b) {
      const TileMeta m = shfl_tile_meta(mine, b);
      if (lane != 0) continue;
      on_tile(m);
    }
  }
}
// The producer's stage for chunk counter c (lane 0): once its last use has been consumed; a
// tile's first stage gets the tile's header.
template <int kStages>
__device__ __forceinline__ int take_stage(uint64_t* empty, TileMeta* headers, int c, bool first, const TileMeta& m) {
  const int stage = c % kStages;
  if (c >= kStages) tma::wait(&empty[stage], ((c / kStages) & 1) ^ 1);
  if (first) headers[stage] = m;
  return stage;
}

// kStaging: bytes after the zero operands (1024-byte aligned) where the row pass's warpgroups lay
// out their tiles' products for the TMA stores (64 rows × BN columns each, as wgmma::Panels<BN>).
// kAHalves: 64-row A chunks per stage (2: a tall tile's, one per warpgroup, one after the other).
// The weight pass's stage header: the tile (on every stage of it), its chunk count (-1: the end
// of the walk) and this stage's chunk's row count.
struct alignas(8) WeightMeta {
  ops::AlgWeightTile t;
  int chunks, count;
};

// A segment's tail: `valid` < 64 of its k, loaded as ceil(valid / 16) slices of 16 k.
inline constexpr int kSlice = 16;

template <int BN, int kStages, uint32_t kStaging = 0, int kAHalves = 1, class Meta = TileMeta, int kExtra = 0>
struct TmaLayout {
  using A = wgmma::Panels<kAlgTmaChunk>;  // A chunk: 64 rows × 64 k (K-major)
  using B = wgmma::Panels<BN>;            // forward W chunk: 64 k × BN columns (MN-major)
  // dX's W chunk is BN rows × 64 k, one K-major panel of 128-byte rows: A's layout, BN rows.
  static constexpr uint32_t kBBytes = BN * 128;
  static_assert(kBBytes == B::kBytes, "both W chunk layouts take the same bytes");
  static constexpr uint32_t kABytes = kAHalves * A::kBytes;
  // A stage's extra slices after its whole chunk (AlgTmaConfig::extra), each x's 16 k of every
  // 64-row A chunk (32-byte swizzle) and then W's: forward 16 rows of each 64-column panel, 2 KiB
  // apart; dX BN rows × 16 k (32-byte swizzle).
  static constexpr uint32_t kXASliceBytes = kAlgTmaRows * kSlice * 2;
  static constexpr uint32_t kXBytes = kAHalves * kXASliceBytes + BN * kSlice * 2;
  static_assert(kExtra == 0 || kXBytes % 1024 == 0, "every extra slice's W starts on a 128-byte swizzle's period");
  static constexpr uint32_t kStageBytes = kABytes + kBBytes + kExtra * kXBytes;
  // full[kStages] and empty[kStages] barriers, the stages' headers, the two order barriers and
  // the hand-over's stage counter after the stages, then (1024-byte aligned) the zero operand of
  // a tail's steps past its slices: one 1 KiB block of zeros, which every such step reads as
  // either operand through a descriptor with both strides 0 (zero_operand), so that its size
  // does not grow with the tile's columns.
  static constexpr uint32_t kZeroBytes = 1024;
  static_assert((2 * kStages + 3) * sizeof(uint64_t) + kStages * sizeof(Meta) + sizeof(uint64_t) <= 1024,
                "the barriers, headers, counter and staging barrier fit below the zero operands");
  static_assert(sizeof(Meta) % sizeof(uint64_t) == 0, "the order barriers after the headers are aligned");
  static constexpr uint32_t kStagingAt = kStages * kStageBytes + 1024 + (kZeroBytes + 1023) / 1024 * 1024;
  static constexpr size_t kSmem =
      kStaging > 0 ? 1024 + size_t(kStagingAt) + kStaging : 1024 + size_t(kStages) * kStageBytes + 1024 + kZeroBytes;
  static_assert(kSmem <= 227 * 1024, "the ring, its zero operands and the staging fit a block's shared memory");

  // The ring in the block's dynamic shared memory (1024-byte aligned for the 128-byte swizzle).
  struct Ring {
    unsigned char* base;
    __device__ explicit Ring(unsigned char* raw) : base(raw + (1024 - smem_addr(raw) % 1024) % 1024) {}
    __device__ unsigned char* a(int s) const { return base + s * kStageBytes; }
    __device__ unsigned char* b(int s) const { return a(s) + kABytes; }
    __device__ unsigned char* xa(int s, int j) const { return b(s) + kBBytes + j * kXBytes; }
    __device__ unsigned char* xb(int s, int j) const { return xa(s, j) + kAHalves * kXASliceBytes; }
    __device__ uint64_t* full() const { return reinterpret_cast<uint64_t*>(base + kStages * kStageBytes); }
    __device__ uint64_t* empty() const { return full() + kStages; }
    __device__ Meta* headers() const { return reinterpret_cast<Meta*>(empty() + kStages); }
    // order[g]: warpgroup g may start its next tile's products (two warpgroups taking tiles in
    // turn), and the stage counter at which that tile starts.
    __device__ uint64_t* order() const { return reinterpret_cast<uint64_t*>(headers() + kStages); }
    __device__ int* next_chunk() const { return reinterpret_cast<int*>(order() + 2); }
    // One staging for two warpgroups in turn (AlgTmaConfig::one_staging): completes a phase as each
    // tile's epilogue is done with it (its stores have read it).
    __device__ uint64_t* staging_free() const { return order() + 3; }
    __device__ unsigned char* zero() const { return base + kStages * kStageBytes + 1024; }
    __device__ unsigned char* staging() const { return base + kStagingAt; }
    // By every thread, before a __syncthreads: the zero operand.
    __device__ void clear_zero() const {
      for (uint32_t o = 16 * threadIdx.x; o < kZeroBytes; o += 16 * blockDim.x)
        *reinterpret_cast<uint4*>(zero() + o) = make_uint4(0, 0, 0, 0);
      fence_proxy_async_shared();  // read by the tensor cores
    }
    // By one thread, before a __syncthreads: each full barrier completes on the producer's
    // arrival and its bytes, each empty barrier on one arrival per consumer warp (`readers`
    // warpgroups), each order barrier on one arrival per warp of the other warpgroup.
    __device__ void init(int readers = 1) const {
      for (int s = 0; s < kStages; ++s) {
        tma::init(&full()[s], 1);
        tma::init(&empty()[s], readers * kGroupThreads / 32);
      }
      for (int g = 0; g < 2; ++g) tma::init(&order()[g], kGroupThreads / 32);
      tma::fence_init();
    }
  };
};

__host__ __device__ constexpr int tail_slices(int valid) { return (valid + kSlice - 1) / kSlice; }
using SlicePanel = wgmma::Panels<kSlice>;  // a slice as a K-major operand: 32-byte rows
__device__ __forceinline__ unsigned char* a_slice(unsigned char* a, int s) {
  return a + s * kAlgTmaRows * kSlice * 2;
}
template <int BN>
__device__ __forceinline__ unsigned char* w_slice_t(unsigned char* b, int s) {  // dX: BN rows × 16 k
  return b + s * BN * kSlice * 2;
}

// The named barrier 1 or 2 of the kThreads threads that read a stage: those that zero its operands
// before the tensor cores read them (zero_slice_past, zero_rows_past), and a cooperative tile's
// warpgroups before they lay out their products in its last stage (store_tile). By immediate id:
// ptxas counts a register id as all 16.
template <int kThreads>
__device__ __forceinline__ void stage_barrier(int barrier) {
  if (barrier == 1)
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads));
  else
    asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads));
}

// A tail whose last slice runs past the segment (valid % 16 != 0): the kThreads threads that read
// the stage (one warpgroup, or a cooperative or tall tile's warpgroups) zero that slice's x
// columns (of each of the stage's kHalves 64-row A chunks) and W rows (forward) or columns (dX)
// from `valid` on, all BT of them, so that no k16 step adds anything of the next group. tid: the
// thread's index among them; barrier: their named barrier (1 or 2).
template <int BT, bool kTransW, int kThreads, int kHalves = 1>
__device__ __forceinline__ void zero_slice_past(unsigned char* a, unsigned char* b, int valid, int tid, int barrier) {
  using B = wgmma::Panels<BT>;
  const int s = valid / kSlice, from = valid % kSlice, width = kSlice - from;
  for (int e = tid; e < kHalves * kAlgTmaRows * width; e += kThreads) {
    const int h = e / (kAlgTmaRows * width), r = e % (kAlgTmaRows * width);
    unsigned char* as = a_slice(a + h * wgmma::Panels<kAlgTmaChunk>::kBytes, s);
    *reinterpret_cast<uint16_t*>(as + SlicePanel::offset(r / width, from + r % width)) = 0;
  }
  if constexpr (kTransW) {  // the slice's W columns from `from` on, in each of its BT rows
    unsigned char* bs = w_slice_t<BT>(b, s);
    for (int e = tid; e < BT * width; e += kThreads)
      *reinterpret_cast<uint16_t*>(bs + SlicePanel::offset(e / width, from + e % width)) = 0;
  } else {  // W's rows from `valid` on, within the slice
    for (int e = tid; e < width * (BT / 8); e += kThreads)
      *reinterpret_cast<uint4*>(b + B::offset(valid + e / (BT / 8), e % (BT / 8) * 8)) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_shared();  // the tensor cores read them next
  stage_barrier<kThreads>(barrier);  // these threads only
}

// A zero operand of any shape in R-byte swizzled rows: every 8-row group and every panel at the
// same 1 KiB block of zeros (1024-byte aligned), by strides of 0.
template <int kRowBytes>
__device__ __forceinline__ uint64_t zero_operand(const unsigned char* zero) {
  return wgmma::descriptor<kRowBytes>(zero, 0, 0);
}

// The four k16 steps of one stage for the BN columns from wcol of its BT (a warpgroup's share of
// a cooperative tile; 0 otherwise): a whole chunk's (valid = 64), or a tail's ceil(valid / 16)
// slices and then steps over zero operands (zero_operand, both A and W), so that every chunk
// issues the same instructions (a data-dependent count puts the wgmma on a divergent path, which
// ptxas serializes); only the descriptors are selected. With kExtra slices
// (AlgTmaConfig::extra), kExtra more steps follow: the stage's `extra` slices (x's at xa, this
// warpgroup's 64-row half; W's at xb; kXBytes apart) and then zero operands.
template <int BN, int BT, bool kTransW, int kExtra = 0, uint32_t kXBytes = 0>
__device__ __forceinline__ void chunk_products(float (&acc)[BN / 2], unsigned char* a, unsigned char* stage_b,
                                               int wcol, int valid, const unsigned char* zero,
                                               unsigned char* xa = nullptr, unsigned char* xb = nullptr,
                                               int extra = 0) {
  using A = wgmma::Panels<kAlgTmaChunk>;
  using B = wgmma::Panels<BN>;
  static_assert(BT == BN || BN % 64 == 0, "a warpgroup's columns start on a whole panel");
  // This warpgroup's W: forward, its panels; dX, its rows (128 bytes each, of a whole chunk).
  unsigned char* b = stage_b + (kTransW ? wcol * 128 : wcol / 64 * B::kPanelBytes);
  constexpr int kSteps = kAlgTmaChunk / kSlice;
  // A tail (valid < 64) was loaded slice by slice, also where it has four slices (49-63 of k).
  const bool tail = valid < kAlgTmaChunk;
  const int slices = tail_slices(valid);
  // All selected before the fence (ptxas fences registers set after it).
  const uint64_t za = zero_operand<2 * kSlice>(zero), zb = kTransW ? za : zero_operand<128>(zero);
  uint64_t da[kSteps], db[kSteps];
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const bool z = kk >= slices;
    da[kk] = !tail ? A::k_major(a, kSlice * kk) : z ? za : SlicePanel::k_major(a_slice(a, kk), 0);
    if constexpr (kTransW)
      db[kk] = !tail ? A::k_major(b, kSlice * kk)
                     : z ? zb : SlicePanel::k_major(w_slice_t<BT>(stage_b, kk) + wcol * kSlice * 2, 0);
    else
      db[kk] = z ? zb : B::mn_major(b, kSlice * kk);
  }
  constexpr int kX = kExtra > 0 ? kExtra : 1;
  uint64_t xda[kX], xdb[kX];
#pragma unroll
  for (int j = 0; j < kExtra; ++j) {
    const bool z = j >= extra;
    xda[j] = z ? za : SlicePanel::k_major(xa + j * kXBytes, 0);
    if constexpr (kTransW)
      xdb[j] = z ? zb : SlicePanel::k_major(xb + j * kXBytes + wcol * kSlice * 2, 0);
    else  // 16 rows of each 64-column panel, 2 KiB apart
      xdb[j] = z ? zb
                 : wgmma::descriptor<128>(xb + j * kXBytes + wcol / 64 * kSlice * 128, kSlice * 128, 8 * 128);
  }
  const auto step = [&](uint64_t da_k, uint64_t db_k) {  // one k16 step; dX's W is K-major
    if constexpr (kTransW)
      wgmma::mma<BN, 0, 0>(acc, da_k, db_k, true);
    else
      wgmma::mma<BN, 0, 1>(acc, da_k, db_k, true);
  };
  wgmma::fence();
#ifndef QUIVER_TMA_ABLATE_PRODUCTS
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) step(da[kk], db[kk]);
#pragma unroll
  for (int j = 0; j < kExtra; ++j) step(xda[j], xdb[j]);
#endif
}

// The row pass's layout: a tile's columns are one warpgroup's BN, or (cooperative) its
// warpgroups' side by side; a tall tile's stage holds two 64-row A chunks; every warpgroup has a
// staging of 64 × BN products, or (kOneStaging) two warpgroups in turn share one, or
// (kRingStaging) each lays its products out in its own columns of the W chunk of the tile's
// last stage.
template <int BN, int kStages, int kGroups, bool kCoop, bool kTall, int kExtra = 0, bool kOneStaging = false,
          bool kRingStaging = false>
using RowLayout =
    TmaLayout<(kCoop ? kGroups : 1) * BN, kStages, kRingStaging ? 0u : uint32_t(kOneStaging ? 1 : kGroups) * BN * 128,
              kTall ? 2 : 1, TileMeta, kExtra>;

// Two consumer warpgroups taking a block's tiles in turn (ping-pong): by every thread of the one
// that has issued its tile's last products, whose stages end before counter `next`, where the
// other's next tile starts; the other waits on order[its group] and reads the counter.
__device__ __forceinline__ void hand_over_turn(int* next_chunk, uint64_t* order, int group, int next) {
  if (threadIdx.x % kGroupThreads == 0) *next_chunk = next;
  __syncwarp();
  if (threadIdx.x % 32 == 0) tma::arrive(&order[1 - group]);
}

// A consumer warpgroup's next tile (its `mine`-th, 0, 1, ...), at stage counter c: where two take
// tiles in turn (kTurns), first the wait until the other's tile before has issued its products,
// and c from its hand-over (warpgroup 0's first tile starts at c); then the wait for the tile's
// first stage, and its header.
template <bool kTurns, int kStages, class Meta>
__device__ __forceinline__ Meta next_header(uint64_t* full, const Meta* headers, uint64_t* order,
                                            const int* next_chunk, int group, int mine, int& c) {
  if (kTurns && (group == 1 || mine > 0)) {
    tma::wait(&order[group], (group == 1 ? mine : mine - 1) & 1);
    c = *next_chunk;
  }
  const int first = c % kStages;
  tma::wait(&full[first], (c / kStages) & 1);
  return headers[first];
}

// A named barrier of one consumer warpgroup (ids 3 and 4: zero_slice_past has 1 and 2), by
// immediate id (ptxas counts a register id as all 16).
__device__ __forceinline__ void group_barrier(int group) {
  if (group == 0)
    asm volatile("bar.sync 3, %0;\n" ::"n"(kGroupThreads));
  else
    asm volatile("bar.sync 4, %0;\n" ::"n"(kGroupThreads));
}

// The epilogue by TMA stores: the warpgroup lays out its products (rows 16 warp + grp (+ 8),
// columns 8 j + 2 tig, + 1) as bf16 in its staging, as wgmma::Panels<BN> (the 128-byte swizzle:
// a warp's pairs fall in 32 distinct banks), and its first thread stores one 64-column box per
// panel that starts before the tile's last column: whole 128-byte rows, clipped by the map at the
// group's end and the view's last row. A staging of the warpgroup's own (kInRing false) is
// rewritten only after the previous tile's stores have read it. One in the ring (the W chunk of
// the tile's last stage) is fresh for each tile, and is written once all kConsumers threads of the
// block have finished reading that stage: each warp's wgmma wait covers its own share only, and
// a dX tail's slices interleave the two warpgroups' rows. r0: the first of the warpgroup's 64 rows.
template <int BN, bool kInRing, int kConsumers>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], unsigned char* staging, const AlgTmaArgs& p,
                                          const TileMeta& m, int r0, int wcol, int group, int tid, int gwarp,
                                          int grp, int tig) {
  using P = wgmma::Panels<BN>;
  if constexpr (kInRing) {
    stage_barrier<kConsumers>(1);
  } else {
    if (tid == 0) bulk_wait_read();
    group_barrier(group);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * gwarp + grp + 8 * half;
#pragma unroll
    for (int jj = 0; jj < BN / 8; ++jj) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * jj + 2 * half], acc[4 * jj + 2 * half + 1]);
      *reinterpret_cast<__nv_bfloat162*>(staging + P::offset(i, 8 * jj + 2 * tig)) = v;
    }
  }
  fence_proxy_async_shared();  // the copy engine reads them next
  group_barrier(group);
  if (tid == 0) {
    const int g = m.t.col0 / p.out_group_cols, c0 = m.t.col0 - g * p.out_group_cols + wcol;
    const int cls = r0 % p.row_stride, i0 = r0 / p.row_stride;
#pragma unroll
    for (int pn = 0; pn < BN / 64; ++pn) {
      if (wcol + 64 * pn >= m.t.ncols) break;
      if (p.row_stride > 1)
        tma::store_4d(&p.y, staging + pn * P::kPanelBytes, c0 + 64 * pn, g, cls, i0);
      else
        tma::store_3d(&p.y, staging + pn * P::kPanelBytes, c0 + 64 * pn, g, r0);
    }
    tma::bulk_commit();
  }
}

// The epilogue from registers, for rows the store map cannot bound: a warpgroup's products (rows
// 16 warp + grp (+ 8) of its g_rows, r0, r0 + stride, ...; columns c0 + 8 j + 2 tig, + 1 below
// `limit`) as bf16 pairs at output column col0 + that column, added to the old values when
// accumulating.
template <int BN>
__device__ __forceinline__ void store_from_registers(const float (&acc)[BN / 2], const AlgTmaArgs& p, int r0,
                                                     int g_rows, int col0, int c0, int limit, int gwarp, int grp,
                                                     int tig) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * gwarp + grp + 8 * half;
    if (i >= g_rows) continue;
    uint16_t* out = p.c + static_cast<int64_t>(r0 + p.row_stride * i) * p.ldc + col0;
#pragma unroll
    for (int jj = 0; jj < BN / 8; ++jj) {
      const int col = c0 + 8 * jj + 2 * tig;
      if (col >= limit) continue;
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

template <int BN, int kStages, bool kTransW, int kGroups, bool kCoop, bool kTall, bool kEagerRelease, int kExtra,
          bool kOneStaging, bool kRingStaging>
__global__ void __launch_bounds__(kGroups * kGroupThreads + 32, 1)
    algproj_tma_kernel(const __grid_constant__ AlgTmaArgs p) {
  static_assert(!kTall || (kGroups == 2 && !kCoop), "a tall tile is two warpgroups' rows");
  constexpr int BT = (kCoop ? kGroups : 1) * BN;
  constexpr bool kEvery = kCoop || kTall;  // every warpgroup computes every tile
  constexpr int kHalves = kTall ? 2 : 1;
  // kEagerRelease (AlgTmaConfig::releases_at_once): each stage is released as soon as its
  // products are done, so that the producer refills it a chunk earlier; otherwise a warpgroup
  // keeps one chunk's products in flight and releases the stage before (docs/decisions.md).
  static_assert(!kOneStaging || (kGroups == 2 && !kCoop && !kTall), "one staging: two warpgroups in turn");
  // The staging in the ring: the W chunk of a tile's last stage, where each warpgroup's columns
  // (its own panels, or its own rows for dX) are read by it alone.
  static_assert(!kRingStaging || (kCoop && !kEagerRelease && kExtra == 0), "ring staging: cooperative tiles");
  using L = RowLayout<BN, kStages, kGroups, kCoop, kTall, kExtra, kOneStaging, kRingStaging>;
  static_assert(!kRingStaging || L::kBBytes >= kGroups * BN * 128, "each warpgroup's staging fits its W columns");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const typename L::Ring ring(smem_raw);
  uint64_t* full = ring.full();
  uint64_t* empty = ring.empty();
  TileMeta* headers = ring.headers();
  if constexpr (kOneStaging)
    if (threadIdx.x == 0) tma::init(ring.staging_free(), 1);  // fenced by ring.init
  if (threadIdx.x == 0) ring.init(kEvery ? kGroups : 1);  // the warpgroups that compute on a stage
  ring.clear_zero();
  __syncthreads();
  // A programmatic dependent (block_launch.cuh): the set-up above and the producer's first plan
  // batch run while the kernel before finishes; x, W and c are touched only after the wait.
  pdl_trigger();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == kGroups * kGroupThreads / 32) {  // the producer warp: lane 0 issues, all load metadata
    const int s_rows = p.row_stride;
    int c = 0;
    const auto take = [&](bool first, const TileMeta& m) { return take_stage<kStages>(empty, headers, c, first, m); };
    walk_tiles(p, lane, [&](const TileMeta& m) {
      const ops::AlgRowTile& t = m.t;
      const int cls = m.r_first % s_rows, i0 = m.r_first / s_rows;
      // W boxes past the tile's columns are not loaded (a group narrower than the tile, or its
      // last tile): forward, 64-column panels; dX, a warpgroup's BN rows. The products over the
      // stale bytes there land in columns the epilogue does not store.
      const int w_boxes = kTransW ? (t.ncols + BN - 1) / BN : (t.ncols + 63) / 64;
      constexpr uint32_t kBoxBytes = kTransW ? BN * 128 : L::B::kPanelBytes;
      constexpr uint32_t kBoxSliceBytes = kTransW ? BN * kSlice * 2 : kSlice * 128;
      // A tall tile's second 64 rows, where it has them (they follow the first in the view).
      const int halves = kTall && t.row_count > kAlgTmaRows ? 2 : 1;
      // A stage's boxes at reduction column k: the A box of each half (a_at, a_half bytes apart,
      // from xm: x or its 16-deep slices) and the W boxes (w_at, `box` bytes apart, from wm).
      const auto load_boxes = [&](int stage, unsigned char* a_at, uint32_t a_half, const CUtensorMap* xm,
                                  unsigned char* w_at, uint32_t box, const CUtensorMap* wm, int k) {
        for (int h = 0; h < halves; ++h) {
          if (s_rows > 1)
            tma::load_3d(a_at + h * a_half, xm, &full[stage], k, cls, i0 + kAlgTmaRows * h);
          else
            tma::load_2d(a_at + h * a_half, xm, &full[stage], k, m.r_first + kAlgTmaRows * h);
        }
        if constexpr (kTransW) {
#pragma unroll
          for (int g = 0; g < BT / BN; ++g)
            if (g < w_boxes) tma::load_2d(w_at + g * box, wm, &full[stage], k, t.col0 + BN * g);
        } else {
#pragma unroll
          for (int pn = 0; pn < BT / 64; ++pn)
            if (pn < w_boxes) tma::load_2d(w_at + pn * box, wm, &full[stage], t.col0 + 64 * pn, k);
        }
      };
      const int c_first = c;
      for (int sg = 0; sg < t.seg_count; ++sg) {
        const ops::AlgSegment seg = tile_segment(m, p, sg);
        for (int k0 = seg.k0, len; k0 < seg.k0 + seg.len; k0 += len, ++c) {
          len = kExtra == 0 ? kAlgTmaChunk : tma_chunk_len(seg.k0 + seg.len - k0, kExtra);
          const int valid = min(kAlgTmaChunk, seg.k0 + seg.len - k0);
          const int stage = take(c == c_first, m);
          unsigned char* a = ring.a(stage);
          unsigned char* b = ring.b(stage);
#ifdef QUIVER_TMA_ABLATE_LOADS
          if (true) {
            tma::arrive(&full[stage]);
          } else
#endif
              if (valid == kAlgTmaChunk) {
            const int extra = (len - kAlgTmaChunk) / kSlice;  // slices after the whole chunk
            tma::arrive_expect(&full[stage], halves * L::A::kBytes + w_boxes * kBoxBytes +
                                                 extra * (halves * L::kXASliceBytes + w_boxes * kBoxSliceBytes));
            load_boxes(stage, a, L::A::kBytes, &p.x, b, kBoxBytes, &p.w, k0);
            for (int j = 0; j < extra; ++j)  // (kExtra > 0) the extra slices, laid out as a tail's
              load_boxes(stage, ring.xa(stage, j), L::kXASliceBytes, &p.x16, ring.xb(stage, j), kBoxSliceBytes,
                         &p.w16, k0 + kAlgTmaChunk + kSlice * j);
          } else {  // the tail, slice by slice; forward, W rows k .. k + 15 where a whole chunk would put them
            const int n = tail_slices(valid);
            tma::arrive_expect(&full[stage], n * (halves * kAlgTmaRows * kSlice * 2 + w_boxes * kBoxSliceBytes));
            for (int sl = 0; sl < n; ++sl)
              load_boxes(stage, a_slice(a, sl), L::A::kBytes, &p.x16,
                         kTransW ? w_slice_t<BT>(b, sl) : b + sl * kBoxSliceBytes, kTransW ? kBoxSliceBytes : kBoxBytes,
                         &p.w16, k0 + kSlice * sl);
          }
        }
      }
      if (c == c_first) {  // no chunks: a stage with the header alone
        tma::arrive(&full[take(true, m)]);
        ++c;
      }
    });
    if (lane == 0) {  // the end: a header with no rows
      tma::arrive(&full[take(true, TileMeta{})]);
    }
    return;
  }

  pdl_wait();  // before the consumers write c
  const int group = warp / 4, gwarp = warp % 4, tid = threadIdx.x % kGroupThreads;
  const int grp = lane / 4, tig = lane % 4;
  const int wcol = kCoop ? BN * group : 0;         // this warpgroup's first column of a tile
  const int row0 = kTall ? kAlgTmaRows * group : 0;  // and its first row
  constexpr bool kTurns = !kEvery && kGroups > 1;  // two warpgroups taking the block's tiles in turn
  uint64_t* order = ring.order();
  int* next_chunk = ring.next_chunk();
  // kRingStaging: the stage whose W chunk holds this warpgroup's last tile's products until their
  // stores have read them (-1: none). It is released once the next tile's second chunk has been
  // waited for (the stores have long finished reading by then), or at that tile's end.
  int held = -1;
  const auto release_held = [&] {
    if (tid == 0) bulk_wait_read();
    group_barrier(group);
    if (lane == 0) tma::arrive(&empty[held]);
    held = -1;
  };
  float acc[BN / 2];
  for (int c = 0, mine = 0;; ++mine) {
    const TileMeta m = next_header<kTurns, kStages>(full, headers, order, next_chunk, group, mine, c);
    const int first = c % kStages;
    if (m.t.row_count == 0) {  // the end: the other warpgroup reads the same header next
      if constexpr (kTurns) hand_over_turn(next_chunk, order, group, c);
      break;
    }
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] = 0.0f;
    int pending = first;  // the stage whose products are still in flight (or the header's)
    for (int sg = 0; sg < m.t.seg_count; ++sg) {
      const ops::AlgSegment seg = tile_segment(m, p, sg);
      for (int k0 = seg.k0, len; k0 < seg.k0 + seg.len; k0 += len, ++c) {
        len = kExtra == 0 ? kAlgTmaChunk : tma_chunk_len(seg.k0 + seg.len - k0, kExtra);
        const int stage = c % kStages;
        tma::wait(&full[stage], (c / kStages) & 1);
        const int valid = min(kAlgTmaChunk, seg.k0 + seg.len - k0);
        unsigned char* a = ring.a(stage);
        unsigned char* b = ring.b(stage);
        if (valid % kSlice != 0) {
          if constexpr (kEvery)
            zero_slice_past<BT, kTransW, kGroups * kGroupThreads, kHalves>(a, b, valid, threadIdx.x, 1);
          else
            zero_slice_past<BT, kTransW, kGroupThreads>(a, b, valid, tid, kGroups == 1 ? 1 : 1 + group);
        }
        // A tall tile's warpgroup without rows (a tile of 64 rows or fewer) computes on the stale
        // half and stores nothing: the stages' barriers count both warpgroups.
        chunk_products<BN, BT, kTransW, kExtra, L::kXBytes>(
            acc, a + group * (kHalves - 1) * L::A::kBytes, b, wcol, valid, ring.zero(),
            ring.xa(stage, 0) + group * (kHalves - 1) * L::kXASliceBytes, ring.xb(stage, 0),
            (len - kAlgTmaChunk) / kSlice);
        wgmma::commit();
        if constexpr (kEagerRelease) {  // this chunk's products are done: its stage is free
          wgmma::wait<0>();
          if (lane == 0) tma::arrive(&empty[stage]);
        } else {
          // The previous chunk's products are done: its stage is free once every warp's share of
          // the products has read it (wait_group completes the executing warp's).
          wgmma::wait<1>();
          if (pending != stage) {
            if (lane == 0) tma::arrive(&empty[pending]);
            if (kRingStaging && held >= 0) release_held();
          }
        }
        pending = stage;
      }
    }
    if (m.t.seg_count == 0) ++c;  // the stage that carried the header alone
    if constexpr (kTurns) hand_over_turn(next_chunk, order, group, c);  // the next tile starts at stage c
    wgmma::wait<0>();
    // The warpgroup's rows of the tile: r0, r0 + stride, ... (g_rows of them). Rows the map's
    // clipping bounds (all 64, or the view's last ones; the columns end with the tile or the
    // group) leave by TMA stores; others (accumulating, unequal groups, a short tile within a
    // class's rows) are stored from registers.
    const int g_rows = min(kAlgTmaRows, m.t.row_count - row0), r0 = m.r_first + p.row_stride * row0;
    const bool staged = p.out_group_cols > 0 && g_rows > 0 &&
                        (g_rows == kAlgTmaRows || r0 / p.row_stride + g_rows == p.view_rows);
    if constexpr (kRingStaging)
      if (held >= 0) release_held();  // a tile of one chunk
    // The stage still held: the tile's last (deferred release), or the one that carried its header
    // alone (a tile without segments); with the staging in the ring, a staged tile keeps it.
    const bool hold = kRingStaging && staged;
    if ((!kEagerRelease || m.t.seg_count == 0) && !hold && lane == 0) tma::arrive(&empty[pending]);

    if (g_rows <= 0) continue;
#ifdef QUIVER_TMA_ABLATE_STORES
    if (acc[0] == 12345.0f) p.c[0] = 1;  // the products stay live
    if (hold && lane == 0) tma::arrive(&empty[pending]);
    continue;
#endif
    if constexpr (kOneStaging) {
      // One staging for both: the block's tiles' epilogues take it in tile order (this one is
      // the k-th), each once the one before has had its stores read it.
      const int k = 2 * mine + group;
      if (tid == 0 && k > 0) tma::wait(ring.staging_free(), (k - 1) & 1);
      if (staged)
        store_tile<BN, false, kGroupThreads>(acc, ring.staging(), p, m, r0, wcol, group, tid, gwarp, grp, tig);
      if (tid == 0) {
        if (staged) bulk_wait_read();
        tma::arrive(ring.staging_free());
      }
      if (staged) continue;
    }
    if (staged) {
      if constexpr (kRingStaging) {  // in the stage just consumed, held until the stores have read it
        store_tile<BN, true, kGroups * kGroupThreads>(acc, ring.b(pending) + group * BN * 128, p, m, r0, wcol, group,
                                                      tid, gwarp, grp, tig);
        held = pending;
      } else {
        store_tile<BN, false, kGroupThreads>(acc, ring.staging() + group * BN * 128, p, m, r0, wcol, group, tid,
                                             gwarp, grp, tig);
      }
      continue;
    }
    store_from_registers<BN>(acc, p, r0, g_rows, m.t.col0, wcol, m.t.ncols, gwarp, grp, tig);
  }
  if (tid == 0) bulk_wait();  // the warpgroup's last stores are complete
}

// ---- Two-group tall tiles (forward) --------------------------------------------------------
// The tiles of a two-group plan (ops::plan_two_group_pass): up to 128 rows of one type, two
// warpgroups one above the other as in a tall tile, × two adjacent output groups of at most BN
// columns each. A tile's segments are, by position, the typed block (both groups), the left
// group's own block and the right group's (length 0 where it adds nothing), each a whole number
// of 64-deep chunks. A chunk's stage holds both 64-row A chunks and two W boxes of one 64-column
// panel: from the left group's first column and from the right group's; a chunk of an own block
// loads only its group's. Per chunk each warpgroup issues four k16 steps (m64nBNk16) into the
// left group's accumulators and four into the right group's, a step whose box the chunk does not
// have reading zero operands, so that every chunk issues the same instructions (ptxas serializes
// wgmma on divergent paths). The typed block's rows of x are thus received once for two groups:
// at Qwen3-30B-A3B's expert (Q_16, blocks of 128, groups of 48) a tile receives 160 KB, where the
// tall 128 x 64 tiles receive 2 × 96 for the same outputs. Six stages hold a whole tile of that
// shape, so a block with one tile has every load in flight at once. The epilogue lays out each
// group's products in a 64-column panel of the warpgroup's own staging and stores one box per
// group, clipped by the map at the group's end; tiles the map cannot bound are stored from
// registers, as in the row pass.
template <int kStages>
using TwoGroupLayout = TmaLayout<128, kStages, 2 * 2 * wgmma::Panels<64>::kPanelBytes, 2>;

template <int BN, int kStages>
__global__ void __launch_bounds__(2 * kGroupThreads + 32, 1)
    algproj_tma_two_group_kernel(const __grid_constant__ AlgTmaArgs p) {
  static_assert(BN % 16 == 0 && BN <= 64, "a group's columns are one 64-column panel");
  using P = wgmma::Panels<64>;  // a W box, and a group's staging
  using L = TwoGroupLayout<kStages>;
  static_assert(L::kBBytes == 2 * P::kPanelBytes, "a stage holds two W boxes");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const typename L::Ring ring(smem_raw);
  uint64_t* full = ring.full();
  uint64_t* empty = ring.empty();
  TileMeta* headers = ring.headers();
  if (threadIdx.x == 0) ring.init(2);  // both warpgroups read every stage
  ring.clear_zero();
  __syncthreads();
  pdl_trigger();  // a programmatic dependent (block_launch.cuh), as the row pass
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kSegs = 3;

  if (warp == 2 * kGroupThreads / 32) {  // the producer warp: lane 0 issues, all load metadata
    const int s_rows = p.row_stride;
    int c = 0;
    const auto take = [&](bool first, const TileMeta& m) { return take_stage<kStages>(empty, headers, c, first, m); };
    walk_tiles(p, lane, [&](const TileMeta& m) {
      const ops::AlgRowTile& t = m.t;
      const int cls = m.r_first % s_rows, i0 = m.r_first / s_rows;
      const int halves = t.row_count > kAlgTmaRows ? 2 : 1;
      const int c_first = c;
#pragma unroll
      for (int sg = 0; sg < kSegs; ++sg) {
        const ops::AlgSegment seg = tile_segment(m, p, sg);
        for (int k0 = seg.k0; k0 < seg.k0 + seg.len; k0 += kAlgTmaChunk, ++c) {
          const int stage = take(c == c_first, m);
#ifdef QUIVER_TMA_ABLATE_LOADS
          tma::arrive(&full[stage]);
          continue;
#endif
          tma::arrive_expect(&full[stage], halves * L::A::kBytes + (sg == 0 ? 2 : 1) * P::kPanelBytes);
          for (int h = 0; h < halves; ++h) {
            if (s_rows > 1)
              tma::load_3d(ring.a(stage) + h * L::A::kBytes, &p.x, &full[stage], k0, cls, i0 + kAlgTmaRows * h);
            else
              tma::load_2d(ring.a(stage) + h * L::A::kBytes, &p.x, &full[stage], k0, m.r_first + kAlgTmaRows * h);
          }
          if (sg != 2) tma::load_2d(ring.b(stage), &p.w, &full[stage], t.col0, k0);
          if (sg != 1) tma::load_2d(ring.b(stage) + P::kPanelBytes, &p.w, &full[stage], t.col0 + t.ncols / 2, k0);
        }
      }
      if (c == c_first) {  // no chunks: a stage with the header alone
        tma::arrive(&full[take(true, m)]);
        ++c;
      }
    });
    if (lane == 0) tma::arrive(&full[take(true, TileMeta{})]);  // the end: a header with no rows
    return;
  }

  pdl_wait();  // before the consumers write c
  const int group = warp / 4, gwarp = warp % 4, tid = threadIdx.x % kGroupThreads;
  const int grp = lane / 4, tig = lane % 4;
  const int row0 = kAlgTmaRows * group;
  const uint64_t za = zero_operand<2 * kSlice>(ring.zero()), zb = zero_operand<128>(ring.zero());
  float acc_l[BN / 2], acc_r[BN / 2];  // the left group's products, the right group's
  for (int c = 0, mine = 0;; ++mine) {
    const TileMeta m = next_header<false, kStages>(full, headers, ring.order(), ring.next_chunk(), group, mine, c);
    if (m.t.row_count == 0) break;  // the end
    const int c_first = c;
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc_l[e] = acc_r[e] = 0.0f;
    int pending = c % kStages;  // the stage whose products are still in flight (or the header's)
#pragma unroll
    for (int sg = 0; sg < kSegs; ++sg) {
      const ops::AlgSegment seg = tile_segment(m, p, sg);
      const bool left = sg != 2, right = sg != 1;
      for (int k0 = seg.k0; k0 < seg.k0 + seg.len; k0 += kAlgTmaChunk, ++c) {
        const int stage = c % kStages;
        tma::wait(&full[stage], (c / kStages) & 1);
        unsigned char* a = ring.a(stage) + group * L::A::kBytes;  // a warpgroup without rows reads stale bytes
        unsigned char* b = ring.b(stage);
        uint64_t dal[4], dbl[4], dar[4], dbr[4];  // selected before the fence
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint64_t da = L::A::k_major(a, kSlice * kk);
          dal[kk] = left ? da : za;
          dbl[kk] = left ? P::mn_major(b, kSlice * kk) : zb;
          dar[kk] = right ? da : za;
          dbr[kk] = right ? P::mn_major(b + P::kPanelBytes, kSlice * kk) : zb;
        }
        wgmma::fence();
#ifndef QUIVER_TMA_ABLATE_PRODUCTS
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma::mma<BN, 0, 1>(acc_l, dal[kk], dbl[kk], true);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma::mma<BN, 0, 1>(acc_r, dar[kk], dbr[kk], true);
#endif
        wgmma::commit();
        wgmma::wait<1>();  // the previous chunk's products are done (this warp's share)
        if (pending != stage && lane == 0) tma::arrive(&empty[pending]);
        pending = stage;
      }
    }
    if (c == c_first) ++c;  // the stage that carried the header alone
    wgmma::wait<0>();
    if (lane == 0) tma::arrive(&empty[pending]);  // the tile's last stage

    const int g_rows = min(kAlgTmaRows, m.t.row_count - row0), r0 = m.r_first + p.row_stride * row0;
    if (g_rows <= 0) continue;
    const int half = m.t.ncols / 2;
    const bool staged =
        p.out_group_cols > 0 && (g_rows == kAlgTmaRows || r0 / p.row_stride + g_rows == p.view_rows);
#ifdef QUIVER_TMA_ABLATE_STORES
    if (acc_l[0] + acc_r[0] == 12345.0f) p.c[0] = 1;  // the products stay live
    continue;
#endif
    if (staged) {
      unsigned char* staging = ring.staging() + group * 2 * P::kPanelBytes;  // this warpgroup's two panels
      if (tid == 0) bulk_wait_read();  // its previous tile's stores have read them
      group_barrier(group);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * gwarp + grp + 8 * hf;
#pragma unroll
        for (int jj = 0; jj < BN / 8; ++jj) {
          const uint32_t o = P::offset(i, 8 * jj + 2 * tig);
          *reinterpret_cast<__nv_bfloat162*>(staging + o) =
              __floats2bfloat162_rn(acc_l[4 * jj + 2 * hf], acc_l[4 * jj + 2 * hf + 1]);
          *reinterpret_cast<__nv_bfloat162*>(staging + P::kPanelBytes + o) =
              __floats2bfloat162_rn(acc_r[4 * jj + 2 * hf], acc_r[4 * jj + 2 * hf + 1]);
        }
      }
      fence_proxy_async_shared();  // the copy engine reads them next
      group_barrier(group);
      if (tid == 0) {
        const int g = m.t.col0 / p.out_group_cols, cls = r0 % p.row_stride, i0 = r0 / p.row_stride;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (p.row_stride > 1)
            tma::store_4d(&p.y, staging + h * P::kPanelBytes, 0, g + h, cls, i0);
          else
            tma::store_3d(&p.y, staging + h * P::kPanelBytes, 0, g + h, r0);
        }
        tma::bulk_commit();
      }
      continue;
    }
    // Each group's columns from registers.
    store_from_registers<BN>(acc_l, p, r0, g_rows, m.t.col0, 0, half, gwarp, grp, tig);
    store_from_registers<BN>(acc_r, p, r0, g_rows, m.t.col0 + half, 0, half, gwarp, grp, tig);
  }
  if (tid == 0) bulk_wait();  // the warpgroup's last stores are complete
}

// ---- Long dX tiles split over a cluster -----------------------------------------------------
// The split tiles of a cluster plan (ops::plan_cluster_split; launch_algproj_tma_cluster). Block
// blockIdx.x works on tile blockIdx.x / parts as rank r of its cluster of `parts`, over the chunks
// cluster_piece(chunks, parts, r) of the tile's segments (whole 64-deep chunks, walked in order).
// Its producer warp loads each chunk's dY box and W box as the row pass's dX does, into a ring
// that its one warpgroup consumes as a one-warpgroup row pass does (four wgmma m64nBNk16 per
// chunk, one chunk's products in flight). Then the warpgroup lays out its fp32 sums over the ring
// (every load has landed: each was waited for), the cluster syncs, and each block adds the
// blocks' sums in rank order for every parts-th 8-column piece of the tile, rounds once (adding
// the old value when accumulating) and stores bf16 pairs; a second sync keeps every block's
// shared memory until the others have read it.
template <int BN, int kStages>
__global__ void __launch_bounds__(kGroupThreads + 32, 1)
    algproj_tma_cluster_kernel(const __grid_constant__ AlgTmaArgs p, int parts) {
  using L = TmaLayout<BN, kStages>;
  constexpr int kPitch = BN + 4;  // the sums' row pitch in floats: 16-byte rows, banks staggered
  static_assert(kAlgTmaRows * kPitch * sizeof(float) <= kStages * L::kStageBytes, "the sums fit over the ring");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const typename L::Ring ring(smem_raw);
  uint64_t* full = ring.full();
  uint64_t* empty = ring.empty();
  if (threadIdx.x == 0) ring.init();  // one warpgroup reads each stage
  ring.clear_zero();
  __syncthreads();
  pdl_trigger();  // a programmatic dependent (block_launch.cuh), as the row pass
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const ops::AlgRowTile t = p.tiles[blockIdx.x / parts];
  int chunks = 0;
  for (int s = 0; s < t.seg_count; ++s) chunks += p.segments[t.seg_begin + s].len / kAlgTmaChunk;
  const ops::AlgChunkRange piece = ops::cluster_piece(chunks, parts, rank);
  const int r_first = p.rows[t.row_begin];
  pdl_wait();  // dY and W are read, and dX written, once the kernel before has finished
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sums = reinterpret_cast<float*>(ring.a(0));  // [64][kPitch], over the ring at the end

  if (warp == kGroupThreads / 32) {  // the producer warp: lane 0 issues
    if (lane == 0) {
      const int cls = r_first % p.row_stride, i0 = r_first / p.row_stride;
      for (int s = 0, c = 0, n = 0; s < t.seg_count; ++s) {
        const ops::AlgSegment seg = p.segments[t.seg_begin + s];
        for (int k = seg.k0; k < seg.k0 + seg.len; k += kAlgTmaChunk, ++c) {
          if (c < piece.begin || c >= piece.end) continue;
          const int stage = n % kStages;
          if (n >= kStages) tma::wait(&empty[stage], ((n / kStages) & 1) ^ 1);
          tma::arrive_expect(&full[stage], L::A::kBytes + L::kBBytes);
          if (p.row_stride > 1)
            tma::load_3d(ring.a(stage), &p.x, &full[stage], k, cls, i0);
          else
            tma::load_2d(ring.a(stage), &p.x, &full[stage], k, r_first);
          tma::load_2d(ring.b(stage), &p.w, &full[stage], k, t.col0);  // W rows col0 .. col0 + BN - 1 (the map's box)
          ++n;
        }
      }
    }
  } else {  // the consumer warpgroup
    const int grp = lane / 4, tig = lane % 4;
    float acc[BN / 2];
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] = 0.0f;
    for (int n = 0; n < piece.end - piece.begin; ++n) {
      const int stage = n % kStages;
      tma::wait(&full[stage], (n / kStages) & 1);
      chunk_products<BN, BN, true>(acc, ring.a(stage), ring.b(stage), 0, kAlgTmaChunk, ring.zero());
      wgmma::commit();
      wgmma::wait<1>();  // the previous chunk's products are done (this warp's share): its stage is free
      if (n > 0 && lane == 0) tma::arrive(&empty[(n - 1) % kStages]);
    }
    wgmma::wait<0>();
    group_barrier(0);  // every warp's products have read the ring
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * warp + grp + 8 * half;
#pragma unroll
      for (int jj = 0; jj < BN / 8; ++jj)
        *reinterpret_cast<float2*>(sums + i * kPitch + 8 * jj + 2 * tig) =
            make_float2(acc[4 * jj + 2 * half], acc[4 * jj + 2 * half + 1]);
    }
  }
  cluster.sync();  // every block's sums, visible to the cluster
  if (warp < kGroupThreads / 32) {
    constexpr int kPieces = BN / 8;  // 8-column pieces of a row
    for (int v = rank * kGroupThreads + static_cast<int>(threadIdx.x); v < kAlgTmaRows * kPieces;
         v += parts * kGroupThreads) {
      const int i = v / kPieces, c8 = v % kPieces * 8;
      if (i >= t.row_count || c8 >= t.ncols) continue;
      float sum[8] = {};
      for (int b = 0; b < parts; ++b) {  // in rank order
        const float* src = cluster.map_shared_rank(sums, b) + i * kPitch + c8;
        const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
        sum[0] += lo.x;
        sum[1] += lo.y;
        sum[2] += lo.z;
        sum[3] += lo.w;
        sum[4] += hi.x;
        sum[5] += hi.y;
        sum[6] += hi.z;
        sum[7] += hi.w;
      }
      uint16_t* out = p.c + static_cast<int64_t>(p.rows[t.row_begin + i]) * p.ldc + t.col0 + c8;
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        if (c8 + j >= t.ncols) break;
        float v0 = sum[j], v1 = sum[j + 1];
        auto* dst = reinterpret_cast<__nv_bfloat162*>(out + j);
        if (p.accumulate) {
          const float2 old = __bfloat1622float2(*dst);
          v0 += old.x;
          v1 += old.y;
        }
        *dst = __floats2bfloat162_rn(v0, v1);
      }
    }
  }
  cluster.sync();  // no block leaves while another reads its sums
}

// ---- Weight pass ----------------------------------------------------------------------------
// dW tiles walked as the row pass walks its tiles: one block per tile, or persistent (the blocks
// that fit at once, each walking every gridDim-th tile; with two consumer warpgroups taking the
// block's tiles in turn, in the row pass's ping-pong order), so that the producer's loads run
// ahead into the next tile while a tile's products finish and its fp32 outputs are stored (most
// dW tiles are one chunk: a type's 64 rows of an off-diagonal block). The producer warp's lane 0
// walks the tiles' chunks; each stage carries a header (WeightMeta). A chunk of `count` < 64 rows
// has its boxes' rows from count on (the progression's next rows, of other pieces) zeroed first.
template <int BN>
__device__ __forceinline__ void zero_rows_past(unsigned char* a, unsigned char* b, int count, int tid, int group) {
  using A = wgmma::Panels<kAlgTmaChunk>;
  using B = wgmma::Panels<BN>;
  const int rows = ops::kAlgTmaChunkRows - count;
  for (int e = tid; e < rows * (kAlgTmaChunk / 8); e += kGroupThreads)
    *reinterpret_cast<uint4*>(a + A::offset(count + e / (kAlgTmaChunk / 8), e % (kAlgTmaChunk / 8) * 8)) =
        make_uint4(0, 0, 0, 0);
  for (int e = tid; e < rows * (BN / 8); e += kGroupThreads)
    *reinterpret_cast<uint4*>(b + B::offset(count + e / (BN / 8), e % (BN / 8) * 8)) = make_uint4(0, 0, 0, 0);
  fence_proxy_async_shared();  // the tensor cores read them next
  stage_barrier<kGroupThreads>(1 + group);  // this warpgroup's threads only
}

template <int BN, int kStages, int kGroups>
__global__ void __launch_bounds__(kGroups * kGroupThreads + 32, 1)
    algproj_tma_weights_kernel(const __grid_constant__ AlgTmaWeightArgs p) {
  static_assert(ops::kAlgTmaChunkRows == 64, "a chunk's rows are one box of 64");
  // A: 64 rows × 64 K columns; B: 64 rows × BN N columns.
  using L = TmaLayout<BN, kStages, 0, 1, WeightMeta>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const typename L::Ring ring(smem_raw);
  uint64_t* full = ring.full();
  uint64_t* empty = ring.empty();
  WeightMeta* headers = ring.headers();
  if (threadIdx.x == 0) ring.init();  // each stage is read by one warpgroup
  __syncthreads();
  pdl_trigger();  // a programmatic dependent (block_launch.cuh): the plan before, x, dY and dW after
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == kGroups * kGroupThreads / 32) {  // the producer
    if (lane != 0) return;
    int c = 0;
    const auto take = [&] {  // stage c's turn: wait until its last use was consumed
      const int stage = c % kStages;
      if (c >= kStages) tma::wait(&empty[stage], ((c / kStages) & 1) ^ 1);
      return stage;
    };
    const auto header_alone = [&](const WeightMeta& h) {  // a stage that carries a header and no loads
      const int stage = take();
      headers[stage] = h;
      tma::arrive(&full[stage]);
      ++c;
    };
    // The next tile's record and first chunk are loaded a tile ahead, and a tile's next chunk one
    // chunk ahead, so that the walk does not wait on a chain of plan loads per tile.
    struct Next {
      ops::AlgWeightTile t;
      int c_begin, chunks;
      ops::AlgWeightChunk ch;
    };
    const auto fetch = [&](int tile) {
      Next n{};
      if (tile < p.num_tiles) {
        n.t = p.tiles[tile];
        n.c_begin = p.tile_begin[tile];
        n.chunks = p.tile_begin[tile + 1] - n.c_begin;
        if (n.chunks > 0) n.ch = p.chunks[n.c_begin];
      }
      return n;
    };
    Next next = fetch(blockIdx.x);
    for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
      const Next cur = next;
      next = fetch(tile + gridDim.x);
      WeightMeta h;
      h.t = cur.t;
      h.chunks = cur.chunks;
      if (h.chunks == 0) {  // no rows: a stage with the header alone (the tile's output is zero)
        h.count = 0;
        header_alone(h);
        continue;
      }
      ops::AlgWeightChunk ch = cur.ch;
      for (int i = 0; i < h.chunks; ++i, ++c) {
        const ops::AlgWeightChunk ch_next = i + 1 < h.chunks ? p.chunks[cur.c_begin + i + 1] : ch;
        const int stage = take();
        h.count = ch.count;
        headers[stage] = h;
        tma::arrive_expect(&full[stage], L::kStageBytes);
        if (ch.strided) {
          const int cls = ch.row0 % p.stride, i0 = ch.row0 / p.stride;
          tma::load_3d(ring.a(stage), &p.xs, &full[stage], h.t.k0, cls, i0);
#pragma unroll
          for (int pn = 0; pn < BN / 64; ++pn)
            tma::load_3d(ring.b(stage) + pn * L::B::kPanelBytes, &p.dys, &full[stage], h.t.col0 + 64 * pn, cls, i0);
        } else {
          tma::load_2d(ring.a(stage), &p.x, &full[stage], h.t.k0, ch.row0);
#pragma unroll
          for (int pn = 0; pn < BN / 64; ++pn)
            tma::load_2d(ring.b(stage) + pn * L::B::kPanelBytes, &p.dy, &full[stage], h.t.col0 + 64 * pn, ch.row0);
        }
        ch = ch_next;
      }
    }
    WeightMeta end{};  // the end: a header with chunks -1
    end.chunks = -1;
    header_alone(end);
    return;
  }

  const int group = warp / 4, gwarp = warp % 4, tid = threadIdx.x % kGroupThreads;
  const int grp = lane / 4, tig = lane % 4;
  constexpr bool kTurns = kGroups > 1;
  uint64_t* order = ring.order();
  int* next_chunk = ring.next_chunk();
  float acc[BN / 2];
  for (int c = 0, mine = 0;; ++mine) {
    const WeightMeta h = next_header<kTurns, kStages>(full, headers, order, next_chunk, group, mine, c);
    const int first = c % kStages;
    if (h.chunks < 0) {  // the end: the other warpgroup reads the same header next
      if constexpr (kTurns) hand_over_turn(next_chunk, order, group, c);
      break;
    }
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) acc[e] = 0.0f;
    int pending = first;  // the stage whose products are still in flight (or the header's)
    for (int i = 0; i < h.chunks; ++i, ++c) {
      const int stage = c % kStages;
      tma::wait(&full[stage], (c / kStages) & 1);
      const int count = headers[stage].count;
      if (count < ops::kAlgTmaChunkRows) zero_rows_past<BN>(ring.a(stage), ring.b(stage), count, tid, group);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < ops::kAlgTmaChunkRows / 16; ++kk)
        wgmma::mma<BN, 1, 1>(acc, L::A::mn_major(ring.a(stage), 16 * kk), L::B::mn_major(ring.b(stage), 16 * kk),
                             true);
      wgmma::commit();
      wgmma::wait<1>();  // the previous chunk's products are done (this warp's share)
      if (pending != stage && lane == 0) tma::arrive(&empty[pending]);
      pending = stage;
    }
    if (h.chunks == 0) ++c;  // the stage that carried the header alone
    if constexpr (kTurns) hand_over_turn(next_chunk, order, group, c);
    wgmma::wait<0>();
    if (lane == 0) tma::arrive(&empty[pending]);  // the tile's last stage (or its header's)

    // Accumulator (dW row 16 warp + grp (+ 8), columns 8 j + 2 tig, + 1) → fp32 pairs, into dW
    // or the tile's slot.
    const ops::AlgWeightTile& t = h.t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * gwarp + grp + 8 * half;
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
}

template <int I>
void tma_weight_config(const AlgTmaWeightArgs& a, cudaStream_t stream) {
  constexpr AlgTmaConfig cfg = kAlgTmaWeightConfigs[I];
  launch<algproj_tma_weights_kernel<cfg.cols, cfg.stages, cfg.groups>>(
      cfg.groups * kGroupThreads + 32, TmaLayout<cfg.cols, cfg.stages, 0, 1, WeightMeta>::kSmem, a.num_tiles,
      cfg.persistent, a, stream);
}

template <int... I>
void tma_weight_configs(const AlgTmaWeightArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? tma_weight_config<I>(a, stream) : void()), ...);
}

template <int I, bool kTransW>
void tma_config(const AlgTmaArgs& a, cudaStream_t stream) {
  constexpr AlgTmaConfig cfg = kAlgTmaConfigs[I];
  if constexpr (cfg.two_groups) {
    // Forward only: AlgProj gives dX no two-group plan and refuses the configuration there.
    static_assert(cfg.tall && cfg.groups == 2 && !cfg.cooperative && cfg.extra == 0, "two groups: a tall tile's");
    if constexpr (!kTransW)
      launch<algproj_tma_two_group_kernel<cfg.cols, cfg.stages>>(2 * kGroupThreads + 32,
                                                                 TwoGroupLayout<cfg.stages>::kSmem, a.num_tiles,
                                                                 cfg.persistent, a, stream);
  } else {
    static_assert(!cfg.eager || (cfg.groups == 2 && !cfg.cooperative && !cfg.tall), "eager: two warpgroups in turn");
    launch<algproj_tma_kernel<cfg.cols, cfg.stages, kTransW, cfg.groups, cfg.cooperative, cfg.tall,
                              cfg.releases_at_once(), cfg.extra, cfg.one_staging, cfg.ring_staging>>(
        cfg.groups * kGroupThreads + 32,
        RowLayout<cfg.cols, cfg.stages, cfg.groups, cfg.cooperative, cfg.tall, cfg.extra, cfg.one_staging,
                  cfg.ring_staging>::kSmem,
        a.num_tiles, cfg.persistent, a, stream);
  }
}

template <int... I>
void tma_configs(const AlgTmaArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? (a.w_transposed ? tma_config<I, true>(a, stream) : tma_config<I, false>(a, stream)) : void()), ...);
}

template <int BN, int kStages>
void tma_cluster(const AlgTmaArgs& a, int parts, cudaStream_t stream) {
  constexpr auto kernel = algproj_tma_cluster_kernel<BN, kStages>;
  constexpr size_t smem = TmaLayout<BN, kStages>::kSmem;
  // Two blocks a multiprocessor, as the one-warpgroup row pass.
  static_assert(2 * smem <= 227 * 1024, "two blocks fit a multiprocessor");
  static const bool opted = [] {
    QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)opted;
  if (a.num_tiles == 0) return;
  cudaLaunchAttribute attrs[2]{pdl_attribute(), {}};
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = static_cast<unsigned>(parts);
  attrs[1].val.clusterDim.y = attrs[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(static_cast<unsigned>(a.num_tiles * parts));
  launch.blockDim = dim3(kGroupThreads + 32);
  launch.dynamicSmemBytes = smem;
  launch.stream = stream;
  launch.attrs = attrs;
  launch.numAttrs = 2;
  QV_CUDA_CHECK(cudaLaunchKernelEx(&launch, kernel, a, parts));
}

}  // namespace

void launch_algproj_tma(const AlgTmaArgs& args, int config, cudaStream_t stream) {
  tma_configs(args, config, stream, std::make_integer_sequence<int, kAlgTmaConfigCount>{});
}

void launch_algproj_tma_cluster(const AlgTmaArgs& args, int cols, int parts, cudaStream_t stream) {
  // AlgProj checks the arguments with messages; here a bad one is only an invalid value.
  if (!args.w_transposed || parts < 1 || parts > kAlgTmaClusterMaxParts) QV_CUDA_CHECK(cudaErrorInvalidValue);
  // A stage of 8 KB of dY and BN 128-byte W rows; up to 96 KB of stages a block.
  switch (tma_cluster_width(cols)) {
    case 64: tma_cluster<64, 6>(args, parts, stream); break;
    case 80: tma_cluster<80, 5>(args, parts, stream); break;
    case 96: tma_cluster<96, 4>(args, parts, stream); break;
    case 128: tma_cluster<128, 4>(args, parts, stream); break;
    case 160: tma_cluster<160, 3>(args, parts, stream); break;
    case 192: tma_cluster<192, 3>(args, parts, stream); break;
    default: QV_CUDA_CHECK(cudaErrorInvalidValue);
  }
}

void launch_algproj_tma_weights(const AlgTmaWeightArgs& args, int config, cudaStream_t stream) {
  tma_weight_configs(args, config, stream, std::make_integer_sequence<int, kAlgTmaWeightConfigCount>{});
}

}  // namespace quiver::cuda::detail
