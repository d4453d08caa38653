// Internal: kernel launchers of the element-wise and row-wise ops (src/cuda/ops.h). They take
// raw device pointers, assume the shapes were checked by the entry points (elementwise.cpp),
// launch on `stream` and check the launch. bf16 buffers are passed as uint16_t (the bit
// pattern of quiver::bf16). No launcher synchronizes the host.
#pragma once
#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// bf16 <-> fp32, n elements; rounding as quiver::float_to_bf16 (nearest even, NaN stays NaN).
void launch_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream);
void launch_bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);

// out[i, :] = bf16(table[tokens[i], :]); table [V, D] fp32, out [n, D] bf16.
void launch_embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width,
                              uint16_t* out, cudaStream_t stream);
// dtable[tokens[i], :] += dout[i, :] with fp32 atomicAdd.
void launch_embedding_backward(const int32_t* tokens, int64_t n, const uint16_t* dout,
                               int64_t width, float* dtable, cudaStream_t stream);

// Norms over rows of width D; x, y, dy, dx bf16 [rows, D]; mean, rstd fp32 [rows];
// weight/bias are fp32 (weight_bf16 false) or bf16 (true); dweight/dbias fp32, accumulated;
// dx assigned, or added to (accumulate_dx).
// bias/mean/dbias are null for RMSNorm. The backward's parameter sums split the rows over
// blocks and add the splits in a fixed order through `scratch` (scratch_floats fp32; null:
// one split, slow for many rows); calls sharing a scratch must be ordered (one stream).
void launch_norm_forward(const uint16_t* x, const void* weight, const void* bias, bool weight_bf16,
                         float eps, int64_t rows, int64_t width, uint16_t* y, float* mean,
                         float* rstd, cudaStream_t stream);
void launch_norm_backward(const uint16_t* dy, const uint16_t* x, const void* weight,
                          bool weight_bf16, const float* mean, const float* rstd, int64_t rows,
                          int64_t width, uint16_t* dx, bool accumulate_dx, float* dweight, float* dbias,
                          float* scratch, int64_t scratch_floats, cudaStream_t stream);

// RoPE on contiguous bf16 [batch, seq, heads, head_dim]; y may equal x. Row t is at position
// pos0 + t, plus *pos_offset when pos_offset (device memory) is not null: decoding reads its
// position on the device, so one captured graph serves every step. head_dim ≤ 2·kRopeMaxHalf
// (the frequencies travel as kernel parameters); heads · head_dim < 2^31.
inline constexpr int kRopeMaxHalf = 256;
void launch_rope(const uint16_t* x, uint16_t* y, int64_t batch, int64_t seq, int64_t heads,
                 int64_t head_dim, int64_t pos0, const int32_t* pos_offset, double base,
                 bool inverse, cudaStream_t stream);

// Activations over n bf16 elements.
void launch_swiglu_forward(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                           cudaStream_t stream);
void launch_swiglu_backward(const uint16_t* dout, const uint16_t* gate, const uint16_t* up,
                            uint16_t* dgate, uint16_t* dup, int64_t n, cudaStream_t stream);
void launch_gelu_forward(const uint16_t* x, uint16_t* y, int64_t n, cudaStream_t stream);
void launch_gelu_backward(const uint16_t* dy, const uint16_t* x, uint16_t* dx, int64_t n,
                          cudaStream_t stream);

// Cross-entropy over bf16 logits [rows, vocab] with row stride ld ≥ vocab (logits and
// dlogits alike); see cuda::cross_entropy in ops.h.
// dlogits may be null. loss_mean is one fp32 (it holds the count of counted rows between the
// kernels of one call).
void launch_cross_entropy(const uint16_t* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, int64_t ld, float scale, float* row_loss, uint16_t* dlogits,
                          float* loss_mean, cudaStream_t stream);

// A segment of the flat parameter buffer as the device sees it (sorted by offset, disjoint).
struct SegmentDesc {
  int64_t offset;
  int64_t numel;
  int32_t decay;
  int32_t trainable;
};

// Fixed grid of the gradient-norm reduction: its partial sums need this many doubles.
inline constexpr int kGradNormBlocks = 264;
// Scratch of the gradient-norm launches: kGradNormBlocks partials, then Σ g² (at
// kGradNormSum) and the clipping scale.
inline constexpr int kGradNormSum = kGradNormBlocks;
inline constexpr int kGradNormScratch = kGradNormBlocks + 2;

// Deterministic Σ g² over the trainable segments in [0, extent) into scratch[kGradNormSum].
void launch_grad_square_sum(const float* grads, const SegmentDesc* segments, int num_segments,
                            int64_t extent, double* scratch, cudaStream_t stream);
// norm = √scratch[kGradNormSum] to norm_out[0] (fp32); scales the trainable grads by
// max_norm / norm when max_norm > 0 and norm > max_norm.
void launch_clip_to_norm(float* grads, const SegmentDesc* segments, int num_segments, int64_t extent,
                         double max_norm, double* scratch, float* norm_out, cudaStream_t stream);

// One AdamW update over the trainable segments; the constants are computed on the host in
// double exactly as train::AdamW::step does.
struct AdamWConstants {
  double beta1, beta2, eps;
  double step_size;     // lr / (1 − β1^t)
  double bc2_sqrt;      // √(1 − β2^t)
  double decay_factor;  // 1 − lr·wd
};
void launch_adamw(float* params, const float* grads, float* m, float* v,
                  const SegmentDesc* segments, int num_segments, int64_t extent,
                  const AdamWConstants& c, cudaStream_t stream);

#ifdef __CUDACC__
// Device helpers shared by the .cu files: bf16 bits <-> float, bit-exact with quiver::dtype.h.
__device__ __forceinline__ float bf16_load(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t bf16_round(float value) {
  const uint32_t u = __float_as_uint(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// σ(x) = 1 / (1 + e^-x); e^-x overflows to inf for x < -88 and the quotient is then 0: no NaN.
__device__ __forceinline__ float logistic(float x) { return 1.0f / (1.0f + expf(-x)); }

// SwiGLU of one gate / up pair in fp32, g σ(g) u: the one formula of swiglu_forward and of the
// algebraic few-row kernel's SwiGLU epilogue, so the two agree bit for bit.
__device__ __forceinline__ float swiglu_value(float g, float u) { return g * logistic(g) * u; }

// kStep (1 or 8) consecutive values as floats, and back (bf16 stores round). With kStep = 8 the
// address must be 16-byte aligned: one 16-byte access for bf16, two for fp32.
template <int kStep>
__device__ __forceinline__ void load_cols(const uint16_t* p, float (&v)[kStep]) {
  static_assert(kStep == 1 || kStep == 8, "1 or 8 columns");
  if constexpr (kStep == 1) {
    v[0] = bf16_load(*p);
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}
template <int kStep>
__device__ __forceinline__ void load_cols(const float* p, float (&v)[kStep]) {
  static_assert(kStep == 1 || kStep == 8, "1 or 8 columns");
  if constexpr (kStep == 1) {
    v[0] = *p;
  } else {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}
template <int kStep>
__device__ __forceinline__ void store_cols(uint16_t* p, const float (&v)[kStep]) {
  static_assert(kStep == 1 || kStep == 8, "1 or 8 columns");
  if constexpr (kStep == 1) {
    *p = bf16_round(v[0]);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = static_cast<uint32_t>(bf16_round(v[2 * i])) | (static_cast<uint32_t>(bf16_round(v[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Fixed-order block sum in double (deterministic for a fixed blockDim, a multiple of 32);
// scratch holds blockDim.x / 32 doubles in shared memory.
__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const double total = scratch[0];
  __syncthreads();
  return total;
}

// Whether every pointer is 16-byte aligned (a null pointer counts as aligned): the condition of
// the 8-wide paths of the element-wise kernels.
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Grid size for a grid-stride loop over n items: enough blocks to fill the GPU, capped.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

// A grid-stride loop over items [0, n) of an element-wise kernel: with `vec` (every pointer the
// item function touches 16-byte aligned, aligned16) items [0, 8·⌊n/8⌋) go 8 at a time and the
// rest one at a time, otherwise all one at a time. `item` is a lambda templated on the count:
// item.template operator()<kStep>(first index); it must give each item the same arithmetic for
// either count (load_cols / store_cols of kStep values do).
template <class Item>
__device__ __forceinline__ void for_items(int64_t n, bool vec, Item item) {
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vec ? n / 8 : 0;
  for (int64_t k = start; k < groups; k += stride) item.template operator()<8>(8 * k);
  for (int64_t i = 8 * groups + start; i < n; i += stride) item.template operator()<1>(i);
}

// Blocks for a for_items loop of `threads` per block.
inline unsigned grid_for_items(int64_t n, bool vec, int threads) { return grid_for(vec ? (n + 7) / 8 : n, threads); }
#endif

}  // namespace quiver::cuda::detail
