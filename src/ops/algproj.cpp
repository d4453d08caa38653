#include "ops/algproj.h"

#include <algorithm>
#include <cstring>

#include "core/blas.h"
#include "quiver/error.h"

namespace quiver::ops {

using algebra::GroupWidths;
using algebra::Law;

namespace {

void check_args(const Tensor& x, const Tensor& w, int64_t K, int64_t N, size_t types) {
  check_ndim(x, 2, "x");
  check_ndim(w, 2, "w");
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(w, "w");
  QV_CHECK(x.dim(1) == K, "x: expected {} columns (the input group widths sum to {}), got shape {}",
           K, K, shape_str(x.shape()));
  check_shape(w, {K, N}, "w");
  QV_CHECK(x.dtype() == w.dtype(), "x is {} but w is {}", dtype_name(x.dtype()),
           dtype_name(w.dtype()));
  QV_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::F64,
           "algproj on the CPU computes in F32 or F64, got {}", dtype_name(x.dtype()));
  QV_CHECK(static_cast<int64_t>(types) == x.dim(0), "row_types: {} entries for {} rows", types,
           x.dim(0));
}

void check_out(const Tensor& t, const Shape& shape, DType dtype, const char* name) {
  check_shape(t, shape, name);
  check_cpu_contiguous(t, name);
  check_dtype(t, dtype, name);
}

template <typename T>
void zero_columns(T* base, int64_t rows, int64_t ld, int64_t c0, int64_t c1) {
  for (int64_t m = 0; m < rows; ++m) std::fill(base + m * ld + c0, base + m * ld + c1, T(0));
}

// Runs the shared rectangles over all M rows for the forward (out groups = δ) or dX
// (out groups = β). The first product to reach a group assigns it; groups no shared
// rectangle reaches are zeroed, so the per-type pass can accumulate.
template <typename T, typename Product>
void run_shared(const std::vector<AlgProj::Rect>& rects, bool out_is_delta, int q, int64_t M,
                T* out, int64_t ld_out, const std::vector<int64_t>& out_off, Product&& product) {
  std::vector<char> written(q, 0);
  for (const auto& r : rects) {
    int g0 = out_is_delta ? r.d0 : r.b0, g1 = out_is_delta ? r.d1 : r.b1;
    int fresh = 0;
    for (int g = g0; g < g1; ++g) fresh += !written[g];
    bool assign = fresh == g1 - g0;
    if (!assign && fresh > 0)
      for (int g = g0; g < g1; ++g)
        if (!written[g]) zero_columns(out, M, ld_out, out_off[g], out_off[g + 1]);
    product(r, assign ? T(0) : T(1));
    for (int g = g0; g < g1; ++g) written[g] = 1;
  }
  for (int g = 0; g < q; ++g)
    if (!written[g]) zero_columns(out, M, ld_out, out_off[g], out_off[g + 1]);
}

template <typename T>
void gather_rows(const T* src, int64_t cols, const std::vector<int64_t>& rows, T* dst) {
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + i * cols, src + rows[i] * cols, cols * sizeof(T));
}

template <typename T>
void forward_impl(const AlgProj& p, const std::vector<AlgProj::Rect>& shared,
                  const std::vector<std::vector<AlgProj::Rect>>& per_type,
                  const std::vector<int64_t>& ko, const std::vector<int64_t>& no, const Tensor& x,
                  const Tensor& w, const std::vector<int>& row_types, Tensor& y) {
  const int q = p.law().q();
  const int64_t M = x.dim(0), K = p.K(), N = p.N();
  const T* X = x.data<T>();
  const T* W = w.data<T>();
  T* Y = y.data<T>();
  // One BLAS product per rectangle, on OpenBLAS's threads. (Splitting rows or types over
  // quiver's pool instead was measured slower: OpenBLAS's idle threads spin and the two
  // pools then contend for the cores.)
  run_shared<T>(shared, true, q, M, Y, N, no, [&](const AlgProj::Rect& r, T beta) {
    blas::gemm(false, false, M, no[r.d1] - no[r.d0], ko[r.b1] - ko[r.b0], T(1), X + ko[r.b0], K,
               W + ko[r.b0] * N + no[r.d0], N, beta, Y + no[r.d0], N);
  });
  std::vector<TypeRows> sets = rows_by_type(row_types, q, p.access());
  std::vector<T> xs, ys;
  for (int a = 0; a < q; ++a) {
    const TypeRows& s = sets[a];
    const int64_t m = static_cast<int64_t>(s.rows.size());
    if (m == 0 || per_type[a].empty()) continue;
    const T* Xa;
    T* Ya;
    int64_t ldx, ldy;
    if (s.progression) {
      Xa = X + s.rows[0] * K;
      Ya = Y + s.rows[0] * N;
      ldx = s.stride * K;
      ldy = s.stride * N;
    } else {
      xs.resize(static_cast<size_t>(m * K));
      ys.assign(static_cast<size_t>(m * N), T(0));
      gather_rows(X, K, s.rows, xs.data());
      Xa = xs.data();
      Ya = ys.data();
      ldx = K;
      ldy = N;
    }
    for (const auto& r : per_type[a])
      blas::gemm(false, false, m, no[r.d1] - no[r.d0], ko[r.b1] - ko[r.b0], T(1), Xa + ko[r.b0],
                 ldx, W + ko[r.b0] * N + no[r.d0], N, T(1), Ya + no[r.d0], ldy);
    if (!s.progression)
      for (int64_t i = 0; i < m; ++i) {
        T* dst = Y + s.rows[i] * N;
        const T* src = ys.data() + i * N;
        for (int64_t n = 0; n < N; ++n) dst[n] += src[n];
      }
  }
}

template <typename T>
void backward_impl(const AlgProj& p, const std::vector<AlgProj::Rect>& shared,
                   const std::vector<std::vector<AlgProj::Rect>>& per_type,
                   const std::vector<int64_t>& ko, const std::vector<int64_t>& no, const Tensor& x,
                   const Tensor& w, const Tensor& dy, const std::vector<int>& row_types, Tensor* dx,
                   Tensor* dw) {
  const int q = p.law().q();
  const int64_t M = x.dim(0), K = p.K(), N = p.N();
  const T* X = x.data<T>();
  const T* W = w.data<T>();
  const T* DY = dy.data<T>();
  T* DX = dx ? dx->data<T>() : nullptr;
  T* DW = dw ? dw->data<T>() : nullptr;
  // dX[:, β] = Σ dY[:, δ] W_βδᵀ ; dW_βδ = Σ X[:, β]ᵀ dY[:, δ].
  if (DX)
    run_shared<T>(shared, false, q, M, DX, K, ko, [&](const AlgProj::Rect& r, T beta) {
      blas::gemm(false, true, M, ko[r.b1] - ko[r.b0], no[r.d1] - no[r.d0], T(1), DY + no[r.d0], N,
                 W + ko[r.b0] * N + no[r.d0], N, beta, DX + ko[r.b0], K);
    });
  if (DW) {
    std::fill(DW, DW + K * N, T(0));
    for (const auto& r : shared)
      blas::gemm(true, false, ko[r.b1] - ko[r.b0], no[r.d1] - no[r.d0], M, T(1), X + ko[r.b0], K,
                 DY + no[r.d0], N, T(1), DW + ko[r.b0] * N + no[r.d0], N);
  }
  std::vector<TypeRows> sets = rows_by_type(row_types, q, p.access());
  // dX of each type's own terms.
  if (DX) {
    std::vector<T> dys, dxs;
    for (int a = 0; a < q; ++a) {
      const TypeRows& s = sets[a];
      const int64_t m = static_cast<int64_t>(s.rows.size());
      if (m == 0 || per_type[a].empty()) continue;
      const T* DYa = DY + s.rows[0] * N;
      T* DXa = DX + s.rows[0] * K;
      int64_t ldy = s.stride * N, ldx = s.stride * K;
      if (!s.progression) {
        dys.resize(static_cast<size_t>(m * N));
        gather_rows(DY, N, s.rows, dys.data());
        dxs.assign(static_cast<size_t>(m * K), T(0));
        DYa = dys.data();
        DXa = dxs.data();
        ldy = N;
        ldx = K;
      }
      for (const auto& r : per_type[a])
        blas::gemm(false, true, m, ko[r.b1] - ko[r.b0], no[r.d1] - no[r.d0], T(1), DYa + no[r.d0],
                   ldy, W + ko[r.b0] * N + no[r.d0], N, T(1), DXa + ko[r.b0], ldx);
      if (!s.progression)
        for (int64_t i = 0; i < m; ++i) {
          T* dst = DX + s.rows[i] * K;
          const T* src = dxs.data() + i * K;
          for (int64_t k = 0; k < K; ++k) dst[k] += src[k];
        }
    }
  }
  // dW of each type's own terms (their blocks may overlap under a general law).
  if (DW) {
    std::vector<T> xs, dys;
    for (int a = 0; a < q; ++a) {
      const TypeRows& s = sets[a];
      const int64_t m = static_cast<int64_t>(s.rows.size());
      if (m == 0 || per_type[a].empty()) continue;
      const T* Xa = X + s.rows[0] * K;
      const T* DYa = DY + s.rows[0] * N;
      int64_t ldx = s.stride * K, ldy = s.stride * N;
      if (!s.progression) {
        xs.resize(static_cast<size_t>(m * K));
        dys.resize(static_cast<size_t>(m * N));
        gather_rows(X, K, s.rows, xs.data());
        gather_rows(DY, N, s.rows, dys.data());
        Xa = xs.data();
        DYa = dys.data();
        ldx = K;
        ldy = N;
      }
      for (const auto& r : per_type[a])
        blas::gemm(true, false, ko[r.b1] - ko[r.b0], no[r.d1] - no[r.d0], m, T(1), Xa + ko[r.b0],
                   ldx, DYa + no[r.d0], ldy, T(1), DW + ko[r.b0] * N + no[r.d0], N);
    }
  }
}

}  // namespace

namespace {

using Mask = std::vector<char>;  // q*q, index β*q + δ

std::vector<SupportRect> rectangles(const Mask& mask, int q) {
  std::vector<SupportRect> out;
  std::vector<std::pair<int, int>> prev_runs;
  int prev_begin = -1;
  auto flush = [&](int end) {
    if (prev_begin >= 0)
      for (auto [d0, d1] : prev_runs) out.push_back({prev_begin, end, d0, d1});
  };
  for (int b = 0; b < q; ++b) {
    std::vector<std::pair<int, int>> runs;
    for (int d = 0; d < q;) {
      if (!mask[b * q + d]) {
        ++d;
        continue;
      }
      int start = d;
      while (d < q && mask[b * q + d]) ++d;
      runs.emplace_back(start, d);
    }
    if (prev_begin >= 0 && runs == prev_runs) continue;
    flush(b);
    prev_runs = std::move(runs);
    prev_begin = prev_runs.empty() ? -1 : b;
  }
  flush(q);
  return out;
}

}  // namespace

SupportPlan plan_support(const Law& law) {
  const int q = law.q();
  Mask shared(static_cast<size_t>(q) * q, 1);
  std::vector<Mask> own(q, Mask(static_cast<size_t>(q) * q, 0));
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d)
      for (int b : law.support(a, d)) own[a][b * q + d] = 1;
  for (int a = 0; a < q; ++a)
    for (size_t i = 0; i < shared.size(); ++i) shared[i] &= own[a][i];
  SupportPlan plan;
  plan.shared_covers_all = std::all_of(shared.begin(), shared.end(), [](char c) { return c != 0; });
  plan.shared = rectangles(shared, q);
  plan.per_type.resize(q);
  for (int a = 0; a < q; ++a) {
    for (size_t i = 0; i < shared.size(); ++i) own[a][i] &= !shared[i];
    plan.per_type[a] = rectangles(own[a], q);
  }
  return plan;
}

std::vector<TypeRows> rows_by_type(const std::vector<int>& row_types, int q, RowAccess access) {
  std::vector<TypeRows> sets(q);
  for (size_t m = 0; m < row_types.size(); ++m) {
    int t = row_types[m];
    QV_CHECK(t >= 0 && t < q, "row {} has type {}, outside [0, {})", m, t, q);
    sets[t].rows.push_back(static_cast<int64_t>(m));
  }
  for (TypeRows& s : sets) {
    if (s.rows.size() >= 2) s.stride = s.rows[1] - s.rows[0];
    for (size_t i = 2; i < s.rows.size() && s.progression; ++i)
      s.progression = s.rows[i] - s.rows[i - 1] == s.stride;
    if (access == RowAccess::Gather && s.stride != 1) s.progression = false;
  }
  return sets;
}

AlgProj::AlgProj(Law law, GroupWidths widths, RowAccess access)
    : law_(std::move(law)), widths_(std::move(widths)), access_(access) {
  widths_.validate(law_.q());
  k_off_ = widths_.in_offsets();
  n_off_ = widths_.out_offsets();
  SupportPlan plan = plan_support(law_);
  shared_ = std::move(plan.shared);
  per_type_ = std::move(plan.per_type);
}

int64_t AlgProj::weight_elements_read(int alpha) const {
  QV_CHECK(alpha >= 0 && alpha < law_.q(), "row type {} outside [0, {})", alpha, law_.q());
  int64_t n = 0;
  for (const auto* rects : {&shared_, &per_type_[alpha]})
    for (const Rect& r : *rects) n += (k_off_[r.b1] - k_off_[r.b0]) * (n_off_[r.d1] - n_off_[r.d0]);
  return n;
}

void AlgProj::forward(const Tensor& x, const Tensor& w, const std::vector<int>& row_types,
                      Tensor& y) const {
  check_args(x, w, K(), N(), row_types.size());
  check_out(y, {x.dim(0), N()}, x.dtype(), "y");
  if (x.dtype() == DType::F32)
    forward_impl<float>(*this, shared_, per_type_, k_off_, n_off_, x, w, row_types, y);
  else
    forward_impl<double>(*this, shared_, per_type_, k_off_, n_off_, x, w, row_types, y);
}

void AlgProj::backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                       const std::vector<int>& row_types, Tensor* dx, Tensor* dw) const {
  check_args(x, w, K(), N(), row_types.size());
  check_out(dy, {x.dim(0), N()}, x.dtype(), "dy");
  if (dx) check_out(*dx, {x.dim(0), K()}, x.dtype(), "dx");
  if (dw) check_out(*dw, {K(), N()}, x.dtype(), "dw");
  if (x.dtype() == DType::F32)
    backward_impl<float>(*this, shared_, per_type_, k_off_, n_off_, x, w, dy, row_types, dx, dw);
  else
    backward_impl<double>(*this, shared_, per_type_, k_off_, n_off_, x, w, dy, row_types, dx, dw);
}

// ---- reference ----------------------------------------------------------------------

namespace {
// Mask_α as a per-element lookup: group of each input and output feature, and each group's
// first feature (k0, n0: q + 1 offsets).
struct Groups {
  std::vector<int> of_k, of_n;
  std::vector<int64_t> k0{0}, n0{0};
  Groups(const GroupWidths& w) {
    for (int g = 0; g < static_cast<int>(w.in.size()); ++g) {
      of_k.insert(of_k.end(), w.in[g], g);
      k0.push_back(k0.back() + w.in[g]);
    }
    for (int g = 0; g < static_cast<int>(w.out.size()); ++g) {
      of_n.insert(of_n.end(), w.out[g], g);
      n0.push_back(n0.back() + w.out[g]);
    }
  }
  int q() const { return static_cast<int>(k0.size()) - 1; }
};
}  // namespace

void algproj_reference_forward(const Tensor& x, const Tensor& w, const Law& law,
                               const GroupWidths& widths, const std::vector<int>& row_types,
                               Tensor& y) {
  widths.validate(law.q());
  check_args(x, w, widths.K(), widths.N(), row_types.size());
  Groups g(widths);
  const int64_t M = x.dim(0), K = widths.K(), N = widths.N();
  Tensor xd = x.to(DType::F64), wd = w.to(DType::F64), yd = Tensor::zeros({M, N}, DType::F64);
  const double *X = xd.data<double>(), *W = wd.data<double>();
  double* Y = yd.data<double>();
  // The masked sum over k in ascending order, skipping the blocks the mask zeroes whole.
  for (int64_t m = 0; m < M; ++m) {
    int a = row_types[m];
    QV_CHECK(a >= 0 && a < law.q(), "row {} has type {}, outside [0, {})", m, a, law.q());
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int gk = 0; gk < g.q(); ++gk)
        if (law.contributes(a, gk, g.of_n[n]))
          for (int64_t k = g.k0[gk]; k < g.k0[gk + 1]; ++k) s += X[m * K + k] * W[k * N + n];
      Y[m * N + n] = s;
    }
  }
  check_shape(y, {M, N}, "y");
  y.copy_from(yd);
}

void algproj_reference_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Law& law,
                                const GroupWidths& widths, const std::vector<int>& row_types,
                                Tensor& dx, Tensor& dw) {
  widths.validate(law.q());
  check_args(x, w, widths.K(), widths.N(), row_types.size());
  Groups g(widths);
  const int64_t M = x.dim(0), K = widths.K(), N = widths.N();
  check_shape(dy, {M, N}, "dy");
  Tensor xd = x.to(DType::F64), wd = w.to(DType::F64), dyd = dy.to(DType::F64);
  Tensor dxd = Tensor::zeros({M, K}, DType::F64), dwd = Tensor::zeros({K, N}, DType::F64);
  const double *X = xd.data<double>(), *W = wd.data<double>(), *DY = dyd.data<double>();
  double *DX = dxd.data<double>(), *DW = dwd.data<double>();
  // The same sums in the same order as over every (k, n), skipping the blocks the mask zeroes.
  for (int64_t m = 0; m < M; ++m) {
    int a = row_types[m];
    QV_CHECK(a >= 0 && a < law.q(), "row {} has type {}, outside [0, {})", m, a, law.q());
    for (int64_t k = 0; k < K; ++k)
      for (int gn = 0; gn < g.q(); ++gn)
        if (law.contributes(a, g.of_k[k], gn))
          for (int64_t n = g.n0[gn]; n < g.n0[gn + 1]; ++n) {
            DX[m * K + k] += DY[m * N + n] * W[k * N + n];
            DW[k * N + n] += X[m * K + k] * DY[m * N + n];
          }
  }
  check_shape(dx, {M, K}, "dx");
  check_shape(dw, {K, N}, "dw");
  dx.copy_from(dxd);
  dw.copy_from(dwd);
}

}  // namespace quiver::ops
