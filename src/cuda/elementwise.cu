// Kernels of the element-wise ops: bf16 <-> fp32 conversion, embedding, RoPE, SwiGLU, GELU.
// Storage is bf16 (uint16_t bit patterns), arithmetic fp32 (RoPE angles formed and reduced in
// fp64, as the CPU reference forms them). Grid-stride kernels, 8 items per access where the
// pointers allow.
#include <cmath>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = bf16_round(src[i]);
}

__global__ void bf16_to_f32_kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = bf16_load(src[i]);
}

// Token ids are not checked here: the launcher cannot see device memory without a host
// sync, so the trainer validates ids on the host before uploading them.
__global__ void embedding_forward_kernel(const int32_t* tokens, int64_t n, const float* table,
                                         int64_t width, uint16_t* out) {
  const int64_t total = n * width;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / width, d = k - i * width;
    out[k] = bf16_round(table[static_cast<int64_t>(tokens[i]) * width + d]);
  }
}

// fp32 atomics: the order of the additions into one table row varies between runs, so the
// last bits of a repeated token's gradient may too.
__global__ void embedding_backward_kernel(const int32_t* tokens, int64_t n, const uint16_t* dout,
                                          int64_t width, float* dtable) {
  const int64_t total = n * width;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / width, d = k - i * width;
    atomicAdd(dtable + static_cast<int64_t>(tokens[i]) * width + d, bf16_load(dout[k]));
  }
}

// cos and sin of an fp64 angle θ ≥ 0 to fp32 accuracy without an fp64 sincos: θ is reduced
// exactly enough in fp64 (Cody–Waite: θ − k·π/2 with π/2 split into two doubles, error
// ~k·2⁻¹⁰⁷, far below fp32's 2⁻²⁴ for any position a model reaches), then fp32 sincosf on
// |r| ≤ π/4 and the quadrant k mod 4. The results are within about 2 fp32 ulps of the fp64
// values rounded to fp32, which is what the CPU reference's fp32 path uses.
struct RopeFrequencies {
  double inv_freq[kRopeMaxHalf];  // base^(−2i/Dh), i < Dh/2
};

__device__ __forceinline__ void rope_cos_sin(double angle, float* c, float* s) {
  constexpr double kTwoOverPi = 0.63661977236758134308;
  constexpr double kHalfPiHi = 1.5707963267948966192;      // fp64(π/2)
  constexpr double kHalfPiLo = 6.123233995736766036e-17;   // π/2 − kHalfPiHi
  const double k = rint(angle * kTwoOverPi);
  const double r = fma(-k, kHalfPiLo, fma(-k, kHalfPiHi, angle));
  float sr, cr;
  sincosf(static_cast<float>(r), &sr, &cr);
  const int quadrant = static_cast<int>(static_cast<int64_t>(k) & 3);
  switch (quadrant) {
    case 0: *c = cr; *s = sr; break;
    case 1: *c = -sr; *s = cr; break;
    case 2: *c = -cr; *s = -sr; break;
    default: *c = sr; *s = -cr; break;
  }
}

// One block per kRopeRows consecutive rows (row = b·seq + t). The block first puts the rows'
// cos/sin (one per (row, pair), shared by every head) in shared memory; then its threads apply
// them to every (row, head, pair), consecutive threads on consecutive elements of a head, so
// loads and stores coalesce and no thread walks the heads in sequence; with kStep = 8 (Dh/2 a
// multiple of 8, x and y 16-byte aligned) a thread takes 8 consecutive pairs. The fp64
// frequencies come from the host (kernel parameters): an fp64 pow per block would delay every
// block.
constexpr int kRopeRows = 16;

template <int kStep>
__global__ void rope_kernel(const uint16_t* x, uint16_t* y, int64_t rows, int64_t seq, int heads,
                            int head_dim, int64_t pos0, const int32_t* pos_offset,
                            RopeFrequencies freqs, float sign) {
  const int half = head_dim / 2;
  extern __shared__ float rope_shared[];
  float* cos_table = rope_shared;                  // [kRopeRows, half]
  float* sin_table = rope_shared + kRopeRows * half;  // [kRopeRows, half]
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRopeRows;
  const int block_rows = static_cast<int>(min(static_cast<int64_t>(kRopeRows), rows - row0));
  const int64_t offset = pos_offset ? *pos_offset : 0;
  for (int k = threadIdx.x; k < block_rows * half; k += blockDim.x) {
    const int r = k / half, i = k - r * half;
    const int64_t pos = pos0 + (row0 + r) % seq + offset;
    float c, s;
    rope_cos_sin(static_cast<double>(pos) * freqs.inv_freq[i], &c, &s);
    cos_table[k] = c;
    sin_table[k] = sign * s;
  }
  __syncthreads();
  // 32-bit index arithmetic inside the block (at most kRopeRows · heads · half pairs).
  const int per_row = heads * half / kStep;  // steps of kStep pairs
  for (int k = threadIdx.x; k < block_rows * per_row; k += blockDim.x) {
    const int r = k / per_row, rem = (k - r * per_row) * kStep;
    const int h = rem / half, i = rem - h * half;
    const int64_t index = ((row0 + r) * heads + h) * head_dim + i;
    float a[kStep], b[kStep];
    load_cols<kStep>(x + index, a);
    load_cols<kStep>(x + index + half, b);
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      const float c = cos_table[r * half + i + e], s = sin_table[r * half + i + e];
      const float lo = a[e] * c - b[e] * s, hi = a[e] * s + b[e] * c;
      a[e] = lo;
      b[e] = hi;
    }
    store_cols<kStep>(y + index, a);
    store_cols<kStep>(y + index + half, b);
  }
}

// The element-wise kernels below loop by for_items (elementwise_launch.h).
__global__ void swiglu_forward_kernel(const uint16_t* gate, const uint16_t* up, uint16_t* out,
                                      int64_t n, bool vec) {
  for_items(n, vec, [&]<int kStep>(int64_t i) {
    float g[kStep], u[kStep];
    load_cols<kStep>(gate + i, g);
    load_cols<kStep>(up + i, u);
#pragma unroll
    for (int e = 0; e < kStep; ++e) g[e] = swiglu_value(g[e], u[e]);
    store_cols<kStep>(out + i, g);
  });
}

// dgate = dout · up · σ(g)(1 + g(1 − σ(g))), dup = dout · silu(g).
__global__ void swiglu_backward_kernel(const uint16_t* dout, const uint16_t* gate,
                                       const uint16_t* up, uint16_t* dgate, uint16_t* dup,
                                       int64_t n, bool vec) {
  for_items(n, vec, [&]<int kStep>(int64_t i) {
    float d[kStep], g[kStep], u[kStep];
    load_cols<kStep>(dout + i, d);
    load_cols<kStep>(gate + i, g);
    load_cols<kStep>(up + i, u);
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      const float s = logistic(g[e]);
      u[e] = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
      g[e] = d[e] * g[e] * s;
    }
    store_cols<kStep>(dgate + i, u);
    store_cols<kStep>(dup + i, g);
  });
}

// GELU (tanh approximation) through ½(1 + tanh u) = σ(2u), as src/ops/activation.cpp.
constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_gate(float v) {
  return logistic(2.0f * kGeluScale * (v + kGeluCubic * v * v * v));
}

// d gelu(v) / dv.
__device__ __forceinline__ float gelu_slope(float v) {
  const float s = gelu_gate(v);
  const float spread = s * (1.0f - s);
  // Where the gate has saturated, spread = 0 and v² may have overflowed: skip the 0 · ∞.
  const float curvature =
      spread == 0.0f ? 0.0f : 2.0f * v * spread * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
  return s + curvature;
}

__global__ void gelu_forward_kernel(const uint16_t* x, uint16_t* y, int64_t n, bool vec) {
  for_items(n, vec, [&]<int kStep>(int64_t i) {
    float v[kStep];
    load_cols<kStep>(x + i, v);
#pragma unroll
    for (int e = 0; e < kStep; ++e) v[e] *= gelu_gate(v[e]);
    store_cols<kStep>(y + i, v);
  });
}

__global__ void gelu_backward_kernel(const uint16_t* dy, const uint16_t* x, uint16_t* dx,
                                     int64_t n, bool vec) {
  for_items(n, vec, [&]<int kStep>(int64_t i) {
    float d[kStep], v[kStep];
    load_cols<kStep>(dy + i, d);
    load_cols<kStep>(x + i, v);
#pragma unroll
    for (int e = 0; e < kStep; ++e) d[e] *= gelu_slope(v[e]);
    store_cols<kStep>(dx + i, d);
  });
}

}  // namespace

void launch_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, dst, n);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, dst, n);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width,
                              uint16_t* out, cudaStream_t stream) {
  if (n * width == 0) return;
  embedding_forward_kernel<<<grid_for(n * width, kThreads), kThreads, 0, stream>>>(
      tokens, n, table, width, out);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_embedding_backward(const int32_t* tokens, int64_t n, const uint16_t* dout,
                               int64_t width, float* dtable, cudaStream_t stream) {
  if (n * width == 0) return;
  embedding_backward_kernel<<<grid_for(n * width, kThreads), kThreads, 0, stream>>>(
      tokens, n, dout, width, dtable);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_rope(const uint16_t* x, uint16_t* y, int64_t batch, int64_t seq, int64_t heads,
                 int64_t head_dim, int64_t pos0, const int32_t* pos_offset, double base,
                 bool inverse, cudaStream_t stream) {
  const int64_t rows = batch * seq, half = head_dim / 2;
  if (rows == 0 || half == 0 || heads == 0) return;
  const int64_t blocks = (rows + kRopeRows - 1) / kRopeRows;
  RopeFrequencies freqs;
  for (int64_t i = 0; i < half; ++i)  // as the CPU reference (ops/rope.cpp)
    freqs.inv_freq[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  const size_t shared_bytes = static_cast<size_t>(half) * 2 * kRopeRows * sizeof(float);
  auto kernel = half % 8 == 0 && aligned16({x, y}) ? rope_kernel<8> : rope_kernel<1>;
  kernel<<<static_cast<unsigned>(blocks), kThreads, shared_bytes, stream>>>(
      x, y, rows, seq, static_cast<int>(heads), static_cast<int>(head_dim), pos0, pos_offset, freqs,
      inverse ? -1.0f : 1.0f);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_swiglu_forward(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned16({gate, up, out});
  swiglu_forward_kernel<<<grid_for_items(n, vec, kThreads), kThreads, 0, stream>>>(gate, up, out, n, vec);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_swiglu_backward(const uint16_t* dout, const uint16_t* gate, const uint16_t* up,
                            uint16_t* dgate, uint16_t* dup, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned16({dout, gate, up, dgate, dup});
  swiglu_backward_kernel<<<grid_for_items(n, vec, kThreads), kThreads, 0, stream>>>(dout, gate, up, dgate, dup, n, vec);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_gelu_forward(const uint16_t* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned16({x, y});
  gelu_forward_kernel<<<grid_for_items(n, vec, kThreads), kThreads, 0, stream>>>(x, y, n, vec);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_gelu_backward(const uint16_t* dy, const uint16_t* x, uint16_t* dx, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned16({dy, x, dx});
  gelu_backward_kernel<<<grid_for_items(n, vec, kThreads), kThreads, 0, stream>>>(dy, x, dx, n, vec);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
