// Test kernels of src/cuda/wgmma.cuh and src/cuda/tma.cuh: one warpgroup computes a product from
// bf16 operands laid out in wgmma::Panels tiles as the flash kernels lay them out, or loads such
// tiles by the tensor memory accelerator, so the GPU tests can check the descriptors, the
// swizzles and the fragment layouts against a float64 reference.
#pragma once
#include <cstdint>

namespace quiver::gpu_testing {

// The tile widths the probes take: every panel layout (panels of 16, 32 and 64 columns, 48
// padded to 64, one to five panels).
inline constexpr int kProbeWidths[] = {16, 32, 48, 64, 80, 96, 128};

// c [64, 64] fp32 = a [64, k] · b [64, k]ᵀ (row-major, bf16 bits), k one of kProbeWidths: both
// operands K-major tiles in shared memory, as S = Q Kᵀ reads them.
void wgmma_k_major(const uint16_t* a, const uint16_t* b, float* c, int k);

// c [64, n] fp32 = a [64, 64] · b [64, n] (row-major, bf16 bits), n one of kProbeWidths: A from
// registers (the m16n8k16 fragments), B an MN-major tile (its rows are the k index), as O = P V
// reads them.
void wgmma_registers_mn_major(const uint16_t* a, const uint16_t* b, float* c, int n);

// c [64, n] fp32 = aᵀ · b for a [64 k, 64 m] and b [64 k, n] (row-major, bf16 bits), n one of
// kProbeWidths: both operands MN-major in shared memory, as the one-pass dQ = dS K reads dSᵀ and K.
void wgmma_mn_major(const uint16_t* a, const uint16_t* b, float* c, int n);

// out [64, k] (bf16 bits) = the 64-row tile at row0, columns [col0, col0 + k) of the row-major
// matrix m [rows, cols] (device memory, ld = cols), loaded by TMA into a Panels<k> tile (one box
// per panel) and read back through Panels<k>::offset; zeros outside the matrix.
void tma_tile(const uint16_t* m, int64_t rows, int64_t cols, int row0, int col0, uint16_t* out, int k);

// out [64, k] (bf16 bits) = rows t0 .. t0 + 63 of head h in batch b of the [B, T, H, Dh] tensor m
// (device, Dh <= k, a multiple of 8), loaded by TMA through cuda::tma_map_heads_bf16 into a
// Panels<k> tile (one box per panel) and read back; zeros past T and past Dh.
void tma_head_tile(const uint16_t* m, int64_t B, int64_t T, int64_t H, int64_t Dh, int b, int h, int t0,
                   uint16_t* out, int k);

// c [64, 64] fp32 = A · Bᵀ for the 64-row tiles at row0 of a [rows, k] and b [rows, k] (device,
// row-major), both loaded by TMA and read K-major by wgmma, as S = Q Kᵀ would read them.
void tma_k_major(const uint16_t* a, const uint16_t* b, int64_t rows, int row0, float* c, int k);

}  // namespace quiver::gpu_testing
