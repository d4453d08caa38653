// Linear Relation (SPEC §2.4) on the CPU: a gated linear recurrence over a per-head state
// C ∈ R^{Dh×Dh} (rows: relation coordinates, columns: information channels), C_{-1} = 0:
//
//   S_t  = sigmoid(p1_t · p2_t / (τ_S sqrt(Dh)))      raw p1, p2 (after RoPE)
//   p̂_t  = p_t / max(‖p_t‖, kLinearRelationNormEps)    for p1 and p2
//   C_t⁻ = Diag(α_t) C_{t−1},  α_t = exp(g_t)
//   E_t  = S_t (C_t⁻)ᵀ p̂1_t                             read before write: strictly causal, E_0 = 0
//   C_t  = C_t⁻ + S_t p̂2_t v_tᵀ
//   y_t  = v_t + E_t
//
// Shapes: p1, p2, v (= Ĩ), g (= log α) are [T, H, Dh] or [B, T, H, Dh], contiguous, all F32
// or all F64; the op computes in that dtype. g must be finite and <= 0 (α ∈ (0, 1]); a g > 0
// is rejected with an error naming the tensor and the element.
// The norm clamp (as torch.nn.functional.normalize) keeps p = 0 finite: p̂ = 0 there and the
// gradient is dp̂ / eps; for ‖p‖ > eps it is the exact normalization.
//
// Contract for outputs: every output tensor is preallocated by the caller with the inputs'
// shape and dtype (the decode state excepted) and is assigned (=), never accumulated into.
// The ops parallelize over (batch, head) with quiver::parallel_for.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

inline constexpr double kLinearRelationNormEps = 1e-12;
inline constexpr int64_t kLinearRelationDefaultChunk = 64;
inline constexpr double kLinearRelationDefaultTau = 2.0;

// The plain recurrence, one token at a time: the reference.
void linear_relation_recurrent_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                       const Tensor& g, const Tensor& y,
                                       double tau_s = kLinearRelationDefaultTau);

// Reverse-time recurrence for dC. Memory per (batch, head): the state every max(Dh, 16)
// tokens (about T·Dh values) plus the states of one such segment, recomputed from its
// checkpoint. dp1, dp2, dv, dg are assigned.
void linear_relation_recurrent_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                        const Tensor& g, const Tensor& dy, const Tensor& dp1,
                                        const Tensor& dp2, const Tensor& dv, const Tensor& dg,
                                        double tau_s = kLinearRelationDefaultTau);

// Chunkwise-parallel form, equal to the recurrence: within a chunk of `chunk` tokens the
// decays come from the cumulative log-decay G relative to the chunk start, and only
// exp(G_i − G_j) with j <= i (never a positive exponent) is formed, so long sequences with
// strong decay stay finite; between chunks the state C carries the history.
void linear_relation_chunked_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                     const Tensor& g, const Tensor& y,
                                     int64_t chunk = kLinearRelationDefaultChunk,
                                     double tau_s = kLinearRelationDefaultTau);

// Backward of the chunked form. Memory per (batch, head): the state entering every
// ceil(Dh / chunk)-th chunk (about T·Dh values) plus O(chunk·Dh + Dh²) scratch.
void linear_relation_chunked_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                      const Tensor& g, const Tensor& dy, const Tensor& dp1,
                                      const Tensor& dp2, const Tensor& dv, const Tensor& dg,
                                      int64_t chunk = kLinearRelationDefaultChunk,
                                      double tau_s = kLinearRelationDefaultTau);

// Chunked forward that also returns the final state C_{T−1}, shape [B, H, Dh, Dh] (B = 1 for
// 3-d inputs) in `state_dtype`: F32 (the decode-state precision of SPEC §2.4) or the inputs'
// dtype. Decoding from it continues the sequence exactly as the full forward would.
Tensor linear_relation_prefill(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                               const Tensor& y, DType state_dtype = DType::F32,
                               int64_t chunk = kLinearRelationDefaultChunk,
                               double tau_s = kLinearRelationDefaultTau);

// One decode step for one new token per sequence: rows p1, p2, v, g and y are [B, H, Dh];
// `state` [B, H, Dh, Dh] (F32 or the rows' dtype) is updated in place from C_{t−1} to C_t
// and y_row is assigned v + E. Arithmetic is in the rows' dtype; no allocation.
void linear_relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                                 const Tensor& g_row, const Tensor& state, const Tensor& y_row,
                                 double tau_s = kLinearRelationDefaultTau);

// KDA-style retention gate (SPEC §2.4), row convention:
//   r = x̄ W_down W_up,   g = −exp(A_log[h]) ⊙ softplus(r + dt_bias)   (so g <= 0)
// x̄ [T, D] or [B, T, D] (the block's normalized input), W_down [D, Dh], W_up [Dh, H·Dh],
// A_log [H], dt_bias [H·Dh]; g [T, H, Dh] or [B, T, H, Dh]. All F32 or all F64.
// softplus(z) = max(z, 0) + log1p(exp(−|z|)), stable for any |z|.
void retention_gate_forward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                            const Tensor& a_log, const Tensor& dt_bias, const Tensor& g);

// Given dg (shape of g), assigns dx, dw_down, dw_up, da_log, ddt_bias (shapes of their
// inputs). Recomputes r rather than saving it.
void retention_gate_backward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                             const Tensor& a_log, const Tensor& dt_bias, const Tensor& dg,
                             const Tensor& dx, const Tensor& dw_down, const Tensor& dw_up,
                             const Tensor& da_log, const Tensor& ddt_bias);

}  // namespace quiver::ops
