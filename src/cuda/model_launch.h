// Internal: the small kernels of the GPU language model (src/cuda/model.h) that no op owns:
// the embedding with positions, residual and gradient additions, and the decode position.
// Raw device pointers; shapes were checked by the caller; each launch is checked; nothing
// synchronizes the host. bf16 buffers are uint16_t.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// out[i, :] = bf16(tok[tokens[i], :] + pos[p_i, :]) for i < n, where row i is at position
// p_i = pos0 + i % seq (+ *pos_offset when pos_offset is not null); pos null: no position
// table (RoPE models). Tables fp32 [rows, width]; one rounding per element.
void launch_embed(const int32_t* tokens, int64_t n, int64_t seq, const float* tok, const float* pos,
                  int64_t pos0, const int32_t* pos_offset, int64_t width, uint16_t* out,
                  cudaStream_t stream);

// dpos[t, :] += Σ_b dx[b, t, :] for dx bf16 [batch, seq, width]; fp32, a fixed order per
// element (deterministic).
void launch_position_backward(const uint16_t* dx, int64_t batch, int64_t seq, int64_t width,
                              float* dpos, cudaStream_t stream);

// dst[i] = bf16(dst[i] + src[i]), n elements.
void launch_add_bf16(uint16_t* dst, const uint16_t* src, int64_t n, cudaStream_t stream);
// dst[i] += src[i], n fp32 elements.
void launch_add_f32(float* dst, const float* src, int64_t n, cudaStream_t stream);
// *counter += 1 (the decode position, advanced at the end of a captured step).
void launch_increment(int32_t* counter, cudaStream_t stream);

}  // namespace quiver::cuda::detail
