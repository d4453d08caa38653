// Gather / scatter-add kernels of the GPU algebraic projection, and the benchmark's input
// fill: one thread per element,
// grid-stride loops. The rows a call scatters into are distinct (the rows of one type), so
// the additions need no atomics and are deterministic.
#include <cuda_bf16.h>

#include "cuda/algproj_launch.h"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 256;

__global__ void gather_rows_kernel(const uint16_t* src, int64_t cols, const int64_t* rows,
                                   int64_t m, uint16_t* dst) {
  const int64_t total = m * cols;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / cols, c = k - i * cols;
    dst[k] = src[rows[i] * cols + c];
  }
}

__global__ void scatter_add_rows_kernel(const float* src, int64_t cols, const int64_t* rows,
                                        int64_t m, float* dst) {
  const int64_t total = m * cols;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / cols, c = k - i * cols;
    dst[rows[i] * cols + c] += src[k];
  }
}

__global__ void fill_hashed_kernel(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const __nv_bfloat16 v = __float2bfloat16_rn(scale * (u * 3.4641016f - 1.7320508f));
    p[i] = *reinterpret_cast<const uint16_t*>(&v);
  }
}

}  // namespace

void launch_fill_hashed_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_hashed_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(p, n, seed, scale);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_rows_bf16(const uint16_t* src, int64_t cols, const int64_t* rows, int64_t m,
                             uint16_t* dst, cudaStream_t stream) {
  if (m * cols == 0) return;
  gather_rows_kernel<<<grid_for(m * cols, kThreads), kThreads, 0, stream>>>(src, cols, rows, m,
                                                                            dst);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_scatter_add_rows_f32(const float* src, int64_t cols, const int64_t* rows, int64_t m,
                                 float* dst, cudaStream_t stream) {
  if (m * cols == 0) return;
  scatter_add_rows_kernel<<<grid_for(m * cols, kThreads), kThreads, 0, stream>>>(src, cols, rows,
                                                                                 m, dst);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
