// Launchers of the fused algebraic-projection kernels (algproj_fused.cu), raw pointers; the
// checked entry is cuda::AlgProj (algproj.h), the tile plans come from ops/algproj_tiles.h.
//
// Tensor cores: mma.sync m16n8k16 (bf16 operands, fp32 accumulators) fed by ldmatrix from
// shared memory that cp.async fills three stages deep. Every element of the output is
// written by one thread of one tile, or (split reductions, ops/algproj_tiles.h) by one thread
// of the reduce pass that adds the pieces' slots in order; no atomics, so results are
// deterministic. `vec` is the copy granularity in elements (8, 4 or 2: 16-, 8- or 4-byte
// copies); every column offset, width and leading dimension of the call must be a multiple
// of it, and the pointers aligned to 2·vec bytes.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/algproj_tiles.h"

namespace quiver::cuda::detail {

// Kernel configurations, index = config: the block's output tile (rows × cols), its warp
// grid (WM × WN warps), the reduction chunk per pipeline stage and the number of stages.
// Calibration picks among them per shape (algproj.h). `packed` (row pass, forward only): the
// configuration runs packed plans (ops/algproj_tiles.h: tiles of several whole output groups,
// segments laid end to end in its chunks, each applied to its groups' columns). `staged` (row
// pass): a tile's bf16 products are laid out in shared memory and written along its rows, 16
// bytes a thread where the columns allow, or as one TMA store where every tile is one box shape
// (AlgRowArgs::y), instead of from the mma fragments (a store instruction of which covers 32
// bytes in each of 8 rows); tiles that add to the output or to a slot write from the fragments.
struct AlgKernelConfig {
  int rows, cols, warps_m, warps_n, chunk, stages;
  bool packed = false, staged = false;
};
// Row pass (forward, dX).
constexpr AlgKernelConfig kAlgRowConfigs[] = {
    {64, 128, 2, 2, 32, 3},  {64, 128, 2, 2, 32, 6},  {64, 128, 2, 2, 64, 4}, {128, 128, 4, 2, 32, 4},
    {64, 256, 2, 4, 32, 4},  {128, 256, 4, 4, 32, 3}, {32, 128, 2, 2, 32, 6}, {16, 128, 1, 4, 32, 8},
    {16, 64, 1, 4, 32, 8},   {64, 128, 2, 4, 32, 4},
    // Packed: for narrow groups (Q_256 at Qwen3-32B: reductions of 20, output groups of 100).
    {64, 256, 2, 4, 64, 2, true},       {128, 256, 4, 4, 64, 3, true},       {64, 256, 2, 4, 64, 2, true, true},
    {128, 256, 4, 4, 64, 2, true, true}, {128, 256, 4, 4, 64, 3, true, true},
};
constexpr int kAlgRowConfigCount = sizeof(kAlgRowConfigs) / sizeof(kAlgRowConfigs[0]);
// Weight pass (dW): tile = dW rows × dW columns, the chunk runs over token rows.
constexpr AlgKernelConfig kAlgWeightConfigs[] = {
    {64, 128, 2, 2, 32, 3}, {128, 128, 4, 2, 32, 3}, {64, 64, 2, 2, 32, 3}, {128, 128, 4, 2, 32, 6},
    {64, 128, 2, 2, 64, 4},
};
constexpr int kAlgWeightConfigCount = sizeof(kAlgWeightConfigs) / sizeof(kAlgWeightConfigs[0]);

// Few-row forward kernels (decode): matrix-vector products on CUDA cores, R rows per tile at
// most, `cols` output columns per tile (one 16-byte weight vector per thread and row).
struct AlgGemvConfig {
  int rows, cols;
};
constexpr AlgGemvConfig kAlgGemvConfigs[] = {{1, 64}, {1, 32}, {2, 64}, {4, 64}, {8, 64}, {8, 32}};
constexpr int kAlgGemvConfigCount = sizeof(kAlgGemvConfigs) / sizeof(kAlgGemvConfigs[0]);

// The Hopper row pass, forward and dX (algproj_tma.cu): 64-row tiles whose A (x or dY) and W
// boxes a producer warp loads by TMA into a ring of `stages` 64-deep chunks, consumed by
// `groups` warpgroups' wgmma of `cols` columns each: taking the block's tiles of `cols` columns
// in turn, or (`cooperative`) side by side on tiles of groups · cols columns, so that a tile's
// rows of x are read once for all of them, or (`tall`, two warpgroups) one above the other on
// tiles of 128 rows × cols, so that a tile's W is read once for both (classes of 128 rows or
// more in one progression: Q_16 at M = 2048; interval types in runs of 192 rows are not); one
// block per tile, or `persistent` (as many blocks
// as fit, each walking every gridDim-th tile). Plans whose tiles' rows are progressions of one
// stride (cyclic or interval types), group offsets that are multiples of 8 (a box's first column
// on a 16-byte boundary), the input and W 16-byte aligned, K and N multiples of 8 (AlgProj
// checks); segments of any length.
inline constexpr int kAlgTmaRows = 64, kAlgTmaChunk = 64;
// `eager` (two warpgroups in turn): each warpgroup releases a stage as soon as its products are
// done, as one-warpgroup blocks always do (releases_at_once), instead of keeping one chunk's
// products in flight. `extra` > 0: a stage may carry up to `extra` 16-deep slices after a whole
// 64-deep chunk, so that a segment's tail of 16 · extra or less takes no stage of its own
// (tma_chunk_len: Qwen3-4B's groups of 80 one stage instead of two). `one_staging` (two
// warpgroups in turn): the warpgroups lay out their tiles' products for the TMA stores in one
// staging, in turn, instead of one each, which leaves room for another stage. `ring_staging`
// (cooperative): the warpgroups lay out a tile's products in the W chunk of the tile's last
// stage, which they alone read (each its own columns), and release that stage to the producer
// once the stores have read it, during the next tile's products; no staging of its own, so that
// 64 x 384 tiles keep four stages of 56 KiB. `two_groups` (tall, forward only): tiles of a
// two-group plan (ops::plan_two_group_pass), 128 rows × two adjacent output groups of at most
// `cols` columns each, so that the typed block's x is read once for both groups.
struct AlgTmaConfig {
  int cols, stages, groups;
  bool persistent;
  bool cooperative = false;
  bool tall = false;
  bool eager = false;
  int extra = 0;
  bool one_staging = false;
  bool ring_staging = false;
  bool two_groups = false;
  constexpr int tile_cols() const { return cooperative ? groups * cols : two_groups ? 2 * cols : cols; }
  constexpr int tile_rows() const { return tall ? 2 * kAlgTmaRows : kAlgTmaRows; }
  constexpr bool releases_at_once() const { return groups == 1 || eager; }
};

// The depth of the next stage's chunk where `left` (> 0) of a segment's reduction remains, for a
// configuration with `extra` slices: 64, or what is left where that is less, or where it is 64
// plus at most `extra` whole slices of 16 (the segment's tail rides with its last whole chunk).
// Only the tail: spreading a segment over equal chunks of 80 (Qwen3-32B's 160 as 80 + 80, 8B's dX
// 384 as 4 × 80 + 64) was slower in calibration than 64-deep chunks and a tail (H200, 2026-12-04).
// The producer and the consumers walk every segment by it.
__host__ __device__ constexpr int tma_chunk_len(int left, int extra) {
  if (left <= kAlgTmaChunk) return left;
  const int tail = left - kAlgTmaChunk;
  return tail <= 16 * extra && tail % 16 == 0 ? left : kAlgTmaChunk;
}
// The stages a segment of `len` takes.
constexpr int tma_chunks(int len, int extra) {
  int n = 0;
  for (int k = 0; k < len; k += tma_chunk_len(len - k, extra)) ++n;
  return n;
}
// The one-warpgroup configurations take at most half a multiprocessor's shared memory (ring,
// zero operands and staging), so that two blocks run on each.
constexpr AlgTmaConfig kAlgTmaConfigs[] = {
    {128, 3, 1, false}, {64, 6, 1, false}, {128, 7, 2, true},       {64, 12, 2, true},
    {128, 3, 1, true},  {192, 5, 2, true}, {128, 4, 2, true, true}, {64, 8, 2, true, false, true},
    {128, 5, 2, true, false, true}, {192, 4, 2, true, false, true}, {192, 5, 2, true, false, false, true},
    // A tail of one slice after a whole chunk (calibrated only where a segment has such a tail).
    {192, 4, 2, true, false, false, true, 1}, {192, 4, 2, true, false, false, false, 1},
    // One staging for both warpgroups: a sixth 64x192 stage, an eighth 64x128 one.
    {192, 6, 2, true, false, false, true, 0, true}, {192, 6, 2, true, false, false, false, 0, true},
    {128, 8, 2, true, false, false, true, 0, true},
    // Cooperative 64 x 384 with the staging in the ring: x's box read once for 384 columns.
    {192, 4, 2, true, true, false, false, 0, false, true},
    // Two groups a tall tile (Q_q's narrow groups: Qwen3-30B-A3B's expert, groups of 48): the
    // whole tile's six chunks in flight.
    {48, 6, 2, true, false, true, false, 0, false, false, true},
};
constexpr int kAlgTmaConfigCount = sizeof(kAlgTmaConfigs) / sizeof(kAlgTmaConfigs[0]);

struct AlgTmaArgs {
  // A: x [M, K] (forward) or dY [M, N] (dX), boxes {64, 64 rows} (row_stride 1) or
  // {64, 1, 64 rows} of the rows t + s i.
  CUtensorMap x;
  // W [K, N]: boxes {64 n, 64 k} (forward) or {64 n, cols k} (dX, w_transposed).
  CUtensorMap w;
  // A segment's tail in 16-deep slices: x16 boxes {16, 64 rows} (as x), w16 boxes {64 n, 16 k}
  // (forward) or {16 n, cols k} (dX).
  CUtensorMap x16, w16;
  bool w_transposed;
  int row_stride;
  const int32_t* rows;  // device copies of an ops::AlgRowPlan without splits
  const ops::AlgRowTile* tiles;
  const ops::AlgSegment* segments;
  int num_tiles;
  uint16_t* c;  // [M, ldc] bf16: c = product (+ c when accumulate)
  int64_t ldc;
  bool accumulate;
  // Where the pass's output groups are all out_group_cols wide (a multiple of 8) and the product
  // is stored, not added: c as tma_map_groups_bf16 (64-row boxes, the rows of x's view), through
  // which a warpgroup's tile leaves shared memory by TMA stores, clipped at the group's end and at
  // view_rows (M / row_stride); out_group_cols 0: the warpgroups store from registers.
  CUtensorMap y;
  int out_group_cols;
  int view_rows;
};

// The Hopper weight pass (algproj_tma.cu): dW tiles of 64 rows (K) × `cols` columns (N) of one
// block pair, reduced over the tile's chunks (ops::AlgWeightChunks: up to 64 rows of one
// progression); per chunk the producer warp loads the rows' x box (the tile's 64 K columns) and
// dY boxes (its `cols` N columns) by TMA, and a warpgroup's wgmma adds x_chunkᵀ · dY_chunk (both
// operands MN-major). One block per tile, or persistent blocks of one or two consumer warpgroups
// (two take the block's tiles in turn); cooperative, tall and eager are not used.
constexpr AlgTmaConfig kAlgTmaWeightConfigs[] = {{128, 4, 1, false}, {64, 6, 1, false}, {128, 4, 1, true},
                                                 {128, 7, 2, true},  {64, 10, 2, true}};
constexpr int kAlgTmaWeightConfigCount = sizeof(kAlgTmaWeightConfigs) / sizeof(kAlgTmaWeightConfigs[0]);

struct AlgTmaWeightArgs {
  CUtensorMap x, dy;    // [M, K], [M, N]: boxes {64 columns, 64 rows}
  CUtensorMap xs, dys;  // the same as rank-3 views of the rows r + stride i (x, dy when unused)
  int stride;
  const ops::AlgWeightTile* tiles;
  const ops::AlgWeightChunk* chunks;
  const int32_t* tile_begin;  // tile t's chunks: [tile_begin[t], tile_begin[t + 1])
  int num_tiles;
  float* dw;  // [K, N] fp32: dw = product (+ dw when accumulate)
  int64_t lddw;
  bool accumulate;
  float* partials;  // the plan's slots (tiles with slot >= 0 write there, [64][cols] each)
};

struct AlgRowArgs {
  const uint16_t* a;  // [M, lda] bf16: x (forward) or dy (dX)
  int64_t lda;
  const uint16_t* w;  // [K, N] bf16, row-major, ldw = N
  int64_t ldw;
  bool w_transposed;  // dX: the reduction runs along W's columns, the output along its rows
  uint16_t* c;        // [M, ldc] bf16 output: c = product (+ c when accumulate)
  int64_t ldc;
  bool accumulate;
  const int32_t* rows;  // device copies of an ops::AlgRowPlan
  const ops::AlgRowTile* tiles;
  const ops::AlgSegment* segments;
  const ops::AlgSegmentPlace* places;  // packed plans (packed configurations) only
  int num_tiles;
  float* partials;  // the plan's slots (tiles with slot >= 0 write there; see AlgReduceArgs)
  // The few-row forward only: blocks per tile (1-8, one thread-block cluster), each reducing an
  // equal share of the tile's weight rows.
  int slices = 1;
  // The few-row forward only, plans without split reductions: a second weight bank and output
  // over the same plan and input (blockIdx.y = 1), so two projections of one input (SwiGLU's gate
  // and up) are one launch. Null: one projection.
  const uint16_t* w2 = nullptr;
  uint16_t* c2 = nullptr;
  // With w2: c = SwiGLU(x W, x W2) instead (SwiGLU's gate W and up W2, each product rounded to
  // bf16 first, as swiglu_forward reads them), one block computing both for its tile; c2 unused.
  bool swiglu = false;
  // Staged configurations, a stored product (not accumulate) and a plan whose tiles are all one
  // box (ops::uniform_store_box): y_rows > 0, and c as tma_map_staging_bf16 with boxes {the
  // tiles' columns, 1, y_rows} of the rows r + y_stride i, so that a tile's staging leaves shared
  // memory as one TMA store. y_rows 0: the block's threads copy it out.
  CUtensorMap y;
  int y_rows = 0, y_stride = 1;
};

// The second pass of a plan with split reductions: c[rows of a split, its columns] = Σ of its
// slots (+ c when accumulate).
struct AlgReduceArgs {
  const float* partials;
  int32_t slot_rows, slot_cols;
  const ops::AlgSplit* splits;
  int num_splits;
  const int32_t* rows;
  uint16_t* c;
  int64_t ldc;
  bool accumulate;
};

struct AlgWeightArgs {
  const uint16_t* x;  // [M, K] bf16
  int64_t ldx;
  const uint16_t* dy;  // [M, N] bf16
  int64_t ldy;
  float* dw;  // [K, N] fp32: dw = product (+ dw when accumulate)
  int64_t lddw;
  bool accumulate;
  const int32_t* rows;  // device copies of an ops::AlgWeightPlan
  const ops::AlgWeightTile* tiles;
  int num_tiles;
  float* partials;  // the plan's slots (tiles with slot >= 0 write there)
};

// dW's second pass over a plan with splits: dw[block] = Σ of its slots (+ dw when accumulate).
struct AlgWeightReduceArgs {
  const float* partials;
  int32_t slot_rows, slot_cols;
  const ops::AlgWeightSplit* splits;
  int num_splits;
  float* dw;
  int64_t lddw;
  bool accumulate;
};

// The pair kernel (algproj_pair.cu, forward only): tiles of a pair plan (ops::plan_pair_pass),
// `rows` rows × `groups` output groups (or one part of a group) of `group_box` W columns each,
// loaded by TMA into a ring of `stages`; rows / 32 · groups · group_box / 64 consumer warps
// (32 × 64 outputs each) compute them with mma.sync and lay each warp row's 32 rows of the tile out
// in a staging of 8 panels of 64 columns, used round (column c in panel c / 64 mod 8), from which
// whole 64-column boxes go out by TMA: each block takes the tiles of a range of the plan's
// segments in order, so the columns of a box that a tile leaves unfinished are finished by the
// block's next tile, and no 128-byte line of y is written in part (a part-written line costs the
// memory a read: docs/decisions.md). The loads are issued by a producer warp, or with `lane_producer`
// by lane 0 of consumer warp 0, kStages − 1 tiles ahead: 16 consumer warps then hold 128
// registers a thread (with a 17th warp, 5 share a scheduler: 96). With `merged_own` (groups 2)
// the tile's two own x blocks come in one box of slot + kAlgPairOwnGap columns, where the plan's
// own_gap is kAlgPairOwnGap (Qwen3-32B at q = 256: blocks 2j and 2j + 1, 40 columns from 40 j).
struct AlgPairConfig {
  int rows, groups, group_box, stages;
  bool lane_producer, merged_own;
};
constexpr AlgPairConfig kAlgPairConfigs[] = {
    {64, 2, 128, 3, false, false}, {64, 1, 256, 3, false, false}, {128, 2, 128, 2, true, false},
    {64, 2, 128, 3, true, false},  {64, 1, 256, 3, true, false},  {128, 1, 256, 2, true, false},
    {128, 2, 128, 2, true, true}};
constexpr int kAlgPairConfigCount = sizeof(kAlgPairConfigs) / sizeof(kAlgPairConfigs[0]);
// The x box widths (ops::AlgPairPlan::slot) the kernel is built for.
constexpr int kAlgPairSlots[] = {24, 40};
inline constexpr int kAlgPairOwnGap = 16;
// The staging's panels of 64 columns a warp row, used round: a tile's columns, the columns before
// them that the last tile left unfinished (up to 63) and those of the last tile's stores, which may
// still be reading, lie in 8 consecutive panels while a tile has at most kAlgPairMaxTileCols.
inline constexpr int kAlgPairStagingPanels = 8;
inline constexpr int kAlgPairMaxTileCols = 224;
// The staging panel of y's column c.
__host__ __device__ constexpr int alg_pair_panel(int c) { return (c >> 6) & (kAlgPairStagingPanels - 1); }
// The columns of y whose 64-column boxes a pair tile stores, [begin, end): from the 64-column
// boundary at or below its first column (the columns before that the block's last tile left) to
// the boundary at or below its end, or, a row's last tile, through the row's end (n).
struct AlgPairStores {
  int begin, end;
};
__host__ __device__ constexpr AlgPairStores alg_pair_stores(int col0, int tile_cols, int n) {
  return {col0 & ~63, col0 + tile_cols >= n ? n : (col0 + tile_cols) & ~63};
}
// Block b of G takes the plan's tiles [segments[b · S / G], segments[(b + 1) · S / G]) (S
// segments): this is the first.
__host__ __device__ inline int alg_pair_first_tile(const int32_t* segments, int num_segments, int block, int blocks) {
  return segments[static_cast<int64_t>(block) * num_segments / blocks];
}
// Dynamic shared memory of a configuration at a plan's slot: the ring (per stage groups + 1 x
// boxes, or the merged own box and the typed box, and 2 · groups W boxes of 128-byte-swizzled
// 64-column panels), the staging and 1024 bytes of alignment.
constexpr size_t alg_pair_smem(const AlgPairConfig& c, int slot) {
  const size_t x_cols = c.merged_own ? size_t(2 * slot + kAlgPairOwnGap) : size_t(c.groups + 1) * slot;
  return size_t(c.stages) * (x_cols * c.rows * 2 + size_t(2 * c.groups) * (c.group_box / 64) * slot * 128) +
         size_t(c.rows) * kAlgPairStagingPanels * 64 * 2 + 1024;
}
inline constexpr size_t kAlgPairMaxSmem = 227 * 1024 - 1024;  // less the static barriers and headers
// Whether a configuration runs a pair plan of this slot, tile columns and own gap: a slot it is
// built for, shared memory within kAlgPairMaxSmem, tiles of at most kAlgPairMaxTileCols, and a
// merged box only at kAlgPairOwnGap.
constexpr bool alg_pair_runs(const AlgPairConfig& c, int slot, int tile_cols, int own_gap) {
  bool built = false;
  for (int s : kAlgPairSlots) built = built || s == slot;
  return built && alg_pair_smem(c, slot) <= kAlgPairMaxSmem && tile_cols <= kAlgPairMaxTileCols &&
         (!c.merged_own || own_gap == kAlgPairOwnGap);
}

struct AlgPairArgs {
  CUtensorMap x;  // x [M, K] as rows c1 + stride · c2, unswizzled boxes {slot, 1, rows}
  CUtensorMap w;  // W [K, N], 128-byte-swizzled boxes {64, slot}
  CUtensorMap y;  // y [M, N] as rows c1 + stride · c2, 128-byte-swizzled boxes {64, 1, 32}
  CUtensorMap x_own;  // merged_own configurations: x as `x`, boxes {slot + kAlgPairOwnGap, 1, rows}
  const ops::AlgPairTile* tiles;
  const int32_t* segments;  // ops::AlgPairPlan::segments: num_segments starts, then the tile count
  int num_segments;
  int n;  // y's columns
  int stride, in, slot, tile_cols, group_cols;
  uint16_t* c;  // y itself, for accumulate
  int64_t ldc;
  bool accumulate;
};
// alg_pair_runs holds for the configuration and args (AlgProj checks).
void launch_algproj_pair(const AlgPairArgs& args, int config, cudaStream_t stream);

// The row pass; a plan with splits needs launch_algproj_reduce after it.
void launch_algproj_rows(const AlgRowArgs& args, int config, int vec, cudaStream_t stream);
void launch_algproj_reduce(const AlgReduceArgs& args, cudaStream_t stream);
// The forward over a plan with at most kAlgGemvConfigs[config].rows rows per tile; needs vec 8.
// A plan with splits needs launch_algproj_reduce after it, as the row pass does.
void launch_algproj_gemv(const AlgRowArgs& args, int config, cudaStream_t stream);
// The Hopper row pass with configuration kAlgTmaConfigs[config].
void launch_algproj_tma(const AlgTmaArgs& args, int config, cudaStream_t stream);
// The split configurations of the Hopper dX (a TMA AlgKernel with split): the long tiles of a
// cluster plan (ops::plan_cluster_split, merged up to kAlgTmaClusterMaxCols columns) by `parts`
// blocks of one thread-block cluster each, every block a producer warp and one warpgroup of wgmma
// m64nBNk16 over its piece of the tile's chunks, the blocks' sums added in rank order over
// distributed shared memory; then the row pass runs the plan's other tiles. BN is the least of
// kAlgTmaClusterWidths that holds the widest split tile. For the row configurations of one
// warpgroup's 64-row tiles (not cooperative, tall or two-group).
inline constexpr int kAlgTmaClusterMaxParts = 8, kAlgTmaClusterMaxCols = 192;
inline constexpr int kAlgTmaClusterWidths[] = {64, 80, 96, 128, 160, 192};
constexpr bool tma_cluster_splits(const AlgTmaConfig& c) { return !c.cooperative && !c.tall && !c.two_groups; }
constexpr int tma_cluster_width(int cols) {
  for (int w : kAlgTmaClusterWidths)
    if (w >= cols) return w;
  return 0;
}
// args as for the dX row pass, but with the split tiles as its tiles and W's map in boxes of
// tma_cluster_width(cols) rows (dX columns) × 64; c is assigned (or added to, accumulate) by
// plain bf16 stores.
void launch_algproj_tma_cluster(const AlgTmaArgs& args, int cols, int parts, cudaStream_t stream);
// The weight pass on TMA; a plan with splits needs launch_algproj_reduce_weights after it.
void launch_algproj_tma_weights(const AlgTmaWeightArgs& args, int config, cudaStream_t stream);
// The weight pass; a plan with splits needs launch_algproj_reduce_weights after it.
void launch_algproj_weights(const AlgWeightArgs& args, int config, int vec, cudaStream_t stream);
void launch_algproj_reduce_weights(const AlgWeightReduceArgs& args, cudaStream_t stream);

}  // namespace quiver::cuda::detail
