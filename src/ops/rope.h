// Rotary position embedding (RoPE) over the full head width (SPEC §2.1: full-head RoPE,
// base 10^4 by default).
//
// Convention ("rotate_half", as in GPT-NeoX and Llama): for head width Dh (even) and
// pair index i ∈ [0, Dh/2), the elements (i, i + Dh/2) of a head at absolute position p
// are rotated by the angle  θ(p, i) = p · base^(−2i/Dh):
//
//   y[i]        = x[i] · cos θ − x[i + Dh/2] · sin θ
//   y[i + Dh/2] = x[i] · sin θ + x[i + Dh/2] · cos θ
//
// i.e. the complex number x[i] + j·x[i + Dh/2] is multiplied by e^{jθ}. The rotation is
// orthogonal, so the backward pass is the inverse rotation (angle −θ).
//
// Shapes: x is [T, H, Dh] or [B, T, H, Dh], CPU, contiguous, F32 or F64. Row t holds
// absolute position pos0 + t (the same positions for every batch row), so decoding the
// token at position p passes T = 1 and pos0 = p. Angles are evaluated in double precision
// for either dtype.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

inline constexpr double kRopeBase = 10000.0;

// Raw kernel over contiguous [batch, seq, heads, head_dim] memory. `inverse` rotates by −θ.
// y may equal x (in place); otherwise the two must not overlap.
template <typename T>
void rope_apply(const T* x, T* y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                int64_t pos0, double base, bool inverse);

// y = R(pos) x. y has x's shape and dtype; y may alias x.
void rope_forward(const Tensor& x, Tensor& y, int64_t pos0, double base = kRopeBase);
// dx = R(pos)ᵀ dy (the inverse rotation). dx has dy's shape and dtype; dx may alias dy.
void rope_backward(const Tensor& dy, Tensor& dx, int64_t pos0, double base = kRopeBase);

}  // namespace quiver::ops
