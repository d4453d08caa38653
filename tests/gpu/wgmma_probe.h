// Test kernels of src/cuda/wgmma.cuh: one warpgroup computes a product from bf16 operands laid
// out in wgmma::Panels tiles as the flash kernels lay them out, so the GPU tests can check the
// descriptors, the swizzles and the fragment layouts against a float64 reference.
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

}  // namespace quiver::gpu_testing
