// Internal: launchers of the FlashRelation kernels (src/cuda/relation.h). They take raw device
// pointers, assume the shapes were checked by the entry points (relation.cpp), launch on
// `stream` and check the launches. bf16 buffers are uint16_t (the bits of quiver::bf16).
//
// The tiled kernels (the flash mixer of flash_mixer.cuh with Relation's score rule) are
// templated on the padded head width kPadded (a multiple of 16, at least Dh, the k extent of one
// bf16 mma): lanes d >= Dh are loaded as zeros and never stored. relation.cpp picks the
// instantiation.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace quiver::cuda::detail {

// Sizes of one call: p1, p2, v, y rows are [B, T, H, Dh], stats [B, H, T, 3].
struct RelationDims {
  int64_t B, T, H, Dh;
};

// Constants of the score rule shared by all kernels of one call.
struct RelationRule {
  float scale;    // 1 / sqrt(Dh)
  float inv_tau;  // 1 / tau_s
  bool exchange_only;
};

struct RelationForwardArgs {
  RelationDims dims;
  RelationRule rule;
  const uint16_t* p1;
  const uint16_t* p2;
  const uint16_t* v;
  const float* lambda;  // one F32
  uint16_t* y;
  float* stats;
};

struct RelationBackwardArgs {
  RelationDims dims;
  RelationRule rule;
  const uint16_t* p1;
  const uint16_t* p2;
  const uint16_t* v;
  const float* lambda;
  const uint16_t* y;
  const float* stats;
  const uint16_t* dy;
  uint16_t* dp1;
  uint16_t* dp2;
  uint16_t* dv;
  float* dlambda;   // += dL/dλ, or null
  void* workspace;  // relation_backward_workspace_bytes(B, T, H) bytes, 8-byte aligned
  float* dq_accum;  // null, or the one-pass dQ's fp32 sums (flash::BackwardIo::dq_accum)
};

struct RelationDecodeArgs {
  int64_t B, H, Dh, capacity;
  RelationRule rule;
  const uint16_t* p1;  // [B, H, Dh]
  const uint16_t* p2;
  const uint16_t* v;
  const float* lambda;
  uint16_t* cache_p2;  // [B, capacity, H, Dh]
  uint16_t* cache_v;
  const int32_t* pos;  // one int32: rows already in the cache
  uint16_t* y;         // [B, H, Dh]
};

// Query and key rows per tile; the grids have one block per (tile, head, batch).
inline constexpr int kRelationTile = 64;
// Padded head widths with an instantiation: 16, 32, ..., 128.
inline constexpr int kRelationPadStep = 16;
inline constexpr int kRelationMaxHeadDim = 128;

// The backward's workspace: per-(b, h, query tile) partial sums of dλ (double), then three F32
// row terms per (b, h, p): the log-normalizer of the flow's historical entries
// norm_p = L_p − log g_p, and the Self entry of dR, dR_pp.
inline int64_t relation_tiles(int64_t T) { return (T + kRelationTile - 1) / kRelationTile; }
inline int64_t relation_backward_partials(int64_t B, int64_t T, int64_t H) {
  return B * H * relation_tiles(T);
}
inline int64_t relation_backward_workspace_bytes(int64_t B, int64_t T, int64_t H) {
  return static_cast<int64_t>(sizeof(double)) * relation_backward_partials(B, T, H) +
         static_cast<int64_t>(sizeof(float)) * 3 * B * H * T;
}

template <int kPadded>
void launch_relation_forward(const RelationForwardArgs& args, cudaStream_t stream);
template <int kPadded>
void launch_relation_backward(const RelationBackwardArgs& args, cudaStream_t stream);

void launch_relation_decode(const RelationDecodeArgs& args, cudaStream_t stream);

// Givens head mixing (src/cuda/givens.h, SPEC §2.2), the other half of the Multi-Head Relation
// mixer. States are `rows` rows of H·Dh bf16; pair k of layer `layer` rotates heads
// (a_k, b_k) of ops::givens_pairs by theta[k] (F32, H/2 angles); H is even and at least 2.
// out = G(θ) in (out may equal in).
void launch_givens_forward(const uint16_t* in, const float* theta, int64_t rows, int64_t heads,
                           int64_t head_dim, int64_t layer, uint16_t* out, cudaStream_t stream);
// dtheta[k] += Σ over rows and channels of dOut_b·Ĩ_a − dOut_a·Ĩ_b (Ĩ recomputed from I), in a
// fixed order; then d_in = G(θ)ᵀ d_out (d_in may equal d_out: it is written after the sum).
// Both kernels move two channels at a time (head_dim even, pointers 4-byte aligned). The sums
// go through `partials`, kGivensDthetaBlocks · H/2 doubles of stream-ordered scratch.
constexpr int64_t kGivensDthetaBlocks = 264;
void launch_givens_backward(const uint16_t* d_out, const uint16_t* in, const float* theta,
                            int64_t rows, int64_t heads, int64_t head_dim, int64_t layer,
                            uint16_t* d_in, float* dtheta, double* partials, cudaStream_t stream);
// The same mixing folded into the information projection (givens.h): `rows` rows of H·Dh fp32
// weights (W_I's rows, or b_I as one row). rotate_weight: out = G(θ) w in bf16 (the compute
// copy). weight_backward: dtheta += the sum above with dOut = dw (the gradient of the rotated
// weight) and I = w, then dw = base + G(θ)ᵀ dw. Pointers 8-byte aligned.
void launch_givens_rotate_weight(const float* w, const float* theta, int64_t rows, int64_t heads,
                                 int64_t head_dim, int64_t layer, uint16_t* out, cudaStream_t stream);
void launch_givens_weight_backward(float* dw, const float* base, const float* w, const float* theta, int64_t rows,
                                   int64_t heads, int64_t head_dim, int64_t layer, float* dtheta,
                                   double* partials, cudaStream_t stream);

#define QUIVER_RELATION_DECLARE(P)                                                           \
  extern template void launch_relation_forward<P>(const RelationForwardArgs&, cudaStream_t); \
  extern template void launch_relation_backward<P>(const RelationBackwardArgs&, cudaStream_t);
QUIVER_RELATION_DECLARE(16)
QUIVER_RELATION_DECLARE(32)
QUIVER_RELATION_DECLARE(48)
QUIVER_RELATION_DECLARE(64)
QUIVER_RELATION_DECLARE(80)
QUIVER_RELATION_DECLARE(96)
QUIVER_RELATION_DECLARE(112)
QUIVER_RELATION_DECLARE(128)
#undef QUIVER_RELATION_DECLARE

}  // namespace quiver::cuda::detail
