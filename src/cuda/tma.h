// Tensor-memory-accelerator descriptors (sm_90) for bf16 matrices, built on the host. The
// device side (the loads into shared memory and the mbarriers that count their bytes) is in
// cuda/tma.cuh. The driver's encoder is reached through the runtime, so nothing links libcuda.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace quiver::cuda {

// A row-major bf16 matrix [rows, cols] at `base` (16-byte aligned) with `ld` elements between
// rows (a multiple of 8), loaded as boxes of box_rows (1..256) × box_cols elements into shared
// memory with the swizzle of box_cols-wide rows: box_cols 16, 32 or 64 (32-, 64-, 128-byte
// rows, the modes of wgmma::Panels). Elements outside the matrix arrive as zeros. Pass it to a
// kernel as a `const __grid_constant__ CUtensorMap`.
// row_stride s > 1: the rows r = c1 + s c2 as a rank-3 map {cols, s, rows / s} (rows a multiple
// of s), whose boxes {box_cols, 1, box_rows} at (c0, c1, c2) hold the rows c1 + s (c2 + i), i <
// box_rows, in the same layout: a cyclic row type's rows as one box.
CUtensorMap tma_map_bf16(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                         int64_t row_stride = 1);

// The rows r = c1 + s c2 of a row-major bf16 matrix [rows, cols] (ld a multiple of 8, rows a
// multiple of s ≥ 1) as a rank-3 map {cols, s, rows / s} for stores of unswizzled boxes {box_cols,
// 1, box_rows}: a staging of box_rows rows of box_cols elements (a multiple of 8, at most 256),
// row after row, written to the rows c1 + s (c2 + i) from column c0 (a multiple of 8), clipped at
// the matrix's last column and row. Loads of the same boxes lay them out so (zeros past the
// matrix). swizzled: boxes of 64 columns, 128-byte swizzled (each row's 16-byte chunk j at j ^ (row
// mod 8), 1024-byte aligned in shared memory).
CUtensorMap tma_map_staging_bf16(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                                 int64_t row_stride, bool swizzled = false);

// A row-major bf16 matrix [rows, groups · group_cols] (ld elements between rows, a multiple of
// 8; group_cols a multiple of 8) seen per column group, for boxes of box_rows rows × 64 columns
// of one group (128-byte swizzle): rank 3 {group_cols, groups, rows}, or with row_stride s > 1
// rank 4 {group_cols, groups, s, rows / s} (the rows c2 + s c3, as tma_map_bf16). A box is clipped
// at its group's last column and at the last row, so a store writes nothing past either.
CUtensorMap tma_map_groups_bf16(void* base, int64_t rows, int64_t groups, int64_t group_cols, int64_t ld,
                                int box_rows, int64_t row_stride = 1);

// The heads of a bf16 [B, T, H, Dh] tensor (contiguous, Dh a multiple of 8) as a rank-4 map
// {Dh, H, T, B}: boxes {box_cols, 1, box_rows, 1} at (c0, h, t0, b) hold rows t0 .. t0 +
// box_rows − 1 of head h in batch b, columns c0 .., with the swizzle of box_cols-wide rows (16,
// 32 or 64); rows past T and columns past Dh arrive as zeros.
CUtensorMap tma_map_heads_bf16(const void* base, int64_t B, int64_t T, int64_t H, int64_t Dh, int box_rows,
                               int box_cols);

}  // namespace quiver::cuda
