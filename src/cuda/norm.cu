// LayerNorm and RMSNorm kernels: bf16 rows, fp32 statistics and math, fp32 parameter
// gradients. One warp per row for the row passes; the parameter gradients are column sums
// done by a second kernel in a fixed order, so they are deterministic.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/pdl.cuh"

namespace quiver::cuda::detail {
namespace {

// The row passes run one warp per row, kRowWarps rows per block. With kStep = 8 (the width a
// multiple of 8 and every pointer 16-byte aligned) a lane takes 8 consecutive columns per
// access; otherwise one. A row is read twice (its sums, then the output); the second read
// hits L1.
constexpr int kRowWarps = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// LayerNorm (kLayer) or RMSNorm; W is float or uint16_t (bf16).
template <typename W, bool kLayer, int kStep>
__global__ void __launch_bounds__(32 * kRowWarps)
    norm_forward_kernel(const uint16_t* x, const W* weight, const W* bias, float eps, int64_t rows,
                        int64_t width, uint16_t* y, float* mean_out, float* rstd_out) {
  pdl_trigger();  // the projection after it may launch (pdl.cuh)
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t first = static_cast<int64_t>(threadIdx.x % 32) * kStep, stride = 32 * kStep;
  const uint16_t* xr = x + row * width;
  const float inv_width = 1.0f / static_cast<float>(width);
  float mean = 0.0f;
  if constexpr (kLayer) {
    float sum = 0.0f;
    for (int64_t d = first; d < width; d += stride) {
      float v[kStep];
      load_cols<kStep>(xr + d, v);
#pragma unroll
      for (int e = 0; e < kStep; ++e) sum += v[e];
    }
    mean = warp_sum(sum) * inv_width;
  }
  float squares = 0.0f;
  for (int64_t d = first; d < width; d += stride) {
    float v[kStep];
    load_cols<kStep>(xr + d, v);
#pragma unroll
    for (int e = 0; e < kStep; ++e) squares += (v[e] - mean) * (v[e] - mean);
  }
  const float rstd = rsqrtf(warp_sum(squares) * inv_width + eps);
  if (threadIdx.x % 32 == 0) {
    if constexpr (kLayer) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  uint16_t* yr = y + row * width;
  for (int64_t d = first; d < width; d += stride) {
    float v[kStep], w[kStep], b[kStep];
    load_cols<kStep>(xr + d, v);
    load_cols<kStep>(weight + d, w);
    if constexpr (kLayer) load_cols<kStep>(bias + d, b);
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      v[e] = (v[e] - mean) * rstd * w[e];
      if constexpr (kLayer) v[e] += b[e];
    }
    store_cols<kStep>(yr + d, v);
  }
}

// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)), g = dy ⊙ weight (RMSNorm: no mean(g) term,
// x̂ = x · rstd). Assigned, or added to dx's old values when `accumulate`.
template <typename W, bool kLayer, int kStep>
__global__ void __launch_bounds__(32 * kRowWarps)
    norm_backward_dx_kernel(const uint16_t* dy, const uint16_t* x, const W* weight,
                            const float* mean_in, const float* rstd_in, int64_t rows, int64_t width,
                            uint16_t* dx, bool accumulate) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t first = static_cast<int64_t>(threadIdx.x % 32) * kStep, stride = 32 * kStep;
  const uint16_t* xr = x + row * width;
  const uint16_t* dyr = dy + row * width;
  const float mean = kLayer ? mean_in[row] : 0.0f;
  const float rstd = rstd_in[row];
  const float inv_width = 1.0f / static_cast<float>(width);
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int64_t d = first; d < width; d += stride) {
    float xv[kStep], g[kStep], w[kStep];
    load_cols<kStep>(xr + d, xv);
    load_cols<kStep>(dyr + d, g);
    load_cols<kStep>(weight + d, w);
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      g[e] *= w[e];
      g_sum += g[e];
      gx_sum += g[e] * (xv[e] - mean) * rstd;
    }
  }
  const float g_mean = kLayer ? warp_sum(g_sum) * inv_width : 0.0f;
  const float gx_mean = warp_sum(gx_sum) * inv_width;
  uint16_t* dxr = dx + row * width;
  for (int64_t d = first; d < width; d += stride) {
    float xv[kStep], g[kStep], w[kStep], old[kStep] = {};
    load_cols<kStep>(xr + d, xv);
    load_cols<kStep>(dyr + d, g);
    load_cols<kStep>(weight + d, w);
    if (accumulate) load_cols<kStep>(dxr + d, old);
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      const float xhat = (xv[e] - mean) * rstd;
      xv[e] = old[e] + rstd * (g[e] * w[e] - g_mean - xhat * gx_mean);
    }
    store_cols<kStep>(dxr + d, xv);
  }
}

// dweight[d] += Σ_r dy[r,d] x̂[r,d], dbias[d] += Σ_r dy[r,d]. Block (32 column lanes × 32 row
// lanes, kPair columns per column lane: 2 when the width is even and the rows 4-byte aligned)
// over the rows of its split blockIdx.y: row lane ty sums rows ty, ty + 32, ...; the row lanes
// are then added in a fixed tree. With one split the block adds into dweight and dbias; with
// several, split y writes its sums to partial_w/partial_b[y·width + d] and
// norm_params_reduce_kernel adds the splits in order, so the result is the same on every run.
constexpr int kColumnLanes = 32, kRowLanes = 32;

template <bool kLayer, int kPair>
__global__ void norm_backward_params_kernel(const uint16_t* dy, const uint16_t* x,
                                            const float* mean_in, const float* rstd_in,
                                            int64_t rows, int64_t width, int64_t rows_per_split,
                                            float* dweight, float* dbias, float* partial_w,
                                            float* partial_b) {
  constexpr int kColumns = kColumnLanes * kPair;
  __shared__ float weight_part[kRowLanes][kColumns + 1];
  __shared__ float bias_part[kRowLanes][kColumns + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t d0 = blockIdx.x * int64_t{kColumns} + tx * kPair;
  float weight_sum[kPair] = {}, bias_sum[kPair] = {};
  if (d0 < width) {
    const int64_t r0 = blockIdx.y * rows_per_split;
    const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      float g[kPair], xv[kPair];
      if constexpr (kPair == 2) {
        const uint32_t gp = *reinterpret_cast<const uint32_t*>(dy + r * width + d0);
        const uint32_t xp = *reinterpret_cast<const uint32_t*>(x + r * width + d0);
        g[0] = __uint_as_float(gp << 16), g[1] = __uint_as_float(gp & 0xffff0000u);
        xv[0] = __uint_as_float(xp << 16), xv[1] = __uint_as_float(xp & 0xffff0000u);
      } else {
        g[0] = bf16_load(dy[r * width + d0]);
        xv[0] = bf16_load(x[r * width + d0]);
      }
      const float mean = kLayer ? mean_in[r] : 0.0f, rstd = rstd_in[r];
#pragma unroll
      for (int e = 0; e < kPair; ++e) {
        weight_sum[e] += g[e] * (xv[e] - mean) * rstd;
        bias_sum[e] += g[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPair; ++e) {
    weight_part[ty][tx * kPair + e] = weight_sum[e];
    bias_part[ty][tx * kPair + e] = bias_sum[e];
  }
  __syncthreads();
  for (int stride = kRowLanes / 2; stride > 0; stride /= 2) {
    if (ty < stride) {
#pragma unroll
      for (int e = 0; e < kPair; ++e) {
        weight_part[ty][tx * kPair + e] += weight_part[ty + stride][tx * kPair + e];
        bias_part[ty][tx * kPair + e] += bias_part[ty + stride][tx * kPair + e];
      }
    }
    __syncthreads();
  }
  if (ty != 0 || d0 >= width) return;
#pragma unroll
  for (int e = 0; e < kPair; ++e) {
    const int64_t d = d0 + e;
    const float w = weight_part[0][tx * kPair + e], b = bias_part[0][tx * kPair + e];
    if (partial_w) {
      partial_w[blockIdx.y * width + d] = w;
      if constexpr (kLayer) partial_b[blockIdx.y * width + d] = b;
    } else {
      dweight[d] += w;
      if constexpr (kLayer) dbias[d] += b;
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
  const unsigned blocks = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
  const bool vec = width % 8 == 0 && aligned16({x, weight, bias, y});
  auto launch = [&](auto kernel) {
    kernel<<<blocks, 32 * kRowWarps, 0, stream>>>(x, weight, bias, eps, rows, width, y, mean, rstd);
  };
  if (bias)
    vec ? launch(norm_forward_kernel<W, true, 8>) : launch(norm_forward_kernel<W, true, 1>);
  else
    vec ? launch(norm_forward_kernel<W, false, 8>) : launch(norm_forward_kernel<W, false, 1>);
  QV_CUDA_CHECK(cudaGetLastError());
}

template <typename W>
void norm_backward_dx_typed(const uint16_t* dy, const uint16_t* x, const W* weight,
                            const float* mean, const float* rstd, int64_t rows, int64_t width,
                            uint16_t* dx, bool accumulate, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
  const bool vec = width % 8 == 0 && aligned16({dy, x, weight, dx});
  auto launch = [&](auto kernel) {
    kernel<<<blocks, 32 * kRowWarps, 0, stream>>>(dy, x, weight, mean, rstd, rows, width, dx, accumulate);
  };
  if (mean)
    vec ? launch(norm_backward_dx_kernel<W, true, 8>) : launch(norm_backward_dx_kernel<W, true, 1>);
  else
    vec ? launch(norm_backward_dx_kernel<W, false, 8>) : launch(norm_backward_dx_kernel<W, false, 1>);
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
                          int64_t width, uint16_t* dx, bool accumulate_dx, float* dweight, float* dbias,
                          float* scratch, int64_t scratch_floats, cudaStream_t stream) {
  if (rows == 0) return;
  if (weight_bf16)
    norm_backward_dx_typed(dy, x, static_cast<const uint16_t*>(weight), mean, rstd, rows, width,
                           dx, accumulate_dx, stream);
  else
    norm_backward_dx_typed(dy, x, static_cast<const float*>(weight), mean, rstd, rows, width, dx,
                           accumulate_dx, stream);
  // Splits of at least 512 rows, at most 128 of them, as the scratch allows.
  int64_t splits = std::min<int64_t>(128, (rows + 511) / 512);
  while (splits > 1 && splits * width * 2 > scratch_floats) splits /= 2;
  if (!scratch) splits = 1;
  const int64_t per_split = (rows + splits - 1) / splits;
  float* partial_w = splits > 1 ? scratch : nullptr;
  float* partial_b = splits > 1 ? scratch + splits * width : nullptr;
  const int pair = width % 2 == 0 && reinterpret_cast<uintptr_t>(dy) % 4 == 0 &&
                           reinterpret_cast<uintptr_t>(x) % 4 == 0
                       ? 2
                       : 1;
  const dim3 block(kColumnLanes, kRowLanes);
  const dim3 grid(static_cast<unsigned>((width + kColumnLanes * pair - 1) / (kColumnLanes * pair)),
                  static_cast<unsigned>(splits));
  auto launch = [&](auto kernel) {
    kernel<<<grid, block, 0, stream>>>(dy, x, mean, rstd, rows, width, per_split, dweight, dbias, partial_w,
                                       partial_b);
  };
  if (mean)
    pair == 2 ? launch(norm_backward_params_kernel<true, 2>) : launch(norm_backward_params_kernel<true, 1>);
  else
    pair == 2 ? launch(norm_backward_params_kernel<false, 2>) : launch(norm_backward_params_kernel<false, 1>);
  QV_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    norm_params_reduce_kernel<<<static_cast<unsigned>((width + 255) / 256), 256, 0, stream>>>(
        partial_w, mean ? partial_b : nullptr, splits, width, dweight, mean ? dbias : nullptr);
    QV_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace quiver::cuda::detail
