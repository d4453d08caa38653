// Internal: launchers of the flash attention kernels (src/cuda/attention.h). They take raw
// device pointers, assume the shapes were checked by the entry points (attention.cpp), launch
// on `stream` and check the launches. bf16 buffers are uint16_t (the bits of quiver::bf16).
//
// The flash kernels are templated on the padded head width kPadded (a multiple of 16, at least
// Dh, the k extent of one bf16 mma): lanes d >= Dh are loaded as zeros and never stored.
// attention.cpp picks the instantiation. The decode kernel picks its own from Dh.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// Sizes of one call; q rows are [B, T, Hq, Dh], k/v rows [B, T, Hkv, Dh], lse [B, Hq, T].
struct AttentionDims {
  int64_t B, T, Hq, Hkv, Dh;
};

struct AttentionForwardArgs {
  AttentionDims dims;
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* y;
  float* lse;
};

struct AttentionBackwardArgs {
  AttentionDims dims;
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* y;
  const float* lse;
  const uint16_t* dy;
  uint16_t* dq;
  uint16_t* dk;
  uint16_t* dv;
  float* delta;     // scratch: B·Hq·T floats (D_p = dy_p · y_p), stream-ordered
  float* dq_accum;  // null, or the one-pass dQ's fp32 sums (flash::BackwardIo::dq_accum)
};

// One decode step (attention_decode_step): q, y [B, Hq, Dh]; k, v [B, Hkv, Dh];
// cache_k, cache_v [B, capacity, Hkv, Dh]; *pos (device) is the cache row written.
struct AttentionDecodeArgs {
  int64_t B, Hq, Hkv, Dh, capacity;
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* cache_k;
  uint16_t* cache_v;
  const int32_t* pos;
  uint16_t* y;
};

// Key rows per tile and query rows per forward / dQ block; the grids have one block per
// (tile, head, batch).
inline constexpr int kAttentionTile = 64;
// Padded head widths with an instantiation: 16, 32, ..., 128.
inline constexpr int kAttentionPadStep = 16;
inline constexpr int kAttentionMaxHeadDim = 128;

// The one-pass dQ's sums (flash_dq_atomics): per (batch, query head) a block of
// [flash_dq_sum_rows(T), Dh rounded up to the pad step] floats.
__host__ __device__ inline int64_t flash_dq_sum_rows(int64_t T) {
  return (T + kAttentionTile - 1) / kAttentionTile * kAttentionTile;
}
inline int64_t flash_dq_sum_floats(const AttentionDims& d) {
  const int64_t w = (d.Dh + kAttentionPadStep - 1) / kAttentionPadStep * kAttentionPadStep;
  return d.B * d.Hq * flash_dq_sum_rows(d.T) * w;
}
// The backward runs on wgmma up to this padded head width: beyond it the dK and dV accumulators
// (a warp's 16 x padded width each) and the score tiles no longer fit the registers, and
// mma.sync kernels take over (flash_mixer.cuh).
inline constexpr int kWgmmaBackwardWidth = 96;
// The head widths of the one-pass dQ (flash_dq_atomics), which runs in the warp-specialized
// dK/dV pass: on wgmma, and multiples of 8, as its TMA loads need 16-byte row strides. Other
// widths keep the two passes, so only these need the sums.
inline bool flash_dq_one_pass(int64_t Dh) {
  return Dh % 8 == 0 && (Dh + kAttentionPadStep - 1) / kAttentionPadStep * kAttentionPadStep <= kWgmmaBackwardWidth;
}

template <int kPadded>
void launch_attention_forward(const AttentionForwardArgs& args, cudaStream_t stream);
template <int kPadded>
void launch_attention_backward(const AttentionBackwardArgs& args, cudaStream_t stream);

void launch_attention_decode(const AttentionDecodeArgs& args, cudaStream_t stream);

#define QUIVER_ATTENTION_DECLARE(P)                                                            \
  extern template void launch_attention_forward<P>(const AttentionForwardArgs&, cudaStream_t); \
  extern template void launch_attention_backward<P>(const AttentionBackwardArgs&, cudaStream_t);
QUIVER_ATTENTION_DECLARE(16)
QUIVER_ATTENTION_DECLARE(32)
QUIVER_ATTENTION_DECLARE(48)
QUIVER_ATTENTION_DECLARE(64)
QUIVER_ATTENTION_DECLARE(80)
QUIVER_ATTENTION_DECLARE(96)
QUIVER_ATTENTION_DECLARE(112)
QUIVER_ATTENTION_DECLARE(128)
#undef QUIVER_ATTENTION_DECLARE

}  // namespace quiver::cuda::detail
