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
// Kernels: one tiled mixer and a score rule. The mixer (flash_mixer.cuh, shared with
// FlashRelation) owns the tiles, the tensor-core products and the normalization: blocks of 4
// warps, 64-row query and key tiles staged in shared memory by cp.async (two stages deep), each
// warp owning 16 rows of the product it accumulates; mma.sync m16n8k16 with bf16 operands from
// ldmatrix and fp32 accumulators; the online softmax (forward) in registers with base-2
// exponentials, log2(e)·scale folded into the logit. Head widths are padded to a multiple of 16
// (24 -> 32) with zeros. The backward is FlashAttention-2's: dK/dV per key tile looping over the
// query tiles (and the group's query heads), dQ in a second kernel per query tile looping over
// the key tiles.
//   Precision of the products: q, k, v, dy enter the mma exactly (they are bf16); the
// probabilities P (forward, dV) and dS (dK, dQ) are rounded to bf16 as mma operands, as in
// every FlashAttention; the normalizer, lse and D = dy·y stay fp32.
//
// The score rule is a small device struct (CausalSoftmaxRule in attention.cu, RelationScoreRule
// in relation.cu; the interface is documented in flash_mixer.cuh): visibility (a history mask,
// asked only on tiles that reach the diagonal), the base-2 logit of a dot product, the row's
// finish after the scan (output weights and statistics), the backward's row normalizer and
// (P, dS) of a dot, and for rules with a Self entry outside the scan (Relation) the row terms
// added to dq, dk and dv.
//
// Why mma.sync and not wgmma: the kernels are FlashAttention-2-shaped (a warp owns 16 rows and
// its softmax state), which mma.sync expresses directly and which handles every padded width
// 16..128 and the backward's five products with one fragment convention; wgmma needs a
// warpgroup-wide 64-row tile, shared-memory B operands in its swizzled layout and asynchronous
// pipelining with producer warps (FlashAttention-3) to pay off. That is the next step if these
// kernels become the bottleneck.
//
// Decode: one block per (query head, batch); teams of lanes take positions round-robin, each
// with an online softmax in fp32, merged in the warp by shuffles and across warps in shared
// memory.
#pragma once

#include <cstdint>

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
// pass over the key tiles per query tile (no atomics). D_p = dy_p · y_p is computed first into
// the device's flash scratch (context.h), which the first call of a larger shape grows.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                        const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv,
                        cudaStream_t stream = nullptr);

// One decode step for B sequences in lockstep at position pos = *d_pos (device int32: tokens
// already in the cache). q_row BF16 [B, Hq, Dh]; k_row, v_row BF16 [B, Hkv, Dh]; cache_k,
// cache_v BF16 [B, capacity, Hkv, Dh]; y_row BF16 [B, Hq, Dh] assigned. Writes k_row, v_row into
// the caches at row pos, then attends over rows 0..pos (scale 1/sqrt(Dh), fp32 softmax, y
// rounded to bf16 once). Reads pos on the device only (capturable in a CUDA graph); caller
// guarantees pos < capacity; no scratch, no sync.
void attention_decode_step(const Tensor& q_row, const Tensor& k_row, const Tensor& v_row,
                           Tensor& cache_k, Tensor& cache_v, const int32_t* d_pos, Tensor& y_row,
                           cudaStream_t stream = nullptr);

}  // namespace quiver::cuda
