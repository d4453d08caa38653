// Givens head mixing on the GPU (SPEC §2.2), the CUDA counterpart of ops::givens_forward /
// givens_backward (src/ops/givens.h): before the relation flow, the information states of
// head pairs are rotated by one learnable angle per pair per layer,
//   Ĩ_a = cos θ_k · I_a − sin θ_k · I_b,   Ĩ_b = sin θ_k · I_a + cos θ_k · I_b,
// with the pairing (a, b) of pair k given by ops::givens_pairs(H, layer): even layers
// (0,1), (2,3), …; odd layers (1,2), (3,4), …, (H−1, 0). H = 1 is the identity (no angles);
// other odd H are an error.
//
// Shapes (states): I, out, dOut, dI BF16 [..., H, Dh] (any leading dims, e.g. [B, T, H, Dh] or
// [B, H, Dh]); theta and dtheta_accumulate F32 [H/2]. All contiguous CUDA tensors, 4-byte
// aligned, with Dh even (when H > 1).
// Precision: cos and sin in fp32, rotations in fp32 with one bf16 rounding per output; the
// dθ sums accumulate in fp64.
// Each call enqueues its kernels on `stream`, allocates nothing, never synchronizes the host
// and is capturable in a CUDA graph. The backward's dθ sums use the device's GEMM workspace
// (context.h), stream-ordered like the GEMMs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::cuda {

// Assigns out = G_ℓ(θ) I. out may alias I.
void givens_forward(const Tensor& I, const Tensor& theta, int64_t layer, Tensor& out,
                    cudaStream_t stream = nullptr);

// Assigns dI = G_ℓ(θ)ᵀ dOut (dI may alias dOut) and accumulates
//   dtheta_accumulate[k] += Σ over rows and channels of dOut_b · Ĩ_a − dOut_a · Ĩ_b
// with Ĩ recomputed from I. Deterministic: each angle's sum runs in a fixed order (fixed row
// ranges per block, then the blocks' partials in order), without atomics.
void givens_backward(const Tensor& dOut, const Tensor& I, const Tensor& theta, int64_t layer,
                     Tensor& dI, Tensor& dtheta_accumulate, cudaStream_t stream = nullptr);

// The mixing folded into the information projection. With I = X W_I + b_I, the rotation acts on
// W_I's head blocks of columns (and b_I's): Ĩ = X W̃ + b̃ with W̃ = G_ℓ(θ) W_I and b̃ = G_ℓ(θ) b_I
// taken row by row, so the model multiplies by W̃ and never rotates the states. Exact up to
// rounding (W̃ rounded to bf16 once, as W_I's own compute copy would be).
// w: F32 [..., H, Dh] (W_I [K, H·Dh] viewed as [K, H, Dh], or b_I as [H, Dh]), out BF16 of the
// same shape: out = G_ℓ(θ) w.
void givens_rotate_weight(const Tensor& w, const Tensor& theta, int64_t layer, Tensor& out,
                          cudaStream_t stream = nullptr);
// dw: F32, on entry the gradient of the rotated weight (dW̃, from the projection's backward),
// on return base + G_ℓ(θ)ᵀ dW̃ (base: the gradient accumulated before, F32 like dw; may not be
// dw). dtheta_accumulate[k] += Σ dW̃_b · W̃_a − dW̃_a · W̃_b with W̃ recomputed from w (the
// masters). Deterministic like givens_backward. Tensors 8-byte aligned, Dh even.
void givens_weight_backward(Tensor& dw, const Tensor& base, const Tensor& w, const Tensor& theta, int64_t layer,
                            Tensor& dtheta_accumulate, cudaStream_t stream = nullptr);

}  // namespace quiver::cuda
