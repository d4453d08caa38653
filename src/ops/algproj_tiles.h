// Work decomposition of the fused algebraic-projection kernels (SPEC §1.3), built on the
// host and read by the GPU kernels (src/cuda/algproj_fused.cu). Plain structs only, so the
// kernels can include this header.
//
// Row pass (forward y = Φ_W(x), and dX): every output element belongs to exactly one tile.
// A tile is a block of at most `tile_rows` rows of one row class (types whose support rows
// are identical are merged into one class; a dense law has one class) and at most
// `tile_cols` columns of one output group; it is reduced over its segments, each a range
// [k0, k0 + len) of the pass's input columns, which is also the weight's reduction index
// (forward: x columns = W rows; dX: dy columns = W columns). Contiguous support groups are
// merged into one segment. A tile with no segment assigns zeros.
//   forward: output group δ of type α reduces over B(α, δ) (input groups);
//   dX:      output group β of type α reduces over {δ : β ∈ B(α, δ)} (output groups).
//
// Weight pass (dW): tiles of at most tile_rows × tile_cols elements of one block (β, δ),
// each reduced over the rows of the types α with β ∈ B(α, δ) (one ascending list per
// distinct set of types); a block no type uses has an empty list (assigned zeros). As in the
// row pass, a list far longer than the median (Q_q's diagonal blocks: every row, against one
// type's rows elsewhere) is split into pieces with fp32 slots (AlgWeightSplit); so are all
// lists when the plan has too few tiles to fill the GPU (a small weight at a large M: 144
// tiles of 15,360-61,440 rows for alg110m's FFN in training).
//
// Split reductions (row pass): a tile whose reduction is far longer than the typical one (Q_q's
// dX of a type's own group reduces over all N columns, the others over N/q) would leave the
// GPU waiting on a few blocks. Such an output block is cut into `parts` tiles over
// consecutive pieces of its reduction; each writes fp32 partial sums to its own workspace
// slot, and a second pass (AlgSplit) adds the slots in order and rounds once, so the result
// stays deterministic and every output element still has one owner.
//
// Tiles are ordered longest reduction first, so the long ones start early.
//
// Packed plans (forward only, for the fused kernel's packed configurations): where a law's
// groups are narrow (Q_256 at Qwen3-32B: reductions of 20, output groups of 100), a tile of one
// output group reduces over a few dozen columns, so tiles are many and short and each pays a
// whole chunk per segment. A packed tile takes consecutive whole output groups of one class up to
// tile_cols columns (a group wider than that is cut as above), reduces over the union of their
// segments, each applied only to the columns of the groups that reduce over it (AlgSegmentPlace;
// the kernel reads the weight as zero elsewhere), and lays the segments end to end in chunks of
// pack_chunk: a segment may be cut at a chunk's end, and a chunk holds at most kAlgPackMaxPieces
// pieces. Q_q's typed block x_α W_α· then serves every group of the tile at once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace quiver::algebra {
class Law;
struct GroupWidths;
}  // namespace quiver::algebra

namespace quiver::ops {

struct AlgSegment {
  int32_t k0, len;
};

// Where a packed plan's segment applies: tile columns [c0, c1), and its first position in its
// chunk (kpos 0: it starts a chunk).
struct AlgSegmentPlace {
  int16_t c0, c1, kpos, unused;
};
inline constexpr int kAlgPackMaxPieces = 4;

struct AlgRowTile {
  int32_t row_begin, row_count;  // into AlgRowPlan::rows
  int32_t col0, ncols;           // output columns
  int32_t seg_begin, seg_count;  // into AlgRowPlan::segments
  int32_t slot;                  // -1: writes the output; else the partial-sum slot it writes
};

// An output block reduced by `parts` tiles into slots slot0 .. slot0 + parts - 1, each a
// row-major [slot_rows][slot_cols] fp32 array of the plan's workspace.
struct AlgSplit {
  int32_t row_begin, row_count;  // into AlgRowPlan::rows
  int32_t col0, ncols;
  int32_t slot0, parts;
};

struct AlgWeightTile {
  int32_t k0, nk;                  // dW rows (input features)
  int32_t col0, ncols;             // dW columns (output features)
  int32_t list_begin, list_count;  // reduction rows, into AlgWeightPlan::rows
  int32_t slot;                    // -1: writes dW; else the partial-sum slot it writes
};

// A dW block reduced by `parts` tiles over consecutive pieces of its row list, into slots
// slot0 .. slot0 + parts - 1 ([slot_rows][slot_cols] fp32 each), summed in order after.
struct AlgWeightSplit {
  int32_t k0, nk, col0, ncols;
  int32_t slot0, parts;
};

enum class AlgPass { Forward, DX, DW };

struct AlgRowPlan {
  std::vector<int32_t> rows;  // row indices of every class, concatenated (ascending within one)
  std::vector<AlgRowTile> tiles;
  std::vector<AlgSegment> segments;
  std::vector<AlgSegmentPlace> places;  // packed plans only: one per segment
  std::vector<AlgSplit> splits;
  int32_t slot_rows = 0, slot_cols = 0;  // a slot's shape: the tile shape asked for
  int32_t num_slots = 0;
  int64_t macs = 0;  // multiply-adds the tiles perform (padding excluded)
};

struct AlgWeightPlan {
  std::vector<int32_t> rows;
  std::vector<AlgWeightTile> tiles;
  std::vector<AlgWeightSplit> splits;
  int32_t slot_rows = 0, slot_cols = 0, num_slots = 0;
  int64_t macs = 0;
};

// pass: Forward or DX. row_types: one entry per row, in [0, q). split: whether long
// reductions may be split (cut points are multiples of kAlgSplitAlign reduction columns).
// pack_chunk > 0: a packed plan (forward only, never split) in chunks of pack_chunk.
AlgRowPlan plan_row_pass(const algebra::Law& law, const algebra::GroupWidths& widths,
                         const std::vector<int>& row_types, AlgPass pass, int tile_rows,
                         int tile_cols, bool split = true, int pack_chunk = 0);
constexpr int kAlgSplitAlign = 64;

// Two-group plans (forward only; the Hopper row pass's two-group configurations,
// src/cuda/algproj_tma.cu). Where every output group δ of every type α reduces over the typed
// block α and at most its own block δ (Q_q: B(α, δ) = {α, δ}), a tile is up to tile_rows rows of
// one type × the output groups δ = 2j and 2j + 1 side by side, so that the typed block's rows of
// x are read once for both. Every tile has exactly three segments, by position: the typed block
// (applied to both groups), group 2j's own block (its left group_cols columns only) and group
// 2j + 1's (its right ones); an own block that is the typed block, or that the group does not
// reduce over, has length 0. The plan has no tiles (why_not says why) unless q is even, the
// output groups are equally wide (a multiple of kAlgTmaAlign, at most half_cols), every input
// block is a positive multiple of `chunk` wide and each tile's rows are one progression.
struct AlgTwoGroupPlan {
  AlgRowPlan plan;
  std::string why_not;
};
AlgTwoGroupPlan plan_two_group_pass(const algebra::Law& law, const algebra::GroupWidths& widths,
                                    const std::vector<int>& row_types, int tile_rows, int half_cols, int chunk);

// Cluster splits (the Hopper row pass's split configurations, dX; src/cuda/algproj_tma.cu). A
// block reduces its tile's chunks one after another, so the few tiles whose reduction is many
// times the typical one set the pass's time: Q_q's dX of a type's own block reduces over all N
// columns, every other tile over N/q (Qwen3-32B: 400 chunks against 13). plan_cluster_split takes
// an unsplit plan (plan_row_pass with split = false) and moves its long tiles into `split`: tiles
// whose reduction is at least 4 chunks and at least 4 times the median tile's (in whole chunks,
// at least 1), of whole `chunk`-deep chunks (every segment's first column and length multiples of
// it), at most max_rows rows and max_cols columns. Long tiles of the same rows and reduction
// whose columns adjoin (one output group's column tiles) are merged up to max_cols, so that a
// type's own block is one tile where it fits (Qwen3-32B: blocks of 160, planned as 64 + 64 + 32),
// and its rows of dY are read once. `parts` blocks of one thread-block cluster reduce each split
// tile, block r over the chunks cluster_piece(chunks, parts, r) of the tile's segments taken in
// order, and add their sums in rank order over distributed shared memory: one owner per element,
// no slots in global memory, no second pass. `plan` keeps the other tiles, in their order, and
// every row and segment (the split tiles index into them); its macs stay the whole pass's. parts
// is the longest split tile's chunks over twice the median's, from 2 to max_parts, the same for
// every tile (a launch has one cluster shape); 0 where no tile is long. cols: the widest split
// tile's columns.
struct AlgClusterPlan {
  AlgRowPlan plan;
  std::vector<AlgRowTile> split;
  int parts = 0, cols = 0;
};
AlgClusterPlan plan_cluster_split(AlgRowPlan plan, int chunk, int max_rows, int max_cols, int max_parts);
// The chunks [begin, end) of a split tile's `chunks` that block `rank` of `parts` reduces:
// consecutive, in rank order, together all of them, each block's count within one of the others'.
struct AlgChunkRange {
  int32_t begin, end;
};
constexpr AlgChunkRange cluster_piece(int32_t chunks, int32_t parts, int32_t rank) {
  return {static_cast<int32_t>(int64_t{chunks} * rank / parts), static_cast<int32_t>(int64_t{chunks} * (rank + 1) / parts)};
}

// The stride s with which every tile of a row plan holds rows r, r + s, r + 2 s, ... (each
// tile's rows one box of a strided view of the input: cyclic types s = q, contiguous ones 1),
// with M a multiple of s, and every segment's first reduction column and every tile's first
// output column a multiple of kAlgTmaAlign; 0 where the plan has no such stride (the TMA row
// pass reads only such plans).
int uniform_row_stride(const AlgRowPlan& plan, int64_t M);
// A TMA box's innermost coordinate must address a 16-byte boundary (the hardware faults with an
// illegal instruction otherwise): 8 bf16 columns.
inline constexpr int kAlgTmaAlign = 8;
// The rows part of uniform_row_stride: the stride s with which every tile holds rows r, r + s,
// ..., M a multiple of s (1 where every tile has one row); 0 where there is none.
int tile_row_stride(const AlgRowPlan& plan, int64_t M);

// Where a row plan's tiles can leave shared memory as TMA stores of one box shape: every tile
// `rows` rows (1..256) of one progression of `stride` (tile_row_stride) and `cols` columns (a
// multiple of kAlgTmaAlign, at most 256) from a column that is a multiple of kAlgTmaAlign, none
// of them a split's piece. rows 0: no such shape.
struct AlgStoreBox {
  int rows = 0, cols = 0, stride = 0;
};
AlgStoreBox uniform_store_box(const AlgRowPlan& plan, int64_t M);

// The TMA weight pass reads a tile's reduction rows in chunks of up to kAlgTmaChunkRows rows,
// each one box of a view of x and dY: `count` rows row0, row0 + d, ... with d = 1, or d =
// `stride` (strided; the plan's one other stride, q for cyclic types).
struct AlgWeightChunk {
  int32_t row0;
  int16_t count;
  int16_t strided;
};
inline constexpr int kAlgTmaChunkRows = 64;

struct AlgWeightChunks {
  std::vector<AlgWeightChunk> chunks;
  std::vector<int32_t> tile_begin;  // tile t's chunks: [tile_begin[t], tile_begin[t + 1])
  int stride = 0;                   // the strided chunks' stride; 0: the plan has no chunking
};

// The chunks of every tile of a dW plan: a piece whose rows are one progression of step 1 or
// `stride` is cut along it; any other piece is cut per row type (ascending), each type's rows
// along their runs of one step. `stride` 0 (no chunking) where a tile's first row or column is
// not a multiple of kAlgTmaAlign (its boxes' innermost coordinates), a chunk is strided and M
// is not a multiple of the stride, or the chunks would hold fewer than half their rows on
// average (irregular row types).
AlgWeightChunks plan_weight_chunks(const AlgWeightPlan& plan, const std::vector<int>& row_types, int stride);

// Pair plans (forward only; the pair kernel, src/cuda/algproj_pair.cu). Where every output
// group of every type reduces over at most two input blocks, its own and the row type's (graph
// laws: B(α, δ) = {δ} or {α, δ}), all groups are equally wide and each type's rows run in
// progressions of one stride, a tile is tile_rows rows of one type × `groups` whole output groups
// (groups 1: a group, or an equal part of one), and its operands are fixed boxes: x's rows at each
// block it reduces over (each box `slot` columns from the 8-column boundary at or below the
// block's first column: the block lies `lead` = k0 mod 8 columns in) and, per group, W's rows of
// those blocks at the group's columns. The kernel counts only a box's columns [lead, lead + in)
// (the rest are the neighbouring blocks'), and the typed block only where the group reduces over it.
struct AlgPairTile {
  int32_t row0;          // the tile's rows: row0 + stride · i, i < tile_rows
  int32_t col0;          // first output column (a multiple of kAlgTmaAlign)
  int32_t k_typed;       // first column of the row type's input block
  int32_t typed;         // bit g: group g reduces over the typed block as well as its own
  int32_t k_own[2];      // first column of group g's own input block
  int32_t w_col[2];      // group g's W boxes: first column (a multiple of kAlgTmaAlign)
  int32_t shift[2];      // group g's first output column in the tile − w_col[g]
};
struct AlgPairPlan {
  std::vector<AlgPairTile> tiles;  // type by type; each run of rows' tiles in column order
  // The tiles whose first column is a multiple of 64 (every run's first among them), then
  // tiles.size(): a kernel that gives each block the tiles from one of these to another writes
  // each 64-column piece of an output row from one block.
  std::vector<int32_t> segments;
  int stride = 0;      // the tiles' row stride (M a multiple of it)
  int in = 0;          // columns of an input block
  int slot = 0;        // columns of an x box: the least odd multiple of 8 holding lead + in for every block
  int tile_cols = 0;   // output columns of a tile (groups · group_cols)
  int group_cols = 0;  // output columns of each group in a tile
  int own_gap = 0;     // groups 2: columns from group 0's own x box to group 1's, the same in every
                       // tile (0: they differ, or groups 1); a kernel may then load both in one box
  int64_t macs = 0;
  std::string why_not;  // no tiles: the condition that fails
};
// groups: 1 or 2 output groups a tile (2: pairs 2j, 2j + 1); group_box: the columns of a group's
// W box (a group and its shift must fit).
AlgPairPlan plan_pair_pass(const algebra::Law& law, const algebra::GroupWidths& widths, const std::vector<int>& row_types,
                           int tile_rows, int groups, int group_box);

// Diagonal GEMMs (dW; the Hopper weight pass's diagonal-GEMM configurations, src/cuda/algproj.cpp).
// Where every row type's support of each output group holds that group's own input block
// (δ ∈ B(α, δ): every law built in), each diagonal block (δ, δ) of dW reduces over every row, while
// at Q_q the others reduce over one type's rows: at M = 2048 and q = 32, 32 chunks of 64 rows
// against one, half of the weight pass's stages for 1/q of dW. Where the input groups share one
// width and the output groups another, those q blocks are one strided batched GEMM: member j is
// x[:, input group j]ᵀ · dY[:, output group j] into dW's block (j, j). plan_diagonal_gemm says
// whether it applies (in and out: the blocks' shape; 0 and why_not otherwise);
// drop_diagonal_tiles takes those blocks' tiles out of an unsplit weight plan, whose other tiles
// the weight pass then runs (every output element still has one owner). The plan's rows and macs
// stay the whole pass's.
struct AlgDiagonalGemm {
  int64_t in = 0, out = 0;
  std::string why_not;
};
AlgDiagonalGemm plan_diagonal_gemm(const algebra::Law& law, const algebra::GroupWidths& widths);
void drop_diagonal_tiles(AlgWeightPlan& plan, const algebra::GroupWidths& widths);

// split: whether long row lists may be split (see the file comment); min_pieces: where the
// plan has fewer tiles, lists are also cut into pieces of about (rows of all lists) / min_pieces
// (the GPU asks for a few blocks per multiprocessor).
AlgWeightPlan plan_weight_pass(const algebra::Law& law, const algebra::GroupWidths& widths,
                               const std::vector<int>& row_types, int tile_rows, int tile_cols,
                               bool split = true, int64_t min_pieces = 0);

}  // namespace quiver::ops
