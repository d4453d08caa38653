// Launching a tile kernel with dynamic shared memory (algproj_fused.cu, algproj_tma.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/check.h"

namespace quiver::cuda::detail {

// Launches `kernel` with its dynamic shared memory (opted in once per kernel): one block per
// tile, or (persistent) at most as many blocks as fit on the GPU at once.
template <auto kernel, class Args>
void launch(int threads, size_t smem, int tiles, bool persistent, const Args& args, cudaStream_t stream) {
  static const int resident = [&] {
    QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int dev = 0, sms = 0, per_sm = 0;
    QV_CUDA_CHECK(cudaGetDevice(&dev));
    QV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    return std::max(1, per_sm) * sms;
  }();
  if (tiles == 0) return;
  kernel<<<persistent ? std::min(tiles, resident) : tiles, threads, smem, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
