// Self–Exchange Relation (SPEC §2.1–2.3, §2.5, §2.6) on the CPU: a materialized reference,
// the exact tiled FlashRelation (forward and backward), and Relation Cache decoding.
//
// Per head (width Dh), positions p = 0..T-1, inputs after RoPE (p1, p2) and after the Givens
// mixing (v = Ĩ):
//   U_pj = p1_p · p2_j / sqrt(Dh)
//   S_p  = sigmoid(U_pp / tau_s)
//   E_pj = SiLU(U_pj)
//   R_pj = S_p (j = p),  E_pj − λ log(p+1) (j < p),  −inf (j > p)
//   F_p  = softmax(R_p),  Y_p = Σ_{j≤p} F_pj Ĩ_j
// Factorized (what FlashRelation computes): L_p = LSE_{j<p} E_pj, A_p = L_p − λ log(p+1),
// g_p = sigmoid(A_p − S_p) = Σ_{j<p} F_pj, Ī_p = Σ_{j<p} softmax_{j<p}(E_pj) Ĩ_j,
// Y_p = (1 − g_p) Ĩ_p + g_p Ī_p. The first token has no history: g_0 = 0, Y_0 = Ĩ_0.
//
// Exchange-only ablation (SPEC §2.6; the Relation paper's App. D.1): F is the complete flow
// above, Self included and not renormalized, and only its historical entries transport:
// Y_p = Σ_{j<p} F_pj Ĩ_j = g_p Ī_p. The Self entry still competes for mass through F_pp, so S,
// τ_S and λ keep their gradients. The first token transports nothing: Y_0 = 0.
//
// Shapes: p1, p2, v [B, T, H, Dh], or [T, H, Dh] meaning B = 1 (outputs then drop B too).
// Inputs are contiguous CPU tensors of one dtype, F32 or F64; the computation runs in that
// dtype. λ is one scalar shared by the heads (double in this API, converted to the dtype).
// Outputs: pass an undefined Tensor to have it allocated, or a contiguous CPU tensor of the
// stated shape and the inputs' dtype; every output is assigned (=), never accumulated into.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

struct RelationOptions {
  double tau_s = 2.0;          // Self temperature τ_S > 0
  bool exchange_only = false;  // the exchange-only transport ablation (see above)
  int64_t tile = 64;           // FlashRelation: query rows and key columns per tile
};

// Reference, written for clarity: materializes U, R and F of each head (T×T) exactly as above.
void relation_reference_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                double lambda, Tensor& y, const RelationOptions& options = {});

// Reference backward (SPEC §2.3 on the materialized F) from the upstream gradient dy (shape
// of y): writes dp1, dp2, dv (shapes of the inputs) and returns dL/dλ, summed over batch and
// heads. A frozen λ (the no-count-calibration ablation) simply ignores the returned value.
double relation_reference_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                   double lambda, const Tensor& dy, Tensor& dp1, Tensor& dp2,
                                   Tensor& dv, const RelationOptions& options = {});

// The reference's materialized flow F, [B, H, T, T] (or [H, T, T] for 3-d inputs), zero above
// the diagonal; for tests of the factorization.
Tensor relation_reference_flow(const Tensor& p1, const Tensor& p2, double lambda,
                               const RelationOptions& options = {});

// Columns of FlashRelation's per-row statistics, stats [B, H, T, 3] (or [H, T, 3]).
enum RelationStat : int64_t {
  kRelationLogExchange = 0,  // L_p = m + log l = LSE_{j<p} E_pj; −inf for p = 0
  kRelationSelf = 1,         // S_p
  kRelationGate = 2,         // g_p = sigmoid(A_p − S_p); 0 for p = 0
  kRelationStatCount = 3,
};

// FlashRelation forward: for each tile of query rows, an online-softmax scan with state
// (m, l, z) over the strictly-historical key tiles (Self is not in the scan); then
// A_p = m + log l − λ log(p+1), g_p = sigmoid(A_p − S_p), Y_p = (1 − g_p) Ĩ_p + g_p z/l.
// Never forms a T×T array. Writes y (shape of p1) and stats (for the backward).
void flash_relation_forward(const Tensor& p1, const Tensor& p2, const Tensor& v, double lambda,
                            Tensor& y, Tensor& stats, const RelationOptions& options = {});

// FlashRelation backward from the forward's y and stats: recomputes U tile by tile (tiles of
// query rows and key columns) and applies SPEC §2.3 with D_p = dY_p · Y_p. Writes dp1, dp2, dv
// and returns dL/dλ = Σ_p log(p+1) dR_pp. Same options as the forward.
double flash_relation_backward(const Tensor& p1, const Tensor& p2, const Tensor& v, double lambda,
                               const Tensor& y, const Tensor& stats, const Tensor& dy,
                               Tensor& dp1, Tensor& dp2, Tensor& dv,
                               const RelationOptions& options = {});

// Bytes of working arrays (beyond inputs, outputs and stats) that one call allocates, for the
// benchmark's memory column: the reference O(T²) per thread, FlashRelation O(tile² + tile·Dh)
// per thread in the forward and O(tile² + T) per thread in the backward.
int64_t relation_reference_workspace_bytes(const Shape& p1_shape, DType dtype, bool backward);
int64_t flash_relation_workspace_bytes(const Shape& p1_shape, DType dtype, bool backward,
                                       int64_t tile = 64);

// The Relation Cache of one Full Relation layer for B sequences decoded in lockstep (a model
// keeps one per Full layer): p2 after RoPE and Ĩ after the Givens mixing of every past token,
// the same size as a KV cache. Rows [0, length) hold positions 0..length-1.
struct RelationCache {
  RelationCache() = default;
  RelationCache(int64_t batch, int64_t capacity, int64_t heads, int64_t head_dim, DType dtype);

  Tensor p2, v;  // [B, capacity, H, Dh]
  int64_t length = 0;

  int64_t batch() const { return p2.dim(0); }
  int64_t capacity() const { return p2.dim(1); }
  int64_t heads() const { return p2.dim(2); }
  int64_t head_dim() const { return p2.dim(3); }

  // Appends the prompt's rows at prefill: p2_rows and v_rows [B, n, H, Dh], or [n, H, Dh] when
  // B = 1. Throws when the capacity would be exceeded.
  void append(const Tensor& p2_rows, const Tensor& v_rows);
  // Appends one decode step's rows, [B, H, Dh].
  void append_row(const Tensor& p2_row, const Tensor& v_row);
  void clear() { length = 0; }
};

// One decode step at position p = cache.length: p1_row, p2_row, v_row [B, H, Dh] are the new
// token's rows. Forms S_p from the row's own p1·p2, scans the cached history (p2, Ĩ of
// positions < p) with the online softmax, writes y_row [B, H, Dh], then appends p2_row and
// v_row to the cache. Uses no scratch arrays.
void relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                          double lambda, RelationCache& cache, Tensor& y_row,
                          const RelationOptions& options = {});

}  // namespace quiver::ops
