// Gather / scatter-add kernels of the GPU algebraic projection, the benchmark's input fill and
// calibration's output check: one thread per element, grid-stride loops. The rows a call
// scatters into are distinct (the rows of one type), so the additions need no atomics and are
// deterministic.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/algproj_launch.h"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/pdl.cuh"

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

__device__ __forceinline__ float element(const void* p, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(p)[i] : bf16_load(static_cast<const uint16_t*>(p)[i]);
}

__global__ void compare_outputs_kernel(const void* got, const void* ref, bool f32, int64_t n, double* out) {
  double diff2 = 0, ref2 = 0;
  float max_diff = 0, max_ref = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float r = element(ref, f32, i);
    float d = fabsf(element(got, f32, i) - r);
    if (!(d <= 3.0e38f)) d = INFINITY;  // NaN or ∞
    diff2 += static_cast<double>(d) * d;
    ref2 += static_cast<double>(r) * r;
    max_diff = fmaxf(max_diff, d);
    max_ref = fmaxf(max_ref, fabsf(r));
  }
  for (int o = 16; o > 0; o /= 2) {
    diff2 += __shfl_xor_sync(0xffffffffu, diff2, o);
    ref2 += __shfl_xor_sync(0xffffffffu, ref2, o);
    max_diff = fmaxf(max_diff, __shfl_xor_sync(0xffffffffu, max_diff, o));
    max_ref = fmaxf(max_ref, __shfl_xor_sync(0xffffffffu, max_ref, o));
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out[0], diff2);
    atomicAdd(&out[1], ref2);
    auto* bits = reinterpret_cast<unsigned long long*>(out);
    atomicMax(&bits[2], static_cast<unsigned long long>(__double_as_longlong(static_cast<double>(max_diff))));
    atomicMax(&bits[3], static_cast<unsigned long long>(__double_as_longlong(static_cast<double>(max_ref))));
  }
}

__global__ void empty_dependent_kernel() {
  pdl_trigger();
  pdl_wait();
}

}  // namespace

void launch_empty_dependent(cudaStream_t stream) {
  cudaLaunchAttribute attr = pdl_attribute();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  QV_CUDA_CHECK(cudaLaunchKernelEx(&config, empty_dependent_kernel));
}

void launch_compare_outputs(const void* got, const void* ref, bool f32, int64_t n, double* out, cudaStream_t stream) {
  if (n == 0) return;
  // A few blocks per multiprocessor: each warp adds once to the sums.
  compare_outputs_kernel<<<std::min(grid_for(n, kThreads), 1024u), kThreads, 0, stream>>>(got, ref, f32, n, out);
  QV_CUDA_CHECK(cudaGetLastError());
}

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
