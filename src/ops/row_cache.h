// The storage that the decoding caches share: two tensors [B, capacity, H, Dh] whose rows
// are appended together, one row per token — attention's keys and values (KVCache), or a
// Full Relation layer's P2 after RoPE and Ĩ after Givens (RelationCache, SPEC §2.5).
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops::detail {

// Zeroed [B, capacity, H, Dh] tensors; errors name `cache`.
void allocate_row_pair(const char* cache, int64_t batch, int64_t capacity, int64_t heads,
                       int64_t head_dim, DType dtype, Tensor& first, Tensor& second);

// Copies first_rows and second_rows ([B, n, H, Dh], or [n, H, Dh] when B = 1) into rows
// [length, length + n) and returns the new length. Errors name the cache and the tensors.
int64_t append_row_pair(const char* cache, Tensor& first, Tensor& second, int64_t length,
                        const Tensor& first_rows, const Tensor& second_rows, const char* first_name,
                        const char* second_name);

// One decode step: first_row and second_row [B, H, Dh].
int64_t append_single_row_pair(const char* cache, Tensor& first, Tensor& second, int64_t length,
                               const Tensor& first_row, const Tensor& second_row,
                               const char* first_name, const char* second_name);

}  // namespace quiver::ops::detail
