// AdamW and global-norm gradient clipping over the flat fp32 parameter buffer. Elements are
// mapped to their segment by binary search in the device segment table (sorted, disjoint);
// elements outside trainable segments are not touched. The update math is fp64, as in
// train::AdamW::step, so the results match the CPU to the last float bit or so.
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 256;

// The segment holding element i, or null when i lies in no segment.
__device__ const SegmentDesc* find_segment(const SegmentDesc* segments, int count, int64_t i) {
  int lo = 0, hi = count;  // first segment with offset > i is at lo after the search
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (segments[mid].offset <= i) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return nullptr;
  const SegmentDesc* s = segments + lo - 1;
  return i < s->offset + s->numel ? s : nullptr;
}

// Pass 1: partial[b] = Σ g² (fp64) over the trainable elements that block b visits. The grid
// is fixed (kGradNormBlocks × kThreads) so every run adds in the same order.
__global__ void grad_square_sum_kernel(const float* grads, const SegmentDesc* segments, int count,
                                       int64_t extent, double* partial) {
  __shared__ double scratch[32];
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < extent;
       i += int64_t{gridDim.x} * blockDim.x) {
    const SegmentDesc* s = find_segment(segments, count, i);
    if (s && s->trainable) {
      const double g = grads[i];
      sum += g * g;
    }
  }
  sum = block_sum_double(sum, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Pass 2 (one block of kGradNormBlocks-many-or-more threads): scratch[kGradNormSum] = Σ partial,
// in a fixed order.
__global__ void grad_sum_finish_kernel(double* scratch) {
  __shared__ double reduce[32];
  const double v = threadIdx.x < kGradNormBlocks ? scratch[threadIdx.x] : 0.0;
  const double sum = block_sum_double(v, reduce);
  if (threadIdx.x == 0) scratch[kGradNormSum] = sum;
}

// One thread: norm = √Σ g² and the clipping scale (scratch[kGradNormSum + 1]).
__global__ void clip_scale_kernel(double* scratch, double max_norm, float* norm_out) {
  const double norm = sqrt(scratch[kGradNormSum]);
  scratch[kGradNormSum + 1] = (max_norm > 0 && norm > max_norm) ? max_norm / norm : 1.0;
  norm_out[0] = static_cast<float>(norm);
}

// Pass 3: grads ← float(grads · scale) over trainable elements, when scale ≠ 1.
__global__ void grad_scale_kernel(float* grads, const SegmentDesc* segments, int count,
                                  int64_t extent, const double* scale_in) {
  const double scale = *scale_in;
  if (scale == 1.0) return;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < extent;
       i += int64_t{gridDim.x} * blockDim.x) {
    const SegmentDesc* s = find_segment(segments, count, i);
    if (s && s->trainable) grads[i] = static_cast<float>(grads[i] * scale);
  }
}

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v,
                             const SegmentDesc* segments, int count, int64_t extent,
                             AdamWConstants c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < extent;
       i += int64_t{gridDim.x} * blockDim.x) {
    const SegmentDesc* s = find_segment(segments, count, i);
    if (!s || !s->trainable) continue;
    const double g = grads[i];
    const double mi = c.beta1 * m[i] + (1.0 - c.beta1) * g;
    const double vi = c.beta2 * v[i] + (1.0 - c.beta2) * g * g;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    double p = params[i];
    if (s->decay) p *= c.decay_factor;
    p -= c.step_size * mi / (sqrt(vi) / c.bc2_sqrt + c.eps);
    params[i] = static_cast<float>(p);
  }
}

}  // namespace

void launch_grad_square_sum(const float* grads, const SegmentDesc* segments, int num_segments,
                            int64_t extent, double* scratch, cudaStream_t stream) {
  grad_square_sum_kernel<<<kGradNormBlocks, kThreads, 0, stream>>>(grads, segments, num_segments, extent,
                                                                   scratch);
  QV_CUDA_CHECK(cudaGetLastError());
  static_assert(kGradNormBlocks <= 1024, "the finishing kernel sums the partials in one block");
  constexpr int finish_threads = (kGradNormBlocks + 31) / 32 * 32;
  grad_sum_finish_kernel<<<1, finish_threads, 0, stream>>>(scratch);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_clip_to_norm(float* grads, const SegmentDesc* segments, int num_segments, int64_t extent,
                         double max_norm, double* scratch, float* norm_out, cudaStream_t stream) {
  clip_scale_kernel<<<1, 1, 0, stream>>>(scratch, max_norm, norm_out);
  QV_CUDA_CHECK(cudaGetLastError());
  if (extent > 0) {
    grad_scale_kernel<<<grid_for(extent, kThreads), kThreads, 0, stream>>>(grads, segments, num_segments, extent,
                                                                          scratch + kGradNormSum + 1);
    QV_CUDA_CHECK(cudaGetLastError());
  }
}

void launch_adamw(float* params, const float* grads, float* m, float* v,
                  const SegmentDesc* segments, int num_segments, int64_t extent,
                  const AdamWConstants& c, cudaStream_t stream) {
  if (extent == 0) return;
  adamw_kernel<<<grid_for(extent, kThreads), kThreads, 0, stream>>>(params, grads, m, v, segments,
                                                                    num_segments, extent, c);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
