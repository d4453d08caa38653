// Fused softmax cross-entropy over the vocabulary.
//
// Shapes: logits [N, V] (rows = all leading dims flattened, e.g. [B, T, V]); targets int32,
// N entries of caller memory; a target < 0 marks an ignored row (padding, prompt tokens).
// CPU, contiguous, F32 or F64; dlogits has the logits' shape and dtype.
//
// Each row uses a stable log-softmax (max subtracted, log-sum-exp in double), so very large
// logits stay finite. loss = mean over non-ignored rows of (logsumexp(row) − row[target]).
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver::ops {

// Returns the mean loss over non-ignored rows (0 when every row is ignored). When dlogits
// is not null it is assigned scale · d(mean loss)/dlogits, i.e. for a non-ignored row
// scale · (softmax(row) − onehot(target)) / count, and zeros for ignored rows.
// Throws Error naming the row when a target is ≥ V.
double cross_entropy_forward_backward(const Tensor& logits, const int32_t* targets, float scale,
                                      Tensor* dlogits);

}  // namespace quiver::ops
