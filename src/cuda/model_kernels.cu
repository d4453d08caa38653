// Kernels of src/cuda/model_launch.h.
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/model_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 256;

__global__ void embed_kernel(const int32_t* tokens, int64_t n, int64_t seq, const float* tok,
                             const float* pos, int64_t pos0, const int32_t* pos_offset,
                             int64_t width, uint16_t* out) {
  const int64_t shift = pos0 + (pos_offset ? *pos_offset : 0);
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n * width;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / width, d = k - i * width;
    float x = tok[int64_t{tokens[i]} * width + d];
    if (pos) x += pos[(shift + i % seq) * width + d];
    out[k] = bf16_round(x);
  }
}

__global__ void position_backward_kernel(const uint16_t* dx, int64_t batch, int64_t seq,
                                         int64_t width, float* dpos) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < seq * width;
       k += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < batch; ++b) s += bf16_load(dx[b * seq * width + k]);
    dpos[k] += s;
  }
}

__global__ void add_bf16_kernel(uint16_t* dst, const uint16_t* src, int64_t n, bool vec) {
  for_items(n, vec, [&]<int kStep>(int64_t i) {
    float a[kStep], b[kStep];
    load_cols<kStep>(dst + i, a);
    load_cols<kStep>(src + i, b);
#pragma unroll
    for (int e = 0; e < kStep; ++e) a[e] += b[e];
    store_cols<kStep>(dst + i, a);
  });
}

__global__ void add_f32_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] += src[i];
}

__global__ void increment_kernel(int32_t* counter) { *counter += 1; }

}  // namespace

void launch_embed(const int32_t* tokens, int64_t n, int64_t seq, const float* tok, const float* pos,
                  int64_t pos0, const int32_t* pos_offset, int64_t width, uint16_t* out,
                  cudaStream_t stream) {
  if (n == 0 || width == 0) return;
  embed_kernel<<<grid_for(n * width, kThreads), kThreads, 0, stream>>>(tokens, n, seq, tok, pos, pos0,
                                                                       pos_offset, width, out);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_position_backward(const uint16_t* dx, int64_t batch, int64_t seq, int64_t width,
                              float* dpos, cudaStream_t stream) {
  if (seq * width == 0) return;
  position_backward_kernel<<<grid_for(seq * width, kThreads), kThreads, 0, stream>>>(dx, batch, seq,
                                                                                     width, dpos);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_add_bf16(uint16_t* dst, const uint16_t* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned16({dst, src});
  add_bf16_kernel<<<grid_for_items(n, vec, kThreads), kThreads, 0, stream>>>(dst, src, n, vec);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_add_f32(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_increment(int32_t* counter, cudaStream_t stream) {
  increment_kernel<<<1, 1, 0, stream>>>(counter);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
