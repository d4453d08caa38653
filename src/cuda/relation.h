// Self–Exchange Relation on the GPU (SPEC §2.1–2.3, §2.5, §2.6): the exact tiled FlashRelation
// forward and backward and the Relation Cache decode step, the CUDA counterparts of
// ops::flash_relation_forward / flash_relation_backward / relation_decode_step
// (src/ops/relation.h), with the same semantics: per head, U_pj = p1_p · p2_j / sqrt(Dh),
// S_p = sigmoid(U_pp / τ_S), an online-softmax scan over E_pj = SiLU(U_pj) for j < p, the gate
// g_p = sigmoid(L_p − λ log(p+1) − S_p) and Y_p = (1 − g_p) Ĩ_p + g_p Ī_p; the first token has
// no history (g_0 = 0, Y_0 = Ĩ_0). Exchange-only transport: Y_p = g_p Ī_p, Y_0 = 0.
//
// Shapes (glossary: B batch, T time, H heads, Dh head width): p1, p2, v (= Ĩ, after the Givens
// mixing), y, dy, dp1, dp2, dv [B, T, H, Dh] BF16, or [T, H, Dh] meaning B = 1; p1 and p2 are
// after RoPE. stats [B, H, T, 3] F32 (or [H, T, 3]) with the columns of ops::RelationStat:
// L_p = LSE_{j<p} E_pj (−inf at p = 0), S_p, g_p (0 at p = 0). 1 <= Dh <= 128 (padded inside
// to a multiple of 16). λ is one F32 in device memory (the layer's, shared by the heads), read
// only on the device.
//
// Precision (shared/DESIGN.md): inputs and outputs bf16, the statistics in fp32; each bf16
// output is rounded once. The tiled kernels are the flash attention's tensor-core mixer
// (attention.h, flash_mixer.cuh) with Relation's score rule: p1, p2, Ĩ, dY enter mma.sync
// exactly (bf16) with fp32 accumulation; the flow weights (forward, dĨ) and dU (dp1, dp2) are
// rounded to bf16 as mma operands, as in FlashAttention; the online softmax, the gate, D_p and
// the row terms stay fp32. σ inside SiLU is (1 + tanh(U/2)) / 2 with the hardware tanh.approx
// (relative error about 2^-11, below the bf16 rounding of the weights), so L_p carries an
// absolute error up to about 2^-12 · max|U|; S_p and the gate's sigmoid are exact fp32.
//
// Contract: every tensor is a contiguous CUDA tensor, preallocated by the caller (no call
// allocates). Each call enqueues its kernels on `stream`, never synchronizes the host and is
// capturable in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::cuda {

struct RelationKernelOptions {
  float tau_s = 2.0f;          // Self temperature τ_S > 0
  bool exchange_only = false;  // the exchange-only transport ablation (SPEC §2.6)
};

// Assigns y (shape of p1) and stats (the per-row statistics the backward reads).
void flash_relation_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                            const float* lambda, Tensor& y, Tensor& stats,
                            const RelationKernelOptions& options, cudaStream_t stream = nullptr);

// Bytes of the backward's workspace for inputs [B, T, H, Dh] (independent of Dh): two F32 row
// terms (the flow's normalizer and dR_pp) per row, and one double per (b, h, 64-row query
// tile) for the fixed-order dλ reduction.
int64_t flash_relation_backward_workspace_bytes(int64_t B, int64_t T, int64_t H);

// Backward from the forward's y and stats and the upstream gradient dy (shape of y), SPEC §2.3
// with D_p = dY_p · Y_p (the bf16 y). Assigns dp1, dp2, dv (shapes of the inputs); when
// dlambda_accumulate (a device F32 scalar) is not null, adds dL/dλ = Σ_p log(p+1) dR_pp,
// summed over batch and heads, to it. workspace: a contiguous CUDA tensor of any dtype with
// at least flash_relation_backward_workspace_bytes(B, T, H) bytes (contents are scratch).
// Deterministic: dp2/dv by one pass over the query tiles per key tile, dp1 by a pass over the
// key tiles per query tile, dλ by per-tile partials summed in a fixed order (no atomics).
void flash_relation_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                             const float* lambda, const Tensor& y, const Tensor& stats,
                             const Tensor& dy, Tensor& dp1, Tensor& dp2, Tensor& dv,
                             float* dlambda_accumulate, const RelationKernelOptions& options,
                             Tensor& workspace, cudaStream_t stream = nullptr);

// One decode step for B sequences in lockstep at position pos = *d_pos (a device int32: the
// number of tokens already in the cache). p1_row, p2_row, v_row, y_row BF16 [B, H, Dh];
// cache_p2, cache_v BF16 [B, capacity, H, Dh]. Writes p2_row and v_row into the caches at row
// pos, then assigns y_row: S_p from the row's own p1·p2, the online-softmax scan over the
// cached rows < pos, as ops::relation_decode_step. pos is read only on the device, so one
// captured graph replays at every position; the caller guarantees pos < capacity. No scratch.
void relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                          const float* lambda, Tensor& cache_p2, Tensor& cache_v,
                          const int32_t* d_pos, Tensor& y_row, const RelationKernelOptions& options,
                          cudaStream_t stream = nullptr);

}  // namespace quiver::cuda
