// Causal multi-head attention on the GPU with grouped KV heads (GQA): the flash forward and
// backward, the CUDA counterparts of ops::attention_forward / attention_backward
// (src/ops/attention.h).
//
// Shapes (glossary: B batch, T time, Hq query heads, Hkv key/value heads, Dh head width):
//   q, y, dy, dq [B, T, Hq, Dh] BF16; k, v, dk, dv [B, T, Hkv, Dh] BF16; lse [B, Hq, T] F32.
//   Hq % Hkv == 0 and query head h reads kv head h / (Hq / Hkv). A 3-d [T, H, Dh] input means
//   B = 1 (lse is then [Hq, T]). 1 <= Dh <= 128. Scores are q·k / sqrt(Dh), causal (key j <= p).
//
// Precision (shared/DESIGN.md): inputs and outputs bf16, every product and sum in fp32, the
// log-sum-exp in fp32; each output is rounded to bf16 once.
//
// Contract: every tensor is a contiguous CUDA tensor (call register_backend() first). Outputs
// are assigned (=), never accumulated into; pass an undefined Tensor to have it allocated
// (cudaMalloc: preallocate in a training step), or a tensor of the stated shape and dtype.
// Each call enqueues its kernels on `stream`, uses no scratch memory and never synchronizes
// the host.
//
// Kernels: one tiled mixer (a 64-row query tile against 64-row key tiles staged in shared
// memory, online softmax state m, l, acc in fp32) with the score rule isolated in a small
// device functor, so FlashRelation can plug in its own rule later. The math is scalar fp32 on
// CUDA cores for now: tensor-core (mma/wgmma) tiles come in a later session.
#pragma once

#include <cuda_runtime.h>

#include "quiver/tensor.h"

namespace quiver::cuda {

// Writes y (shape of q, BF16) and lse (F32 [B, Hq, T]): the natural log of the sum over the
// visible keys of exp(scaled score), what the backward needs.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y, Tensor& lse,
                       cudaStream_t stream = nullptr);

// FlashAttention-2 backward from the forward's y and lse and the upstream gradient dy (shape
// of y). Writes dq (shape of q), dk and dv (shape of k; summed over the query heads of a
// group). Deterministic: dk/dv by one pass over the query tiles per key tile, dq by a second
// pass over the key tiles per query tile (no atomics).
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                        const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv,
                        cudaStream_t stream = nullptr);

}  // namespace quiver::cuda
