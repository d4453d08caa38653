// The algebraic projection on the GPU (SPEC §1.3): Y = Φ_W(X), the CUDA counterpart of
// ops::AlgProj (src/ops/algproj.h), with the same decomposition.
//
// The law's support is cut into rectangles of contiguous (input-group, output-group)
// ranges exactly as ops::AlgProj does (the algorithm is repeated in algproj.cpp: the CPU
// class keeps its rectangles private). Terms shared by every row type run once over all
// rows; the rest run per row type on that type's rows. Each rectangle is one cuda::gemm
// (bf16 operands, fp32 accumulation). A type's rows are used in place when they form an
// arithmetic progression (strided operands: lda = stride·K), else they are gathered into
// scratch by a kernel and the partial result is scatter-added back. Decoding one row or a
// few rows of mixed types is the same call.
//
// Precision (shared/DESIGN.md): x, w, dy, y, dx are bf16; dw is fp32. When an output element
// receives several rectangle products, they are summed in an fp32 scratch and converted to
// bf16 once at the end, so a bf16 output is rounded exactly once (as a dense GEMM's would
// be). When every output group is reached by at most one product (dense law, block-diagonal
// shared terms with no per-type terms), the products write the bf16 output directly.
//
// Contract: forward assigns y; backward assigns dx and dw (either may be null), as the CPU
// class. Shapes: x [M, K], w [K, N], y and dy [M, N], dx [M, K] bf16; dw [K, N] fp32; all
// contiguous CUDA tensors. row_types has M host entries in [0, q).
//
// Streams: every call enqueues on `stream` and never synchronizes the host. The instance
// keeps device scratch (fp32 accumulators, gathered rows, row indices) reused across calls,
// so one instance's calls must be ordered (one stream, or events). Scratch grows with cudaMalloc
// on first use of a larger shape: run each shape once before capturing a CUDA graph. The row
// index upload is a cudaMemcpyAsync from pageable host memory; with gathered rows a capture
// would record the indices of the captured call.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "algebra/law.h"
#include "ops/algproj.h"
#include "quiver/tensor.h"

namespace quiver::cuda {

class AlgProj {
 public:
  using Rect = ops::AlgProj::Rect;

  AlgProj(algebra::Law law, algebra::GroupWidths widths,
          ops::RowAccess access = ops::RowAccess::InPlace);

  const algebra::Law& law() const { return law_; }
  const algebra::GroupWidths& widths() const { return widths_; }
  ops::RowAccess access() const { return access_; }
  int64_t K() const { return widths_.K(); }
  int64_t N() const { return widths_.N(); }

  // y = Φ_W(x), assigned.
  void forward(const Tensor& x, const Tensor& w, const std::vector<int>& row_types, Tensor& y,
               cudaStream_t stream = 0) const;
  // dx (assigned, bf16) and dw (assigned, fp32) of forward; either may be null.
  void backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                const std::vector<int>& row_types, Tensor* dx, Tensor* dw,
                cudaStream_t stream = 0) const;

  // Products per call (as ops::AlgProj): shared rectangles and those of each type.
  size_t shared_products() const { return shared_.size(); }
  size_t type_products(int alpha) const { return per_type_[alpha].size(); }
  const std::vector<Rect>& shared_rects() const { return shared_; }
  const std::vector<Rect>& type_rects(int alpha) const { return per_type_[alpha]; }

 private:
  // Device scratch reused across calls; grown (never shrunk) on demand.
  struct Scratch {
    Tensor acc;      // fp32 [M, N] or [M, K] accumulator of a bf16 output
    Tensor part;     // fp32 [m, N] or [m, K] product of one gathered type
    Tensor rows_a;   // bf16 gathered rows of x or dy
    Tensor rows_b;   // bf16 gathered rows of dy (dW)
    Tensor indices;  // int64 row indices of every gathered type, concatenated
  };

  algebra::Law law_;
  algebra::GroupWidths widths_;
  ops::RowAccess access_;
  std::vector<int64_t> k_off_, n_off_;
  std::vector<Rect> shared_;
  std::vector<std::vector<Rect>> per_type_;
  bool shared_cover_all_ = false;  // the shared rectangles tile the whole K×N grid
  mutable Scratch scratch_;
};

}  // namespace quiver::cuda
