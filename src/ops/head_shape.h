// Shape checks shared by the token mixers: per-head tensors are [T, H, Dh] (one sequence,
// B = 1) or [B, T, H, Dh], CPU, contiguous, F32 or F64.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

struct HeadShape {
  int64_t B = 1, T = 0, H = 0, Dh = 0;
  int ndim = 3;  // 3 when the batch dimension was left out
};

// Parses a [T, H, Dh] or [B, T, H, Dh] shape; every size must be positive. Errors name `name`.
HeadShape head_shape(const Shape& s, const char* name);

// Defined, CPU, contiguous, F32 or F64; errors name `name`.
void check_float_input(const Tensor& t, const char* name);

}  // namespace quiver::ops
