// Givens head mixing (SPEC §2.2): before the relation flow, the information states of
// head pairs are rotated by one learnable angle per pair per layer.
//
// Pairing (0-based heads; SPEC §2.2 writes them 1-based) alternates with the layer index ℓ:
//   even ℓ: pair k = (2k, 2k+1)              → (0,1), (2,3), …, (H−2, H−1)
//   odd ℓ:  pair k = (2k+1, (2k+2) mod H)    → (1,2), (3,4), …, (H−1, 0)
// For pair k = (a, b) with angle θ_k:
//   Ĩ_a = cos θ_k · I_a − sin θ_k · I_b
//   Ĩ_b = sin θ_k · I_a + cos θ_k · I_b
// Each head belongs to exactly one pair, so the map is an orthogonal rotation.
//
// H must be even; H = 1 (the single-head ablation) is allowed and is the identity with no
// angles (θ has shape [0]). Any other odd H is an error.
//
// Shapes: I, out, dOut, dI are [T, H, Dh] or [B, T, H, Dh], CPU, contiguous, F32 or F64,
// all of one dtype. θ and dθ are [H/2]; θ is F32 (the SPEC's storage type) or the dtype of
// I; dθ has θ's dtype. Angles and the dθ reduction are evaluated in double precision; the
// reduction uses a fixed blocking, so results do not depend on the thread count.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "quiver/tensor.h"

namespace quiver::ops {

// Whether a layer with `heads` heads mixes heads at all (false for H = 1); errors for
// other odd H or H < 1.
bool givens_mixes(int64_t heads);

// The (a, b) head pairs of layer `layer`, pair k at index k; empty when H = 1.
std::vector<std::pair<int64_t, int64_t>> givens_pairs(int64_t heads, int64_t layer);

// out = G_ℓ(θ) I. out may alias I.
void givens_forward(const Tensor& I, const Tensor& theta, int64_t layer, Tensor& out);

// Given dOut = ∂L/∂out, assigns dI = G_ℓ(θ)ᵀ dOut and dθ_k = Σ over rows and channels of
//   dOut_a · (−sin θ_k I_a − cos θ_k I_b) + dOut_b · (cos θ_k I_a − sin θ_k I_b)
// (both assigned, not accumulated). dI may alias dOut.
void givens_backward(const Tensor& dOut, const Tensor& I, const Tensor& theta, int64_t layer,
                     Tensor& dI, Tensor& dTheta);

}  // namespace quiver::ops
