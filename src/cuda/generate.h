// Generation on the GPU, the counterpart of infer::generate_tokens (src/infer/generator.h):
// one prefill of the prompts, then per new token one decode step and the sampling of the next
// token (cuda/sampler.h), both on the device. The step and its sampling are captured in one
// CUDA graph per algebraic row type (one graph for dense models) and replayed at every
// position: the position, the fed-back token and the history of new tokens live in device
// memory, so a replay needs no host work beyond its launch. The host reads the new tokens every
// `read_every` steps to check stop tokens and stop strings; steps run past a row's stop are
// discarded. Each row draws with its sampler's options and seed (SamplerOptions::seed).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/model.h"
#include "infer/generator.h"
#include "infer/sampler.h"

namespace quiver::cuda {

struct GpuGenerateOptions {
  bool graphs = true;       // false: launch every kernel of every step (for comparison)
  int64_t read_every = 16;  // steps between reads of the new tokens (≥ 1)
};

// prompts: B rows of equal length L; L + max_new_tokens ≤ the context. samplers[b] gives row
// b's options (all rows must share temperature, top-k, top-p and greedy) and seed.
std::vector<infer::TokenCompletion> generate_tokens(
    GpuModel& model, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
    const std::vector<infer::Sampler>& samplers, const std::vector<int32_t>& stop_ids,
    const std::function<bool(size_t row, const std::vector<int32_t>& tokens)>& stop_check = {},
    infer::DecodeTiming* timing = nullptr, const GpuGenerateOptions& options = {});

}  // namespace quiver::cuda
