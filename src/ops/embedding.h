// Token embedding lookup and its gradient.
//
// Shapes: tokens int32 [N] (caller memory, n entries); table [V, D]; out [N, D] (any leading
// dims whose product is N, e.g. [B, T, D]). CPU, contiguous, F32 or F64; out/dout/dtable
// have the table's dtype.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

// out[i, :] = table[tokens[i], :]. Throws Error naming the position and id of any token
// outside [0, V).
void embedding_forward(const int32_t* tokens, int64_t n, const Tensor& table, Tensor& out);

// dtable[tokens[i], :] += dout[i, :] for every i. Deterministic: each vocabulary row is
// owned by one thread and its contributions are summed in increasing i, so results do not
// depend on the thread count.
void embedding_backward_accumulate(const int32_t* tokens, int64_t n, const Tensor& dout,
                                   Tensor& dtable);

}  // namespace quiver::ops
