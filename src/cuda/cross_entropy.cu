// Fused softmax cross-entropy over bf16 logits: one block per row with an online max/sum in
// fp32, then the mean over counted rows reduced on the device (no host sync). Three kernels
// in stream order: count the counted rows, the rows, the deterministic mean.
#include <cfloat>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 1024;

// Running (max, Σ exp(x − max)) pair; merging two keeps the larger max and rescales.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

// Every thread gets the block's merged pair. blockDim.x is a multiple of 32.
__device__ MaxSum block_merge(MaxSum v, MaxSum* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum o{__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    v = merge(v, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum o{__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
      v = merge(v, o);
    }
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const MaxSum total = scratch[0];
  __syncthreads();
  return total;
}

// count_out[0] = number of rows with a target ≥ 0 (as a float: exact below 2^24 rows).
__global__ void count_targets_kernel(const int32_t* targets, int64_t rows, float* count_out) {
  __shared__ double scratch[32];
  double count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) count += targets[r] >= 0 ? 1.0 : 0.0;
  count = block_sum_double(count, scratch);
  if (threadIdx.x == 0) count_out[0] = static_cast<float>(count);
}

// One row per block. loss = log Σ exp(x − max) − (x[t] − max); dlogits = factor ·
// (softmax − onehot) with factor = scale / count; ignored rows (t < 0): loss 0, dlogits 0.
// A target ≥ vocab (the host validates targets; this is only a guard against reading out of
// the row) gives a NaN loss, so the mean shows it.
__global__ void cross_entropy_row_kernel(const uint16_t* logits, const int32_t* targets,
                                         int64_t vocab, int64_t ld, float scale,
                                         const float* count_in, float* row_loss,
                                         uint16_t* dlogits) {
  __shared__ MaxSum scratch[32];
  const int64_t row = blockIdx.x;
  const uint16_t* x = logits + row * ld;
  const int32_t target = targets[row];
  if (target < 0 || target >= vocab) {
    if (threadIdx.x == 0) row_loss[row] = target < 0 ? 0.0f : __int_as_float(0x7fc00000);
    if (dlogits)
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
        dlogits[row * ld + j] = target < 0 ? uint16_t{0} : uint16_t{0x7fc0};
    return;
  }
  MaxSum local{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = bf16_load(x[j]);
    if (v > local.max) {
      local.sum = local.sum * __expf(local.max - v) + 1.0f;
      local.max = v;
    } else if (v != -INFINITY) {  // -inf adds nothing (and −inf − −inf would be NaN)
      local.sum += __expf(v - local.max);
    }
  }
  const MaxSum total = block_merge(local, scratch);
  if (threadIdx.x == 0)
    row_loss[row] = logf(total.sum) - (bf16_load(x[target]) - total.max);
  if (dlogits) {
    const float factor = scale / count_in[0];
    const float to_probability = factor / total.sum;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = __expf(bf16_load(x[j]) - total.max) * to_probability;
      if (j == target) g -= factor;
      dlogits[row * ld + j] = bf16_round(g);
    }
  }
}

// loss_mean[0] = Σ row_loss / count (0 when count = 0), in double and a fixed order.
__global__ void mean_loss_kernel(const float* row_loss, int64_t rows, float* loss_mean) {
  __shared__ double scratch[32];
  const float count = loss_mean[0];
  double sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += row_loss[r];
  sum = block_sum_double(sum, scratch);  // its barriers order the read of count before the write
  if (threadIdx.x == 0) loss_mean[0] = count > 0.0f ? static_cast<float>(sum / count) : 0.0f;
}

}  // namespace

void launch_cross_entropy(const uint16_t* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, int64_t ld, float scale, float* row_loss, uint16_t* dlogits,
                          float* loss_mean, cudaStream_t stream) {
  count_targets_kernel<<<1, kThreads, 0, stream>>>(targets, rows, loss_mean);
  QV_CUDA_CHECK(cudaGetLastError());
  if (rows > 0) {
    cross_entropy_row_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, targets, vocab, ld, scale, loss_mean, row_loss, dlogits);
    QV_CUDA_CHECK(cudaGetLastError());
  }
  mean_loss_kernel<<<1, kThreads, 0, stream>>>(row_loss, rows, loss_mean);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
