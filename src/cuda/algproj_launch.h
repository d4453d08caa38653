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

// Over n elements of got and ref (both bf16, or both fp32 when f32): out[0] += Σ (got − ref)²,
// out[1] += Σ ref² (fp64 sums), and out[2], out[3] raised to max |got − ref| (∞ where it is not
// finite) and max |ref|, as the bit patterns of non-negative doubles (which order as integers).
// out: 4 device doubles, zeroed by the caller. Calibration checks each candidate with it.
void launch_compare_outputs(const void* got, const void* ref, bool f32, int64_t n, double* out, cudaStream_t stream);

// One block of an empty programmatic dependent (pdl.cuh: it triggers and waits, nothing else),
// launched as the algebraic kernels are: the benchmark's measure of the least a call can take.
void launch_empty_dependent(cudaStream_t stream);

}  // namespace quiver::cuda::detail
