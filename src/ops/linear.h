// Dense layer y = x W (+ b) through OpenBLAS.
//
// Shapes: x [N, K] (rows = all leading dims flattened, e.g. [B, T, K]); W [K, N_out] (the
// canonical K×N layout used everywhere in quiver); b [N_out] or an undefined Tensor for no
// bias; y, dy [N, N_out] (same leading dims as x). CPU, contiguous, F32 or F64, one dtype.
// The GEMMs use OpenBLAS's own threads: a caller inside quiver::parallel_for holds a
// blas::SingleThreadScope so the two pools do not oversubscribe the cores.
#pragma once

#include "quiver/tensor.h"

namespace quiver::ops {

// y = x W + b (assigned).
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);

// dx = dy Wᵀ (assigned; skipped when dx is null), dw += xᵀ dy, db += Σ_rows dy (skipped when
// db is null).
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor& dw_accumulate, Tensor* db_accumulate);

}  // namespace quiver::ops
