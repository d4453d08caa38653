// LayerNorm and RMSNorm over the last dimension.
//
// Shapes: x, y, dy, dx [N, D] (rows = all leading dims flattened, e.g. [B, T, D]);
// weight, bias, dweight, dbias [D]; mean, rstd [N] (any shape with N elements), saved by
// the forward pass for the backward pass. CPU, contiguous, F32 or F64, all one dtype.
// Row statistics are accumulated in double.
//
//   LayerNorm: mean = Σx/D, var = Σ(x − mean)²/D (biased), rstd = 1/√(var + eps),
//              y = (x − mean)·rstd·weight + bias
//   RMSNorm:   rstd = 1/√(Σx²/D + eps), y = x·rstd·weight
//
// Backward: dx is assigned; dweight/dbias are accumulated (+=), so gradients of a
// parameter used several times (or over several micro-batches) add up.
#pragma once

#include "quiver/tensor.h"

namespace quiver::ops {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx,
                        Tensor& dweight_accumulate, Tensor& dbias_accumulate);

void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight_accumulate);

}  // namespace quiver::ops
