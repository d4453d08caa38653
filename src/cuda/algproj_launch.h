// Internal: kernel launchers of the GPU algebraic projection (algproj.h). Raw device
// pointers, shapes checked by the caller (algproj.cpp); bf16 passed as uint16_t bit
// patterns. Each launches on `stream`, checks the launch and never synchronizes the host.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// dst[i, :] = src[rows[i], :] for i < m; src [*, cols], dst [m, cols] bf16, both contiguous.
void launch_gather_rows_bf16(const uint16_t* src, int64_t cols, const int64_t* rows, int64_t m,
                             uint16_t* dst, cudaStream_t stream);

// dst[rows[i], :] += src[i, :] for i < m; fp32. The rows must be distinct (no atomics).
void launch_scatter_add_rows_f32(const float* src, int64_t cols, const int64_t* rows, int64_t m,
                                 float* dst, cudaStream_t stream);

// p[i] = bf16(scale · u_i), u_i uniform in [-√3, √3) (unit variance) from a counter hash of
// (seed, i): reproducible benchmark inputs filled on the device.
void launch_fill_hashed_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace quiver::cuda::detail
