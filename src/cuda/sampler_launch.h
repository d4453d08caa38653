// Internal: the launcher of the sampling kernel (src/cuda/sampler.h); shapes checked by
// sampler.cpp.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace quiver::cuda::detail {

struct SampleArgs {
  const uint16_t* logits;  // [B, V] bf16
  int64_t B, V;
  float inv_temperature;
  int64_t top_k;           // 0 or >= V: all
  double top_p;            // 1: all
  bool greedy;
  const uint64_t* seeds;
  const int32_t* pos;
  int64_t origin;
  int32_t* tokens;
  int32_t* history;
  int64_t history_stride;
};

void launch_sample(const SampleArgs& args, cudaStream_t stream);

}  // namespace quiver::cuda::detail
