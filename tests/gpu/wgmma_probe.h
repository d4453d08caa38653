// Test kernels of src/cuda/wgmma.cuh: one warpgroup computes a 64 x 64 product from bf16
// operands laid out as the flash and projection kernels would lay them out, so the GPU tests can
// check the descriptors, the swizzle and the fragment layouts against a float64 reference.
#pragma once
#include <cstdint>

namespace quiver::gpu_testing {

// c [64, 64] fp32 = a [64, k] · b [64, k]ᵀ (row-major, bf16 bits), k = 64 or 128: both operands
// K-major in shared memory (k = 128: two 64-wide panels each), as S = Q Kᵀ reads them.
void wgmma_k_major(const uint16_t* a, const uint16_t* b, float* c, int k);

// c [64, n] fp32 = a [64, 64] · b [64, n] (row-major, bf16 bits), n = 64 or 128 (two panels):
// A from registers (the m16n8k16 fragments), B MN-major in shared memory (its rows are the k
// index), as O = P V reads them. lbo and sbo are the descriptor's byte offsets (wgmma.cuh).
void wgmma_registers_mn_major(const uint16_t* a, const uint16_t* b, float* c, int n, uint32_t lbo,
                              uint32_t sbo);

// c [64, 64] fp32 = aᵀ · b for a [64 k, 64 m] and b [64 k, 64 n] (row-major, bf16 bits): both
// operands MN-major in shared memory, as the one-pass dQ = dS K reads dSᵀ and K.
void wgmma_mn_major(const uint16_t* a, const uint16_t* b, float* c);

}  // namespace quiver::gpu_testing
