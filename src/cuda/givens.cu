// Givens head mixing kernels (forward, backward) and their launchers; see givens.h for the
// contract and relation_launch.h for the launcher interface.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/relation_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kRotateThreads = 256;
// dθ: stage 1 splits the rows into kGivensDthetaBlocks fixed ranges; block i sums every pair
// over its rows (a fixed tree per pair) into partials[i·pairs + k]; stage 2 adds the blocks'
// partials of each pair in block order. The grid does not depend on the GPU, so the sums are
// the same on any device.
constexpr int kDthetaBlocks = kGivensDthetaBlocks;
constexpr int kDthetaThreads = 256;

struct HeadPair {
  int64_t a, b;
};

// ops::givens_pairs: even layers (2k, 2k+1), odd layers (2k+1, (2k+2) mod H).
__device__ __forceinline__ HeadPair pair_heads(int64_t k, int64_t heads, int64_t layer) {
  if (layer % 2 == 0) return {2 * k, 2 * k + 1};
  return {2 * k + 1, (2 * k + 2) % heads};
}

// Two adjacent channels of a bf16 state or an fp32 weight.
__device__ __forceinline__ float2 load2(const uint16_t* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void store2(uint16_t* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }

// out_a = base_a + c·in_a − s·in_b, out_b = base_b + s·in_a + c·in_b with (c, s) =
// (cos θ_k, sin_sign · sin θ_k) and base zero when null: the forward (sin_sign = 1) and
// dI = Gᵀ dOut (sin_sign = −1), on bf16 states, and the same on the folded weights (fp32 in,
// bf16 or fp32 out). One thread per (row, pair, two channels; head_dim is even) reads its
// inputs before writing both outputs, so out may equal in.
template <typename In, typename Out>
__global__ void __launch_bounds__(kRotateThreads)
    givens_rotate_kernel(const In* in, const float* theta, float sin_sign, int64_t rows, int64_t heads,
                         int64_t head_dim, int64_t layer, const float* base, Out* out) {
  const int64_t pairs = heads / 2, half = head_dim / 2, n = rows * pairs * half;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t dd = 2 * (idx % half), k = (idx / half) % pairs, r = idx / (half * pairs);
    const HeadPair hp = pair_heads(k, heads, layer);
    float s, c;
    sincosf(theta[k], &s, &c);
    s *= sin_sign;
    const int64_t ia = (r * heads + hp.a) * head_dim + dd, ib = (r * heads + hp.b) * head_dim + dd;
    const float2 xa = load2(in + ia), xb = load2(in + ib);
    const float2 ba = base ? load2(base + ia) : make_float2(0.f, 0.f), bb = base ? load2(base + ib) : make_float2(0.f, 0.f);
    store2(out + ia, ba.x + (c * xa.x - s * xb.x), ba.y + (c * xa.y - s * xb.y));
    store2(out + ib, bb.x + (s * xa.x + c * xb.x), bb.y + (s * xa.y + c * xb.y));
  }
}

// Stage 1 of dθ[k] += Σ_{rows, channels} dOut_b·Ĩ_a − dOut_a·Ĩ_b (Ĩ recomputed from I).
template <typename T>
__global__ void __launch_bounds__(kDthetaThreads)
    givens_dtheta_partial_kernel(const T* d_out, const T* in, const float* theta, int64_t rows, int64_t heads,
                                 int64_t head_dim, int64_t layer, double* partials) {
  __shared__ double scratch[kDthetaThreads / 32];
  const int64_t pairs = heads / 2, half = head_dim / 2;
  const int64_t per = (rows + kDthetaBlocks - 1) / kDthetaBlocks;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * per, r1 = min(rows, r0 + per);
  const int64_t n = r1 > r0 ? (r1 - r0) * half : 0;
  for (int64_t k = 0; k < pairs; ++k) {
    const HeadPair hp = pair_heads(k, heads, layer);
    float s, c;
    sincosf(theta[k], &s, &c);
    double sum = 0.0;
    for (int64_t e = threadIdx.x; e < n; e += kDthetaThreads) {
      const int64_t r = r0 + e / half, dd = 2 * (e % half);
      const int64_t ia = (r * heads + hp.a) * head_dim + dd, ib = (r * heads + hp.b) * head_dim + dd;
      const float2 xa = load2(in + ia), xb = load2(in + ib), ga = load2(d_out + ia), gb = load2(d_out + ib);
      const float v = gb.x * (c * xa.x - s * xb.x) - ga.x * (s * xa.x + c * xb.x) + gb.y * (c * xa.y - s * xb.y) -
                      ga.y * (s * xa.y + c * xb.y);
      sum += static_cast<double>(v);
    }
    const double total = block_sum_double(sum, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x * pairs + k] = total;
  }
}

__global__ void givens_dtheta_sum_kernel(int64_t pairs, const double* partials, float* dtheta) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= pairs) return;
  double acc = 0.0;
  for (int b = 0; b < kDthetaBlocks; ++b) acc += partials[b * pairs + k];
  dtheta[k] = static_cast<float>(static_cast<double>(dtheta[k]) + acc);
}

template <typename In, typename Out>
void launch_rotate(const In* in, const float* theta, float sin_sign, int64_t rows, int64_t heads, int64_t head_dim,
                   int64_t layer, const float* base, Out* out, cudaStream_t stream) {
  const int64_t n = rows * (heads / 2) * (head_dim / 2);
  if (n == 0) return;
  givens_rotate_kernel<In, Out><<<grid_for(n, kRotateThreads), kRotateThreads, 0, stream>>>(
      in, theta, sin_sign, rows, heads, head_dim, layer, base, out);
  QV_CUDA_CHECK(cudaGetLastError());
}

// dθ += the fixed-order sum of dOut_b·Ĩ_a − dOut_a·Ĩ_b over the rows (both stages).
template <typename T>
void launch_dtheta(const T* d_out, const T* in, const float* theta, int64_t rows, int64_t heads, int64_t head_dim,
                   int64_t layer, float* dtheta, double* partials, cudaStream_t stream) {
  const int64_t pairs = heads / 2;
  givens_dtheta_partial_kernel<T><<<kDthetaBlocks, kDthetaThreads, 0, stream>>>(d_out, in, theta, rows, heads,
                                                                                 head_dim, layer, partials);
  QV_CUDA_CHECK(cudaGetLastError());
  givens_dtheta_sum_kernel<<<static_cast<unsigned>((pairs + 127) / 128), 128, 0, stream>>>(pairs, partials,
                                                                                            dtheta);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_givens_forward(const uint16_t* in, const float* theta, int64_t rows, int64_t heads,
                           int64_t head_dim, int64_t layer, uint16_t* out, cudaStream_t stream) {
  launch_rotate(in, theta, 1.0f, rows, heads, head_dim, layer, nullptr, out, stream);
}

void launch_givens_backward(const uint16_t* d_out, const uint16_t* in, const float* theta,
                            int64_t rows, int64_t heads, int64_t head_dim, int64_t layer,
                            uint16_t* d_in, float* dtheta, double* partials, cudaStream_t stream) {
  if (rows == 0) return;
  // dθ first: it reads d_out, which the rotation below may overwrite (d_in == d_out).
  launch_dtheta(d_out, in, theta, rows, heads, head_dim, layer, dtheta, partials, stream);
  launch_rotate(d_out, theta, -1.0f, rows, heads, head_dim, layer, nullptr, d_in, stream);
}

void launch_givens_rotate_weight(const float* w, const float* theta, int64_t rows, int64_t heads,
                                 int64_t head_dim, int64_t layer, uint16_t* out, cudaStream_t stream) {
  launch_rotate(w, theta, 1.0f, rows, heads, head_dim, layer, nullptr, out, stream);
}

void launch_givens_weight_backward(float* dw, const float* base, const float* w, const float* theta, int64_t rows,
                                   int64_t heads, int64_t head_dim, int64_t layer, float* dtheta,
                                   double* partials, cudaStream_t stream) {
  if (rows == 0) return;
  launch_dtheta<float>(dw, w, theta, rows, heads, head_dim, layer, dtheta, partials, stream);
  launch_rotate(static_cast<const float*>(dw), theta, -1.0f, rows, heads, head_dim, layer, base, dw, stream);
}

}  // namespace quiver::cuda::detail
