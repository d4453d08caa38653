// Internal: kernel launchers of the GEMM helpers (gemm_kernels.cu). They take raw device
// pointers, assume gemm.cpp checked the shapes, launch on `stream` and check the launch.
// bf16 buffers are uint16_t (the bit pattern of quiver::bf16). No launcher synchronizes.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// Row-major C [M, N] with row stride ldc, bf16 (c_bf16) or fp32:
//   C[m, n] = act(beta · C[m, n] + bias[n])
// computed in fp32, rounded once to C's type. beta = 0 ignores C's old value (NaN included);
// bias is null, fp32 or bf16 (bias_bf16); act is GELU (tanh form) when gelu, else identity.
void launch_bias_act(void* C, bool c_bf16, int64_t M, int64_t N, int64_t ldc, float beta,
                     const void* bias, bool bias_bf16, bool gelu, cudaStream_t stream);

// db[c] += Σ_r dy[r, c] for dy bf16 [rows, cols] (row stride ld); fp32 sums, each column
// summed by one block in a fixed order (deterministic).
void launch_column_sum_accumulate(const uint16_t* dy, int64_t rows, int64_t cols, int64_t ld,
                                  float* db, cudaStream_t stream);

}  // namespace quiver::cuda::detail
