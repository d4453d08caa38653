// Launching a tile kernel with dynamic shared memory (algproj_fused.cu, algproj_tma.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/pdl.cuh"

namespace quiver::cuda::detail {

// Launches `kernel` with its dynamic shared memory (opted in once per kernel): one block per
// tile, or (persistent) at most as many blocks as fit on the GPU at once. Every such kernel is a
// programmatic dependent (pdl.cuh): it may start while the kernel before it on the stream ends,
// so it reads only its plan before pdl_wait() and its inputs and outputs after. A kernel whose
// shared memory varies between launches passes the most any launch takes as smem_max (the opt-in
// and the blocks that fit are counted with it, once).
template <auto kernel, class Args>
void launch(int threads, size_t smem, int tiles, bool persistent, const Args& args, cudaStream_t stream,
            size_t smem_max = 0) {
  static const int resident = [&] {
    const size_t most = smem_max > 0 ? smem_max : smem;
    QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
    int dev = 0, sms = 0, per_sm = 0;
    QV_CUDA_CHECK(cudaGetDevice(&dev));
    QV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    QV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, most));
    return std::max(1, per_sm) * sms;
  }();
  if (tiles == 0) return;
  cudaLaunchAttribute attr = pdl_attribute();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(persistent ? std::min(tiles, resident) : tiles));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  QV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args));
}

}  // namespace quiver::cuda::detail
