// Next-token sampling on the GPU: the distribution of infer::Sampler (src/infer/sampler.h) —
// greedy, or softmax(logits / temperature) restricted to the top-k tokens, then to the top-p
// nucleus, renormalized — drawn without leaving the device, so that a decode step and its
// sampling replay together in one CUDA graph.
//
// Exactness: the kept set is the CPU sampler's (top-k by logit with equal logits taken in id
// order, the nucleus the smallest most-likely prefix whose mass reaches top_p, ties again in
// id order). Weights are exp((z − z_max)/temperature) in fp32, held as 40-bit fixed point so
// that every sum is an exact integer: the result does not depend on the order of the
// additions, and a seed reproduces a completion. The uniform draw for row b at position p
// comes from a counter-based hash of (seed_b, p), not from the CPU sampler's generator: the
// GPU draws the same distribution, not the same numbers. Greedy takes the lowest id among
// equal maxima, as infer::argmax.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "infer/sampler.h"
#include "quiver/tensor.h"

namespace quiver::cuda {

// logits BF16 [B, V] (device). seeds: B uint64 in device memory. pos: device int32, the
// position of the token being drawn (the draw's counter). Writes tokens[b] (device int32 [B])
// and, when history is not null, history[b * history_stride + (*pos − origin)] (the caller
// guarantees that index is in range). One block per row; no scratch, no host sync.
void sample_tokens(const Tensor& logits, const infer::SamplerOptions& options, const uint64_t* seeds,
                   const int32_t* pos, int64_t origin, int32_t* tokens, int32_t* history,
                   int64_t history_stride, cudaStream_t stream = nullptr);

}  // namespace quiver::cuda
