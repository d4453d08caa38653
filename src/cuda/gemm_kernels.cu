// Kernels beside the cuBLASLt GEMMs: the unfused bias/GELU epilogue and the bias-gradient
// column sum. Simple and clearly right; tuning comes later.
#include <cuda_bf16.h>

#include "cuda/check.h"
#include "cuda/gemm_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load_bf16(const uint16_t* p, int64_t i) {
  return __bfloat162float(__ushort_as_bfloat16(p[i]));
}

__device__ __forceinline__ uint16_t round_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));  // nearest even, NaN stays NaN
}

// GELU, tanh form, as ops::gelu_forward: ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))).
__device__ __forceinline__ float gelu(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

template <bool CBf16>
__global__ void bias_act_kernel(void* c, int64_t M, int64_t N, int64_t ldc, float beta,
                                const void* bias, bool bias_bf16, bool apply_gelu) {
  const int64_t total = M * N;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = k / N, n = k % N;
    const int64_t at = m * ldc + n;
    float v = 0.0f;
    if (beta != 0.0f)
      v = beta * (CBf16 ? load_bf16(static_cast<const uint16_t*>(c), at) : static_cast<const float*>(c)[at]);
    if (bias)
      v += bias_bf16 ? load_bf16(static_cast<const uint16_t*>(bias), n) : static_cast<const float*>(bias)[n];
    if (apply_gelu) v = gelu(v);
    if constexpr (CBf16)
      static_cast<uint16_t*>(c)[at] = round_bf16(v);
    else
      static_cast<float*>(c)[at] = v;
  }
}

// One block per 32 columns: threadIdx.x picks the column (coalesced rows), threadIdx.y strides
// the rows; the 32 partial sums of a column are then added in a fixed order.
constexpr int kSumCols = 32, kSumRows = 32;

__global__ void column_sum_kernel(const uint16_t* dy, int64_t rows, int64_t cols, int64_t ld,
                                  float* db) {
  __shared__ float partial[kSumRows][kSumCols + 1];
  const int64_t col = blockIdx.x * int64_t{kSumCols} + threadIdx.x;
  float sum = 0.0f;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kSumRows) sum += load_bf16(dy, r * ld + col);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int i = 0; i < kSumRows; ++i) total += partial[i][threadIdx.x];
    db[col] += total;
  }
}

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void launch_bias_act(void* C, bool c_bf16, int64_t M, int64_t N, int64_t ldc, float beta,
                     const void* bias, bool bias_bf16, bool gelu, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  const int grid = grid_for(M * N);
  if (c_bf16)
    bias_act_kernel<true><<<grid, kThreads, 0, stream>>>(C, M, N, ldc, beta, bias, bias_bf16, gelu);
  else
    bias_act_kernel<false><<<grid, kThreads, 0, stream>>>(C, M, N, ldc, beta, bias, bias_bf16, gelu);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_column_sum_accumulate(const uint16_t* dy, int64_t rows, int64_t cols, int64_t ld,
                                  float* db, cudaStream_t stream) {
  if (cols <= 0 || rows <= 0) return;
  const dim3 block(kSumCols, kSumRows);
  const auto grid = static_cast<unsigned>((cols + kSumCols - 1) / kSumCols);
  column_sum_kernel<<<grid, block, 0, stream>>>(dy, rows, cols, ld, db);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
