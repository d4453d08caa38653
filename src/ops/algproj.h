// The algebraic projection on the CPU (SPEC §1.3): Y = Φ_W(X) for a law with group
// widths, where row m of X has type row_types[m] (any arrangement of types in the
// batch: the schedule decides them from absolute positions).
//
// The fast path never forms a masked dense W. At construction the law's support is cut
// into rectangles of contiguous (input-group, output-group) ranges: terms shared by every
// row type run once over all rows; the rest run per row type on that type's rows. Each
// rectangle is one BLAS product. A type's rows are used in place when they form an
// arithmetic progression (cyclic and interval schedules within one period), else they
// are gathered. Decoding one row or a few rows of mixed types is the same call; it reads
// only the weight blocks those types need.
//
// Contract: forward assigns y; backward assigns dx and dw (either may be null).
// Shapes: x [M, K], w [K, N], y and dy [M, N]; F32 or F64, contiguous, one dtype.
#pragma once
#include <vector>

#include "algebra/law.h"
#include "quiver/tensor.h"

namespace quiver::ops {

// How a row type's rows reach BLAS: in place when they form an arithmetic progression
// (strided operands), or always gathered into contiguous scratch. Large power-of-two row
// strides can make strided GEMM operands collide in the caches; the benchmark times both.
enum class RowAccess { InPlace, Gather };

// A rectangle of the support: input groups [b0, b1) × output groups [d0, d1).
struct SupportRect {
  int b0, b1, d0, d1;
};

// The law's support cut into rectangles, the plan that every backend runs: the terms every
// row type has (`shared`, run once over all rows) and the rest of each type (`per_type`).
// Runs of output groups per input group, then consecutive input groups with the same runs
// merged: dense collapses to one rectangle, Q_q's off-diagonal row to two.
struct SupportPlan {
  std::vector<SupportRect> shared;
  std::vector<std::vector<SupportRect>> per_type;
  bool shared_covers_all = false;  // the shared terms alone reach every (β, δ) block
};
SupportPlan plan_support(const algebra::Law& law);

// The rows of each type, and whether they form an arithmetic progression (so a strided
// operand can use them in place). With RowAccess::Gather only stride-1 runs stay in place.
struct TypeRows {
  std::vector<int64_t> rows;
  int64_t stride = 1;
  bool progression = true;
};
std::vector<TypeRows> rows_by_type(const std::vector<int>& row_types, int q, RowAccess access);

class AlgProj {
 public:
  AlgProj(algebra::Law law, algebra::GroupWidths widths, RowAccess access = RowAccess::InPlace);

  const algebra::Law& law() const { return law_; }
  const algebra::GroupWidths& widths() const { return widths_; }
  RowAccess access() const { return access_; }
  int64_t K() const { return widths_.K(); }
  int64_t N() const { return widths_.N(); }

  void forward(const Tensor& x, const Tensor& w, const std::vector<int>& row_types,
               Tensor& y) const;
  void backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                const std::vector<int>& row_types, Tensor* dx, Tensor* dw) const;

  // Weight elements a row of type α reads (the union of its blocks), for decode accounting.
  int64_t weight_elements_read(int alpha) const;
  // BLAS products per call: shared rectangles and those of each type.
  size_t shared_products() const { return shared_.size(); }
  size_t type_products(int alpha) const { return per_type_[alpha].size(); }

  using Rect = SupportRect;

 private:
  algebra::Law law_;
  algebra::GroupWidths widths_;
  RowAccess access_;
  std::vector<int64_t> k_off_, n_off_;
  std::vector<Rect> shared_;                 // terms present for every row type
  std::vector<std::vector<Rect>> per_type_;  // the remaining terms of each type
};

// The independent formula of SPEC §1.3: row m = x_m · (W ⊙ Mask_{τ(m)}), with
// Mask_α[block β, δ] = [β ∈ B(α, δ)]. Plain loops with double accumulation; for tests.
void algproj_reference_forward(const Tensor& x, const Tensor& w, const algebra::Law& law,
                               const algebra::GroupWidths& widths,
                               const std::vector<int>& row_types, Tensor& y);
void algproj_reference_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                const algebra::Law& law, const algebra::GroupWidths& widths,
                                const std::vector<int>& row_types, Tensor& dx, Tensor& dw);

}  // namespace quiver::ops
