// Gather / scatter-add kernels of the GPU algebraic projection: one thread per element,
// grid-stride loops. The rows a call scatters into are distinct (the rows of one type), so
// the additions need no atomics and are deterministic.
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

}  // namespace

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
