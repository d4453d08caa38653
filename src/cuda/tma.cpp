#include "cuda/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include <fmt/format.h>

#include "cuda/check.h"
#include "quiver/error.h"

namespace quiver::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    QV_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    QV_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
             "tma: the driver has no cuTensorMapEncodeTiled (needs CUDA 12 or later)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}


// The swizzle whose rows are box_cols bf16 wide (wgmma::Panels' modes).
CUtensorMapSwizzle swizzle_of(int box_cols) {
  const CUtensorMapSwizzle swizzle = box_cols == 16   ? CU_TENSOR_MAP_SWIZZLE_32B
                                     : box_cols == 32 ? CU_TENSOR_MAP_SWIZZLE_64B
                                     : box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B
                                                      : CU_TENSOR_MAP_SWIZZLE_NONE;
  QV_CHECK(swizzle != CU_TENSOR_MAP_SWIZZLE_NONE, "tma: box columns {} (must be 16, 32 or 64)", box_cols);
  return swizzle;
}

// A bf16 map of `rank` dimensions (dims innermost first, strides in bytes past the first),
// boxes box[] with box[0] = box_cols and every step 1, swizzled as swizzle_of(box_cols) or not at
// all; `what` names the operand in errors.
CUtensorMap encode(const void* base, cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
                   const cuuint32_t* box, int box_rows, const std::string& what, bool swizzled = true) {
  QV_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, "tma: {} must be 16-byte aligned", what);
  QV_CHECK(box_rows >= 1 && box_rows <= 256, "tma: box rows {} outside 1..256", box_rows);
  const CUtensorMapSwizzle swizzle = swizzled ? swizzle_of(static_cast<int>(box[0])) : CU_TENSOR_MAP_SWIZZLE_NONE;
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), dims, strides,
                               box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QV_CHECK(r == CUDA_SUCCESS, "tma: cuTensorMapEncodeTiled failed ({}) for {}, box {} x {}", static_cast<int>(r), what,
           box_rows, box[0]);
  return map;
}

cuuint64_t u64(int64_t v) { return static_cast<cuuint64_t>(v); }
cuuint32_t u32(int v) { return static_cast<cuuint32_t>(v); }

// The rows of a row-major [rows, cols] matrix as tma_map_bf16 lays them out: rank 2 {cols, rows},
// or (row_stride > 1, or rank3) rank 3 {cols, s, rows / s}; swizzled as swizzle_of(box_cols) or
// not at all.
CUtensorMap rows_map(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                     int64_t row_stride, bool rank3, bool swizzled) {
  QV_CHECK(rows > 0 && cols > 0 && ld >= cols && ld % 8 == 0,
           "tma: a [{}, {}] matrix with leading dimension {} (needs ld >= cols, a multiple of 8)", rows, cols, ld);
  QV_CHECK(row_stride >= 1 && rows % row_stride == 0, "tma: {} rows are not a multiple of the row stride {}", rows,
           row_stride);
  rank3 = rank3 || row_stride > 1;
  const cuuint64_t dims[3] = {u64(cols), rank3 ? u64(row_stride) : u64(rows), u64(rows / row_stride)};
  const cuuint64_t strides[2] = {u64(ld) * 2, u64(ld) * 2 * u64(row_stride)};
  const cuuint32_t box[3] = {u32(box_cols), rank3 ? 1u : u32(box_rows), u32(box_rows)};
  return encode(base, rank3 ? 3 : 2, dims, strides, box, box_rows,
                fmt::format("the [{}, {}] matrix (ld {})", rows, cols, ld), swizzled);
}

}  // namespace

CUtensorMap tma_map_bf16(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                         int64_t row_stride) {
  return rows_map(base, rows, cols, ld, box_rows, box_cols, row_stride, false, true);
}

CUtensorMap tma_map_staging_bf16(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                                 int64_t row_stride, bool swizzled) {
  QV_CHECK(box_cols >= 8 && box_cols <= 256 && box_cols % 8 == 0 && (!swizzled || box_cols == 64),
           "tma: staging boxes of {} columns (needs a multiple of 8 up to 256; 64 swizzled)", box_cols);
  return rows_map(base, rows, cols, ld, box_rows, box_cols, row_stride, true, swizzled);
}

CUtensorMap tma_map_groups_bf16(void* base, int64_t rows, int64_t groups, int64_t group_cols, int64_t ld,
                                int box_rows, int64_t row_stride) {
  QV_CHECK(rows > 0 && groups > 0 && group_cols > 0 && group_cols % 8 == 0 && ld % 8 == 0 &&
               ld >= groups * group_cols,
           "tma: a [{}, {} x {}] matrix of column groups with leading dimension {} (needs group widths and ld "
           "multiples of 8, ld >= the columns)",
           rows, groups, group_cols, ld);
  QV_CHECK(row_stride >= 1 && rows % row_stride == 0, "tma: {} rows are not a multiple of the row stride {}", rows,
           row_stride);
  const bool strided = row_stride > 1;
  const cuuint64_t dims[4] = {u64(group_cols), u64(groups), strided ? u64(row_stride) : u64(rows),
                              u64(rows / row_stride)};
  const cuuint64_t strides[3] = {u64(group_cols) * 2, u64(ld) * 2, u64(ld) * 2 * u64(row_stride)};
  const cuuint32_t box[4] = {64, 1, strided ? 1u : u32(box_rows), u32(box_rows)};
  return encode(base, strided ? 4 : 3, dims, strides, box, box_rows,
                fmt::format("the [{}, {} x {}] matrix (ld {})", rows, groups, group_cols, ld));
}

CUtensorMap tma_map_heads_bf16(const void* base, int64_t B, int64_t T, int64_t H, int64_t Dh, int box_rows,
                               int box_cols) {
  QV_CHECK(B > 0 && T > 0 && H > 0 && Dh > 0 && Dh % 8 == 0,
           "tma: a [{}, {}, {}, {}] tensor of heads (needs positive sizes, Dh a multiple of 8)", B, T, H, Dh);
  const cuuint64_t dims[4] = {u64(Dh), u64(H), u64(T), u64(B)};
  const cuuint64_t strides[3] = {u64(Dh) * 2, u64(H * Dh) * 2, u64(T * H * Dh) * 2};
  const cuuint32_t box[4] = {u32(box_cols), 1, u32(box_rows), 1};
  return encode(base, 4, dims, strides, box, box_rows, fmt::format("the [{}, {}, {}, {}] heads", B, T, H, Dh));
}

}  // namespace quiver::cuda
