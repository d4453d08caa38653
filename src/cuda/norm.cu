// LayerNorm and RMSNorm kernels: bf16 rows, fp32 statistics and math, fp32 parameter
// gradients. One block per row for the row passes; the parameter gradients are column sums
// done by a second kernel in a fixed order, so they are deterministic.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kRowThreads = 256;

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the sum.
// `scratch` holds 32 floats; the trailing barrier lets the caller reuse it at once.
__device__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads();
  return total;
}

// LayerNorm (kLayer) or RMSNorm of one row per block; W is float or uint16_t (bf16).
template <typename W, bool kLayer>
__global__ void norm_forward_kernel(const uint16_t* x, const W* weight, const W* bias, float eps,
                                    int64_t width, uint16_t* y, float* mean_out,
                                    float* rstd_out) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * width;
  const float inv_width = 1.0f / static_cast<float>(width);
  float mean = 0.0f;
  if constexpr (kLayer) {
    float sum = 0.0f;
    for (int64_t d = threadIdx.x; d < width; d += blockDim.x) sum += bf16_load(xr[d]);
    mean = block_sum(sum, scratch) * inv_width;
  }
  float squares = 0.0f;
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    const float c = bf16_load(xr[d]) - mean;
    squares += c * c;
  }
  const float rstd = rsqrtf(block_sum(squares, scratch) * inv_width + eps);
  if (threadIdx.x == 0) {
    if constexpr (kLayer) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  uint16_t* yr = y + row * width;
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    float v = (bf16_load(xr[d]) - mean) * rstd * param_load(weight, d);
    if constexpr (kLayer) v += param_load(bias, d);
    yr[d] = bf16_round(v);
  }
}

// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)), g = dy ⊙ weight (RMSNorm: no mean(g) term,
// x̂ = x · rstd). Assigned.
template <typename W, bool kLayer>
__global__ void norm_backward_dx_kernel(const uint16_t* dy, const uint16_t* x, const W* weight,
                                        const float* mean_in, const float* rstd_in, int64_t width,
                                        uint16_t* dx) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * width;
  const uint16_t* dyr = dy + row * width;
  const float mean = kLayer ? mean_in[row] : 0.0f;
  const float rstd = rstd_in[row];
  const float inv_width = 1.0f / static_cast<float>(width);
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    const float g = bf16_load(dyr[d]) * param_load(weight, d);
    g_sum += g;
    gx_sum += g * (bf16_load(xr[d]) - mean) * rstd;
  }
  const float g_mean = kLayer ? block_sum(g_sum, scratch) * inv_width : 0.0f;
  const float gx_mean = block_sum(gx_sum, scratch) * inv_width;
  uint16_t* dxr = dx + row * width;
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    const float xhat = (bf16_load(xr[d]) - mean) * rstd;
    const float g = bf16_load(dyr[d]) * param_load(weight, d);
    dxr[d] = bf16_round(rstd * (g - g_mean - xhat * gx_mean));
  }
}

// dweight[d] += Σ_r dy[r,d] x̂[r,d], dbias[d] += Σ_r dy[r,d]. Block (32 columns × 32 row
// lanes) over the rows of its split blockIdx.y: lane ty sums rows ty, ty + 32, ...; the lanes
// are then added in a fixed tree. With one split the block adds into dweight and dbias; with
// several, split y writes its sums to partial_w/partial_b[y·width + d] and
// norm_params_reduce_kernel adds the splits in order, so the result is the same on every run.
constexpr int kColumns = 32, kRowLanes = 32;

template <bool kLayer>
__global__ void norm_backward_params_kernel(const uint16_t* dy, const uint16_t* x,
                                            const float* mean_in, const float* rstd_in,
                                            int64_t rows, int64_t width, int64_t rows_per_split,
                                            float* dweight, float* dbias, float* partial_w,
                                            float* partial_b) {
  __shared__ float weight_part[kRowLanes][kColumns + 1];
  __shared__ float bias_part[kRowLanes][kColumns + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t d = blockIdx.x * int64_t{kColumns} + tx;
  float weight_sum = 0.0f, bias_sum = 0.0f;
  if (d < width) {
    const int64_t r0 = blockIdx.y * rows_per_split;
    const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const float g = bf16_load(dy[r * width + d]);
      const float mean = kLayer ? mean_in[r] : 0.0f;
      weight_sum += g * (bf16_load(x[r * width + d]) - mean) * rstd_in[r];
      bias_sum += g;
    }
  }
  weight_part[ty][tx] = weight_sum;
  bias_part[ty][tx] = bias_sum;
  __syncthreads();
  for (int stride = kRowLanes / 2; stride > 0; stride /= 2) {
    if (ty < stride) {
      weight_part[ty][tx] += weight_part[ty + stride][tx];
      bias_part[ty][tx] += bias_part[ty + stride][tx];
    }
    __syncthreads();
  }
  if (ty == 0 && d < width) {
    if (partial_w) {
      partial_w[blockIdx.y * width + d] = weight_part[0][tx];
      if constexpr (kLayer) partial_b[blockIdx.y * width + d] = bias_part[0][tx];
    } else {
      dweight[d] += weight_part[0][tx];
      if constexpr (kLayer) dbias[d] += bias_part[0][tx];
    }
  }
}

__global__ void norm_params_reduce_kernel(const float* partial_w, const float* partial_b,
                                          int64_t splits, int64_t width, float* dweight,
                                          float* dbias) {
  const int64_t d = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (d >= width) return;
  float w = 0.0f, b = 0.0f;
  for (int64_t y = 0; y < splits; ++y) {
    w += partial_w[y * width + d];
    if (dbias) b += partial_b[y * width + d];
  }
  dweight[d] += w;
  if (dbias) dbias[d] += b;
}

template <typename W>
void norm_forward_typed(const uint16_t* x, const W* weight, const W* bias, float eps,
                        int64_t rows, int64_t width, uint16_t* y, float* mean, float* rstd,
                        cudaStream_t stream) {
  if (bias)
    norm_forward_kernel<W, true>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, weight, bias, eps, width,
                                                                   y, mean, rstd);
  else
    norm_forward_kernel<W, false>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, weight, bias, eps, width,
                                                                   y, mean, rstd);
  QV_CUDA_CHECK(cudaGetLastError());
}

template <typename W>
void norm_backward_dx_typed(const uint16_t* dy, const uint16_t* x, const W* weight,
                            const float* mean, const float* rstd, int64_t rows, int64_t width,
                            uint16_t* dx, cudaStream_t stream) {
  if (mean)
    norm_backward_dx_kernel<W, true>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(dy, x, weight, mean, rstd,
                                                                   width, dx);
  else
    norm_backward_dx_kernel<W, false>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(dy, x, weight, mean, rstd,
                                                                   width, dx);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_norm_forward(const uint16_t* x, const void* weight, const void* bias, bool weight_bf16,
                         float eps, int64_t rows, int64_t width, uint16_t* y, float* mean,
                         float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  if (weight_bf16)
    norm_forward_typed(x, static_cast<const uint16_t*>(weight), static_cast<const uint16_t*>(bias),
                       eps, rows, width, y, mean, rstd, stream);
  else
    norm_forward_typed(x, static_cast<const float*>(weight), static_cast<const float*>(bias), eps,
                       rows, width, y, mean, rstd, stream);
}

void launch_norm_backward(const uint16_t* dy, const uint16_t* x, const void* weight,
                          bool weight_bf16, const float* mean, const float* rstd, int64_t rows,
                          int64_t width, uint16_t* dx, float* dweight, float* dbias,
                          float* scratch, int64_t scratch_floats, cudaStream_t stream) {
  if (rows == 0) return;
  if (weight_bf16)
    norm_backward_dx_typed(dy, x, static_cast<const uint16_t*>(weight), mean, rstd, rows, width,
                           dx, stream);
  else
    norm_backward_dx_typed(dy, x, static_cast<const float*>(weight), mean, rstd, rows, width, dx,
                           stream);
  // Splits of at least 512 rows, at most 128 of them, as the scratch allows.
  int64_t splits = std::min<int64_t>(128, (rows + 511) / 512);
  while (splits > 1 && splits * width * 2 > scratch_floats) splits /= 2;
  if (!scratch) splits = 1;
  const int64_t per_split = (rows + splits - 1) / splits;
  float* partial_w = splits > 1 ? scratch : nullptr;
  float* partial_b = splits > 1 ? scratch + splits * width : nullptr;
  const dim3 block(kColumns, kRowLanes);
  const dim3 grid(static_cast<unsigned>((width + kColumns - 1) / kColumns), static_cast<unsigned>(splits));
  if (mean)
    norm_backward_params_kernel<true><<<grid, block, 0, stream>>>(dy, x, mean, rstd, rows, width, per_split,
                                                                  dweight, dbias, partial_w, partial_b);
  else
    norm_backward_params_kernel<false><<<grid, block, 0, stream>>>(dy, x, mean, rstd, rows, width, per_split,
                                                                   dweight, dbias, partial_w, partial_b);
  QV_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    norm_params_reduce_kernel<<<static_cast<unsigned>((width + 255) / 256), 256, 0, stream>>>(
        partial_w, mean ? partial_b : nullptr, splits, width, dweight, mean ? dbias : nullptr);
    QV_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace quiver::cuda::detail
