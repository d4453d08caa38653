// Causal multi-head attention on the CPU, with grouped KV heads (GQA): exact flash-style
// tiled forward and backward, a plain materialized reference for tests, and KV-cache decoding.
//
// Shapes (glossary: B batch, T time, Hq query heads, Hkv key/value heads, Dh head width):
//   q [B, T, Hq, Dh], k and v [B, T, Hkv, Dh], Hq % Hkv == 0; query head h reads kv head
//   h / (Hq / Hkv). A 3-d input [T, H, Dh] is the same with B = 1 (and every output then
//   drops its leading B as well). Inputs are contiguous CPU tensors of one dtype, F32 or F64;
//   the computation runs in that dtype. Scores are q·k / sqrt(Dh), causal (key j <= query p).
//
// Outputs follow one contract: pass an undefined Tensor to have it allocated, or a contiguous
// CPU tensor of the stated shape and the inputs' dtype. Every output is assigned (=), never
// accumulated into.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

// Flash forward: tiles of `tile` query rows against tiles of `tile` key rows with an online
// softmax per row; never forms a T×T array. Writes y [B, T, Hq, Dh] and the per-row
// log-sum-exp of the scaled scores lse [B, Hq, T] (what the backward needs).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y, Tensor& lse,
                       int64_t tile = 64);

// Flash backward from the forward's y and lse and the upstream gradient dy (shape of y):
// writes dq (shape of q), dk and dv (shape of k; summed over the query heads of a group).
// Recomputes the scores tile by tile.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                        const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv,
                        int64_t tile = 64);

// Plain reference, written for clarity: materializes the T×T scores and probabilities of
// each head. Same shapes and contract as above (no lse).
void attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y);
void attention_reference_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv);

// Bytes of working arrays (beyond inputs and outputs) that one call allocates, for the
// benchmark's memory column: flash O(tile² + tile·Dh) per thread, the reference O(T²) per thread.
int64_t attention_forward_workspace_bytes(const Shape& q_shape, DType dtype, int64_t tile = 64);
int64_t attention_reference_forward_workspace_bytes(const Shape& q_shape, DType dtype);

// The keys and values of one attention layer for B sequences decoded in lockstep (a model
// keeps one KVCache per attention layer). Rows [0, length) of k and v are valid and hold the
// sequence's positions 0..length-1 (the rows after RoPE where the model applies it).
struct KVCache {
  KVCache() = default;
  KVCache(int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim, DType dtype);

  Tensor k, v;  // [B, capacity, Hkv, Dh]
  int64_t length = 0;

  int64_t batch() const { return k.dim(0); }
  int64_t capacity() const { return k.dim(1); }
  int64_t kv_heads() const { return k.dim(2); }
  int64_t head_dim() const { return k.dim(3); }

  // Appends n rows per sequence: k_rows and v_rows are [B, n, Hkv, Dh], or [n, Hkv, Dh] when
  // B = 1 (the prompt's keys and values at prefill). Throws when the capacity would be exceeded.
  void append(const Tensor& k_rows, const Tensor& v_rows);
  // Appends one decode step's rows, k_row and v_row [B, Hkv, Dh].
  void append_row(const Tensor& k_row, const Tensor& v_row);
  void clear() { length = 0; }
};

// One decode step: the query row q_row [B, Hq, Dh] of position length-1 attends to all cached
// rows [0, length); writes y_row [B, Hq, Dh]. The caller appends this position's k and v first
// (append_row), so the row sees itself as in the causal forward. Uses no scratch arrays.
void attention_decode_step(const Tensor& q_row, const KVCache& cache, Tensor& y_row);

}  // namespace quiver::ops
