// Internal: launchers of the Linear Relation kernels (src/cuda/linear_relation.h). They take raw
// device pointers, assume the shapes were checked by the entry points (linear_relation.cpp),
// launch on `stream` and check the launches. bf16 buffers are uint16_t (the bits of
// quiver::bf16).
//
// The chunk kernels are templated on the padded head width kPadded (a multiple of 16, at least
// Dh): lanes d >= Dh are loaded as zeros and never stored. linear_relation.cpp picks the
// instantiation.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// Tokens per chunk of the chunkwise form.
inline constexpr int kLinearRelationChunk = 64;
inline constexpr int kLinearRelationPadStep = 16;
inline constexpr int kLinearRelationMaxHeadDim = 128;

// Sizes of one call: rows [B, T, H, Dh]; chunks = ceil(T / kLinearRelationChunk).
struct LinearRelationDims {
  int64_t B, T, H, Dh, chunks;
  int64_t heads() const { return B * H; }
};

// The device workspace, all fp32, carved from one caller buffer:
//   states  [B·H, chunks, Dh, Dh]: the state C entering each chunk (first the chunks' own
//           contributions, then the scan turns them into entering states in place);
//   dstates [B·H, chunks, Dh, Dh]: dL/dC after each chunk (backward only; same scheme);
//   decays  [B·H, chunks, Dh]: exp(Γ), the decay of a whole chunk per relation row.
struct LinearRelationWorkspace {
  float* states;
  float* dstates;
  float* decays;
};

struct LinearRelationArgs {
  LinearRelationDims dims;
  float gate_scale;  // 1 / (τ_S sqrt(Dh))
  const uint16_t* p1;
  const uint16_t* p2;
  const uint16_t* v;
  const float* g;
  const uint16_t* dy;  // backward only
  uint16_t* y;         // forward only
  float* final_state;  // forward only, may be null: [B·H, Dh, Dh] = C_{T−1}
  uint16_t* dp1;       // backward outputs
  uint16_t* dp2;
  uint16_t* dv;
  float* dg;
  LinearRelationWorkspace ws;
};

template <int kPadded>
void launch_linear_relation_forward(const LinearRelationArgs& args, cudaStream_t stream);
template <int kPadded>
void launch_linear_relation_backward(const LinearRelationArgs& args, cudaStream_t stream);

#define QUIVER_LINEAR_RELATION_DECLARE(P)                                                   \
  extern template void launch_linear_relation_forward<P>(const LinearRelationArgs&,         \
                                                         cudaStream_t);                     \
  extern template void launch_linear_relation_backward<P>(const LinearRelationArgs&,        \
                                                          cudaStream_t);
QUIVER_LINEAR_RELATION_DECLARE(16)
QUIVER_LINEAR_RELATION_DECLARE(32)
QUIVER_LINEAR_RELATION_DECLARE(48)
QUIVER_LINEAR_RELATION_DECLARE(64)
QUIVER_LINEAR_RELATION_DECLARE(80)
QUIVER_LINEAR_RELATION_DECLARE(96)
QUIVER_LINEAR_RELATION_DECLARE(112)
QUIVER_LINEAR_RELATION_DECLARE(128)
#undef QUIVER_LINEAR_RELATION_DECLARE

// One decode step for B·H heads of width Dh <= kLinearRelationMaxHeadDim; rows [B·H, Dh],
// state [B·H, Dh, Dh] fp32 updated in place.
void launch_linear_relation_decode_step(const uint16_t* p1, const uint16_t* p2, const uint16_t* v,
                                        const float* g, float* state, uint16_t* y, int64_t heads,
                                        int64_t Dh, float gate_scale, cudaStream_t stream);

// Retention gate element-wise parts; rows N, columns H·Dh (head h = column / Dh).
// Forward, in place on g (holding r = x W_down W_up): g = −exp(a_log[h]) · softplus(g + dt_bias).
void launch_retention_gate_activation(float* g, const float* a_log, const float* dt_bias,
                                      int64_t N, int64_t H, int64_t Dh, cudaStream_t stream);
// Backward, in place on dr (holding r on entry, dz = dL/d(r + dt_bias) on exit, both bf16):
// dz = −dg · exp(a_log[h]) · sigmoid(z), z = r + dt_bias; ddt_bias += Σ_rows dz and
// da_log[h] += Σ_{rows, columns of h} dg · g, summed in a fixed order (row chunks per head, then
// the chunks' partials in order).
// The partial sums go through `scratch` (stream-ordered, scratch_bytes ≥ H·Dh·4 + H·8 + 8).
void launch_retention_gate_backward_elementwise(uint16_t* dr, const float* dg, const float* a_log,
                                                const float* dt_bias, float* da_log,
                                                float* ddt_bias, int64_t N, int64_t H, int64_t Dh,
                                                void* scratch, size_t scratch_bytes,
                                                cudaStream_t stream);

}  // namespace quiver::cuda::detail
