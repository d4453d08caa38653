// Linear Relation (SPEC §2.4) on the GPU: the chunkwise forward and backward, the prefill that
// returns the final state, the recurrent decode step, and the KDA-style retention gate; the
// CUDA counterparts of src/ops/linear_relation.h, with the same semantics:
//   S_t = sigmoid(p1_t · p2_t / (τ_S sqrt(Dh))) on the raw p1, p2 (after RoPE),
//   p̂ = p / max(‖p‖, 1e-12), C_t⁻ = Diag(exp g_t) C_{t−1}, E_t = S_t (C_t⁻)ᵀ p̂1_t (read before
//   write: strictly causal), C_t = C_t⁻ + S_t p̂2_t v_tᵀ, y_t = v_t + E_t, C_{−1} = 0.
//
// Shapes (B batch, T time, H heads, Dh head width <= 128): p1, p2, v, y, dy, dp1, dp2, dv BF16
// [B, T, H, Dh] ([T, H, Dh] means B = 1); g, dg F32 of that shape; states F32 [B, H, Dh, Dh]
// with C[r, c] (r: relation coordinate, c: information channel), as ops::linear_relation_prefill.
// g must be finite and <= 0; it is not checked on the device (that would need a host sync).
//
// Precision (shared/DESIGN.md): bf16 inputs and outputs, every product and sum in fp32, the
// state C and its gradient in fp32; each bf16 output is rounded once, dg and states are fp32.
//
// Algorithm: chunks of 64 tokens per (b, h). Within a chunk the strictly-causal part uses the
// decays exp(G_i − G_j), j <= i, of the cumulative log-decay G from the chunk start (never a
// positive exponent, as the CPU chunked form); across chunks the state carries the history.
// Chunks are independent given their entering state, so a pass is three chunk-parallel steps:
// each chunk's own contribution to the state, an fp32 scan over the chunks, then the outputs
// (forward) or all input gradients (backward, which first recomputes the forward's states and
// scans dL/dC in reverse). Grids have B·H·ceil(T/64) blocks. Scalar fp32 on CUDA cores.
//
// Contract: every tensor is a contiguous CUDA tensor (call register_backend() first) of the
// stated shape and dtype; outputs are preallocated by the caller and assigned (=) unless marked
// +=. Each call enqueues its kernels on `stream`, allocates nothing and never synchronizes the
// host (capturable in a CUDA graph). Deterministic: fixed-order sums, no atomics.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "quiver/tensor.h"

namespace quiver::cuda {

// Bytes of device workspace the forward and the backward need (one size serves both): per
// (b, h) the fp32 state entering every chunk and dL/dC after every chunk, 2·ceil(T/64)·Dh²
// floats (about 2·T·Dh²/64: T/chunk·Dh² is what is stored, O(T·Dh) for Dh <= 64), plus
// ceil(T/64)·Dh floats of chunk decays. Never O(T²).
int64_t linear_relation_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t Dh);

// y (BF16, shape of p1) assigned. p1, p2 after RoPE, v = Ĩ after Givens, g F32 the log-decay.
// final_state: null, or F32 [B, H, Dh, Dh] assigned with C_{T−1} (the prefill for decoding).
// workspace: any contiguous CUDA tensor of at least linear_relation_workspace_bytes bytes.
void linear_relation_forward(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                             Tensor& y, float tau_s, Tensor& workspace, Tensor* final_state,
                             cudaStream_t stream = nullptr);

// From dy (BF16, shape of y): dp1, dp2, dv BF16 and dg F32 assigned (shapes of the inputs).
// Recomputes the forward's chunk states into the workspace (the forward's need not be kept).
void linear_relation_backward(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                              const Tensor& dy, Tensor& dp1, Tensor& dp2, Tensor& dv, Tensor& dg,
                              float tau_s, Tensor& workspace, cudaStream_t stream = nullptr);

// One token per sequence: p1_row, p2_row, v_row, y_row BF16 [B, H, Dh]; g_row F32 [B, H, Dh];
// state F32 [B, H, Dh, Dh] updated in place C_{t−1} -> C_t (fp32); y_row assigned. No scratch.
void linear_relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                                 const Tensor& g_row, Tensor& state, Tensor& y_row, float tau_s,
                                 cudaStream_t stream = nullptr);

// Retention gate, row form r = x W_down W_up, g = −exp(A_log[h]) ⊙ softplus(r + dt_bias)
// (column j of g belongs to head j / Dh; softplus in the stable form of the CPU op).
// x BF16 [N, D]; w_down BF16 [D, Dh]; w_up BF16 [Dh, H·Dh]; a_log F32 [H]; dt_bias F32 [H·Dh];
// r_down BF16 [N, Dh] assigned (= x W_down, kept for the backward); g F32 [N, H·Dh] assigned
// (r accumulated in fp32 by cuda::gemm straight into g, then activated in place).
void retention_gate_forward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                            const Tensor& a_log, const Tensor& dt_bias, Tensor& r_down, Tensor& g,
                            cudaStream_t stream = nullptr);

// From dg F32 [N, H·Dh]: dx_accumulate BF16 [N, D] += dx; dw_down_accumulate F32 [D, Dh],
// dw_up_accumulate F32 [Dh, H·Dh], da_log_accumulate F32 [H], ddt_bias_accumulate F32 [H·Dh] +=.
// Deterministic: cuBLASLt GEMMs (fp32 accumulation) and fixed-order reductions, no atomics.
// r is recomputed from r_down into scratch_dr (BF16 [N, H·Dh], so z = r + dt_bias sees r
// rounded to bf16), which then holds dz = dL/dz in bf16 for the GEMMs; scratch_dr_down
// (BF16 [N, Dh]) holds dL/d(r_down). ddt_bias and da_log sum the fp32 dz and dg·g.
void retention_gate_backward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                             const Tensor& a_log, const Tensor& dt_bias, const Tensor& r_down,
                             const Tensor& dg, Tensor& dx_accumulate, Tensor& dw_down_accumulate,
                             Tensor& dw_up_accumulate, Tensor& da_log_accumulate,
                             Tensor& ddt_bias_accumulate, Tensor& scratch_dr,
                             Tensor& scratch_dr_down, cudaStream_t stream = nullptr);

}  // namespace quiver::cuda
