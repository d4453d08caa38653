#include "ops/relation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/blas.h"
#include "ops/head_shape.h"
#include "ops/online_softmax.h"
#include "ops/row_cache.h"
#include "quiver/parallel.h"

namespace quiver::ops {
namespace {

// ----------------------------------------------------------------------------------------------
// Checks and shared plumbing.

Shape stats_shape(const HeadShape& d) {
  return d.ndim == 4 ? Shape{d.B, d.H, d.T, kRelationStatCount} : Shape{d.H, d.T, kRelationStatCount};
}
Shape flow_shape(const HeadShape& d) {
  return d.ndim == 4 ? Shape{d.B, d.H, d.T, d.T} : Shape{d.H, d.T, d.T};
}

// A tensor that must match p1 in dtype and shape.
void check_like(const Tensor& t, const Tensor& p1, const char* name) {
  check_float_input(t, name);
  check_dtype(t, p1.dtype(), name);
  check_shape(t, p1.shape(), name);
}

HeadShape check_inputs(const Tensor& p1, const Tensor& p2, const Tensor& v,
                     const RelationOptions& o) {
  check_float_input(p1, "p1");
  HeadShape d = head_shape(p1.shape(), "p1");
  check_like(p2, p1, "p2");
  check_like(v, p1, "v");
  QV_CHECK(o.tau_s > 0 && std::isfinite(o.tau_s), "relation: tau_s must be positive and finite, got {}",
           o.tau_s);
  QV_CHECK(o.tile >= 1, "relation: tile must be positive, got {}", o.tile);
  return d;
}

void check_lambda(double lambda) {
  QV_CHECK(std::isfinite(lambda), "relation: lambda must be finite, got {}", lambda);
}

// Allocates an undefined output, or checks a caller's preallocated one.
void prepare_output(Tensor& out, const Shape& shape, DType dtype, const char* name) {
  if (!out.defined()) {
    out = Tensor::empty(shape, dtype);
    return;
  }
  check_cpu_contiguous(out, name);
  check_dtype(out, dtype, name);
  check_shape(out, shape, name);
}

// The products run inside quiver's own parallel loops, so OpenBLAS must not spawn threads of
// its own underneath them.
template <typename T>
T sigmoid(T x) {
  if (x >= 0) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

template <typename T>
T log_sigmoid(T x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

// A head's rows inside a [B, T, H, Dh] tensor: row t starts at base + t * stride.
template <typename T>
struct HeadView {
  T* base;
  int64_t stride;
  T* row(int64_t t) const { return base + t * stride; }
};

template <typename T>
HeadView<T> head_view(T* data, const HeadShape& d, int64_t b, int64_t h) {
  return {data + (b * d.T * d.H + h) * d.Dh, d.H * d.Dh};
}

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// ----------------------------------------------------------------------------------------------
// Reference: U, R and F of one head materialized as T×T row-major arrays.

template <typename T>
struct ReferenceHead {
  std::vector<T> U, F;  // U_pj and the flow F_pj (zero above the diagonal)
};

// Fills U (via one T×T×Dh product) and F (the row softmax of R) for head (b, h).
// R is formed explicitly in `R` (T×T scratch) for clarity.
template <typename T>
void reference_flow(const HeadShape& d, HeadView<const T> p1, HeadView<const T> p2, T lambda,
                    T tau, std::vector<T>& U, std::vector<T>& R, std::vector<T>& F) {
  const int64_t Tn = d.T;
  const T scale = T(1) / std::sqrt(T(d.Dh));
  blas::gemm(false, true, Tn, Tn, d.Dh, scale, p1.base, p1.stride, p2.base, p2.stride, T(0),
             U.data(), Tn);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t p = 0; p < Tn; ++p) {
    for (int64_t j = 0; j < Tn; ++j) {
      const T u = U[p * Tn + j];
      T r;
      if (j == p)
        r = sigmoid(u / tau);  // Self: S_p
      else if (j < p)
        r = u * sigmoid(u) - lambda * std::log(T(p + 1));  // Exchange: SiLU(U) − λ log(p+1)
      else
        r = neg_inf;
      R[p * Tn + j] = r;
    }
    T mx = neg_inf;
    for (int64_t j = 0; j <= p; ++j) mx = std::max(mx, R[p * Tn + j]);
    T sum = 0;
    for (int64_t j = 0; j <= p; ++j) sum += F[p * Tn + j] = std::exp(R[p * Tn + j] - mx);
    for (int64_t j = 0; j <= p; ++j) F[p * Tn + j] /= sum;
    for (int64_t j = p + 1; j < Tn; ++j) F[p * Tn + j] = 0;
  }
}

template <typename T>
void reference_forward(const HeadShape& d, const T* p1, const T* p2, const T* v, T lambda,
                       const RelationOptions& o, T* y) {
  const int64_t Tn = d.T;
  parallel_for(d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> U(Tn * Tn), R(Tn * Tn), F(Tn * Tn);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / d.H, h = item % d.H;
      reference_flow<T>(d, head_view(p1, d, b, h), head_view(p2, d, b, h), lambda, T(o.tau_s), U,
                        R, F);
      // Transport: exchange-only drops the Self entry of F without renormalizing.
      if (o.exchange_only)
        for (int64_t p = 0; p < Tn; ++p) F[p * Tn + p] = 0;
      HeadView<const T> vh = head_view(v, d, b, h);
      HeadView<T> yh = head_view(y, d, b, h);
      blas::gemm(false, false, Tn, d.Dh, Tn, T(1), F.data(), Tn, vh.base, vh.stride, T(0), yh.base,
                 yh.stride);
    }
  });
}

template <typename T>
double reference_backward(const HeadShape& d, const T* p1, const T* p2, const T* v, T lambda,
                          const T* dy, const RelationOptions& o, T* dp1, T* dp2, T* dv) {
  const int64_t Tn = d.T, Dh = d.Dh;
  const T scale = T(1) / std::sqrt(T(Dh)), tau = T(o.tau_s);
  std::vector<double> dlambda_part(d.B * d.H, 0.0);
  parallel_for(d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> U(Tn * Tn), F(Tn * Tn), G(Tn * Tn);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / d.H, h = item % d.H;
      HeadView<const T> p1h = head_view(p1, d, b, h), p2h = head_view(p2, d, b, h),
                        vh = head_view(v, d, b, h), dyh = head_view(dy, d, b, h);
      reference_flow<T>(d, p1h, p2h, lambda, tau, U, G, F);
      // dF_pj = dY_p · w_j with w_j = Ĩ_j, except w_p = 0 under exchange-only transport.
      blas::gemm(false, true, Tn, Tn, Dh, T(1), dyh.base, dyh.stride, vh.base, vh.stride, T(0),
                 G.data(), Tn);
      if (o.exchange_only)
        for (int64_t p = 0; p < Tn; ++p) G[p * Tn + p] = 0;
      double dlambda = 0;
      for (int64_t p = 0; p < Tn; ++p) {
        T* g = G.data() + p * Tn;
        const T* f = F.data() + p * Tn;
        T D = 0;  // D_p = Σ_j F_pj dF_pj = dY_p · Y_p
        for (int64_t j = 0; j <= p; ++j) D += f[j] * g[j];
        for (int64_t j = 0; j < Tn; ++j) {
          if (j > p) {
            g[j] = 0;
            continue;
          }
          const T dR = f[j] * (g[j] - D);
          const T u = U[p * Tn + j];
          if (j == p) {
            const T s = sigmoid(u / tau);
            g[j] = dR * s * (1 - s) / tau;  // dU_pp through S_p = σ(U_pp/τ)
          } else {
            dlambda -= double(dR) * std::log(double(p + 1));  // ∂R_pj/∂λ = −log(p+1), j < p
            const T sg = sigmoid(u);
            g[j] = dR * sg * (1 + u * (1 - sg));  // dU_pj through E_pj = SiLU(U_pj)
          }
        }
      }
      dlambda_part[item] = dlambda;
      HeadView<T> dp1h = head_view(dp1, d, b, h), dp2h = head_view(dp2, d, b, h),
                  dvh = head_view(dv, d, b, h);
      blas::gemm(false, false, Tn, Dh, Tn, scale, G.data(), Tn, p2h.base, p2h.stride, T(0),
                 dp1h.base, dp1h.stride);
      blas::gemm(true, false, Tn, Dh, Tn, scale, G.data(), Tn, p1h.base, p1h.stride, T(0),
                 dp2h.base, dp2h.stride);
      if (o.exchange_only)
        for (int64_t p = 0; p < Tn; ++p) F[p * Tn + p] = 0;
      blas::gemm(true, false, Tn, Dh, Tn, T(1), F.data(), Tn, dyh.base, dyh.stride, T(0), dvh.base,
                 dvh.stride);
    }
  });
  double total = 0;
  for (double x : dlambda_part) total += x;
  return total;
}

// ----------------------------------------------------------------------------------------------
// FlashRelation.

// Query tile k of n in the order 0, n−1, 1, n−2, ...: a causal tile's cost grows with its
// index, so this pairs light and heavy tiles inside every contiguous chunk of work.
int64_t zigzag(int64_t k, int64_t n) { return k % 2 == 0 ? k / 2 : n - 1 - k / 2; }

template <typename T>
void flash_forward(const HeadShape& d, const T* p1, const T* p2, const T* v, T lambda,
                   const RelationOptions& o, T* y, T* stats) {
  const int64_t Tn = d.T, Dh = d.Dh, tile = o.tile, ntiles = (Tn + tile - 1) / tile;
  const T scale = T(1) / std::sqrt(T(Dh)), tau = T(o.tau_s);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  parallel_for(d.B * d.H * ntiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> s(tile * tile), z(tile * Dh), m(tile), l(tile);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (d.H * ntiles), h = item / ntiles % d.H;
      const int64_t p0 = zigzag(item % ntiles, ntiles) * tile;
      const int64_t bq = std::min(tile, Tn - p0);
      HeadView<const T> p1h = head_view(p1, d, b, h), p2h = head_view(p2, d, b, h),
                        vh = head_view(v, d, b, h);
      HeadView<T> yh = head_view(y, d, b, h);
      std::fill(m.begin(), m.end(), neg_inf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(z.begin(), z.end(), T(0));
      // Strictly-historical scan: the tile's last row p0 + bq − 1 sees keys j < p0 + bq − 1.
      const int64_t jend = p0 + bq - 1;
      for (int64_t j0 = 0; j0 < jend; j0 += tile) {
        const int64_t bk = std::min(tile, jend - j0);
        blas::gemm(false, true, bq, bk, Dh, scale, p1h.row(p0), p1h.stride, p2h.row(j0),
                   p2h.stride, T(0), s.data(), tile);
        for (int64_t r = 0; r < bq; ++r) {
          T* sr = s.data() + r * tile;
          const int64_t valid = std::min(bk, p0 + r - j0);  // keys j < p
          if (valid <= 0) {
            std::fill(sr, sr + bk, T(0));
            continue;
          }
          for (int64_t c = 0; c < valid; ++c) sr[c] = sr[c] * sigmoid(sr[c]);  // E = SiLU(U)
          online_softmax_row(sr, valid, bk, m[r], l[r], z.data() + r * Dh, Dh);
        }
        blas::gemm(false, false, bq, Dh, bk, T(1), s.data(), tile, vh.row(j0), vh.stride, T(1),
                   z.data(), Dh);
      }
      for (int64_t r = 0; r < bq; ++r) {
        const int64_t p = p0 + r;
        const T self = sigmoid(dot(p1h.row(p), p2h.row(p), Dh) * scale / tau);
        const T* vp = vh.row(p);
        T* yp = yh.row(p);
        T* st = stats + ((b * d.H + h) * Tn + p) * kRelationStatCount;
        st[kRelationSelf] = self;
        if (p == 0) {  // no history: g_0 = 0, Y_0 = Ĩ_0 (exchange-only: 0)
          st[kRelationLogExchange] = neg_inf;
          st[kRelationGate] = 0;
          for (int64_t c = 0; c < Dh; ++c) yp[c] = o.exchange_only ? T(0) : vp[c];
          continue;
        }
        const T log_exchange = m[r] + std::log(l[r]);
        const T a = log_exchange - lambda * std::log(T(p + 1));
        const T g = sigmoid(a - self);
        st[kRelationLogExchange] = log_exchange;
        st[kRelationGate] = g;
        const T w_hist = g / l[r], w_self = o.exchange_only ? T(0) : 1 - g;
        const T* zr = z.data() + r * Dh;
        for (int64_t c = 0; c < Dh; ++c) yp[c] = w_self * vp[c] + w_hist * zr[c];
      }
    }
  });
}

template <typename T>
double flash_backward(const HeadShape& d, const T* p1, const T* p2, const T* v, T lambda,
                      const T* y, const T* stats, const T* dy, const RelationOptions& o, T* dp1,
                      T* dp2, T* dv) {
  const int64_t Tn = d.T, Dh = d.Dh, tile = o.tile;
  const T scale = T(1) / std::sqrt(T(Dh)), tau = T(o.tau_s);
  std::vector<double> dlambda_part(d.B * d.H, 0.0);
  // One work item per (batch, head): it owns that head's rows of dp1, dp2 and dv.
  parallel_for(d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> u(tile * tile), f(tile * tile), du(tile * tile), delta(Tn), norm(Tn);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / d.H, h = item % d.H;
      HeadView<const T> p1h = head_view(p1, d, b, h), p2h = head_view(p2, d, b, h),
                        vh = head_view(v, d, b, h), yh = head_view(y, d, b, h),
                        dyh = head_view(dy, d, b, h);
      HeadView<T> dp1h = head_view(dp1, d, b, h), dp2h = head_view(dp2, d, b, h),
                  dvh = head_view(dv, d, b, h);
      const T* st = stats + (b * d.H + h) * Tn * kRelationStatCount;
      // Row terms, and the Self (diagonal) contributions that initialize dp1, dp2 and dv.
      double dlambda = 0;
      for (int64_t p = 0; p < Tn; ++p) {
        const T* sp = st + p * kRelationStatCount;
        const T self = sp[kRelationSelf], g = sp[kRelationGate];
        const T D = dot(dyh.row(p), yh.row(p), Dh);
        delta[p] = D;
        if (p > 0) {
          // F_pj = exp(E_pj − norm_p) for j < p, norm_p = L_p − log g_p.
          const T a = sp[kRelationLogExchange] - lambda * std::log(T(p + 1));
          norm[p] = sp[kRelationLogExchange] - log_sigmoid(a - self);
        }
        const T f_self = 1 - g;
        const T df_self = o.exchange_only ? T(0) : dot(dyh.row(p), vh.row(p), Dh);
        const T dr_self = f_self * (df_self - D);
        dlambda += std::log(double(p + 1)) * double(dr_self);  // rows of dR sum to zero
        const T du_self = dr_self * self * (1 - self) / tau * scale;
        const T* p1p = p1h.row(p);
        const T* p2p = p2h.row(p);
        const T* dyp = dyh.row(p);
        T* dp1p = dp1h.row(p);
        T* dp2p = dp2h.row(p);
        T* dvp = dvh.row(p);
        const T w_self = o.exchange_only ? T(0) : f_self;
        for (int64_t c = 0; c < Dh; ++c) {
          dp1p[c] = du_self * p2p[c];
          dp2p[c] = du_self * p1p[c];
          dvp[c] = w_self * dyp[c];
        }
      }
      dlambda_part[item] = dlambda;
      // Exchange pairs j < p, one (key tile, query tile) pair at a time.
      for (int64_t j0 = 0; j0 < Tn; j0 += tile) {
        const int64_t bk = std::min(tile, Tn - j0);
        for (int64_t p0 = j0; p0 < Tn; p0 += tile) {
          const int64_t bq = std::min(tile, Tn - p0);
          if (p0 + bq - 1 <= j0) continue;  // no pair j < p in this tile pair
          blas::gemm(false, true, bq, bk, Dh, scale, p1h.row(p0), p1h.stride, p2h.row(j0),
                     p2h.stride, T(0), u.data(), tile);
          blas::gemm(false, true, bq, bk, Dh, T(1), dyh.row(p0), dyh.stride, vh.row(j0),
                     vh.stride, T(0), du.data(), tile);
          for (int64_t r = 0; r < bq; ++r) {
            const int64_t p = p0 + r;
            const int64_t valid = std::clamp<int64_t>(p - j0, 0, bk);
            const T* ur = u.data() + r * tile;
            T* fr = f.data() + r * tile;
            T* dur = du.data() + r * tile;  // holds dF_pj = dY_p · Ĩ_j on entry
            for (int64_t c = 0; c < valid; ++c) {
              const T uu = ur[c], sg = sigmoid(uu);
              const T fv = std::exp(uu * sg - norm[p]);
              fr[c] = fv;
              dur[c] = fv * (dur[c] - delta[p]) * sg * (1 + uu * (1 - sg));
            }
            for (int64_t c = valid; c < bk; ++c) fr[c] = dur[c] = 0;
          }
          blas::gemm(true, false, bk, Dh, bq, T(1), f.data(), tile, dyh.row(p0), dyh.stride, T(1),
                     dvh.row(j0), dvh.stride);
          blas::gemm(false, false, bq, Dh, bk, scale, du.data(), tile, p2h.row(j0), p2h.stride,
                     T(1), dp1h.row(p0), dp1h.stride);
          blas::gemm(true, false, bk, Dh, bq, scale, du.data(), tile, p1h.row(p0), p1h.stride,
                     T(1), dp2h.row(j0), dp2h.stride);
        }
      }
    }
  });
  double total = 0;
  for (double x : dlambda_part) total += x;
  return total;
}

// ----------------------------------------------------------------------------------------------
// Decode.

template <typename T>
void decode_step(const T* p1, const T* p2, const T* v, T lambda, const RelationOptions& o,
                 const T* p2c, const T* vc, int64_t B, int64_t H, int64_t Dh, int64_t capacity,
                 int64_t length, T* y) {
  const T scale = T(1) / std::sqrt(T(Dh)), tau = T(o.tau_s);
  const int64_t cs = H * Dh, p = length;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, length * Dh));
  parallel_for(B * H, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H, h = item % H;
      const T *p1r = p1 + item * Dh, *p2r = p2 + item * Dh, *vr = v + item * Dh;
      const T* p2b = p2c + (b * capacity * H + h) * Dh;
      const T* vb = vc + (b * capacity * H + h) * Dh;
      T* yr = y + item * Dh;
      const T self = sigmoid(dot(p1r, p2r, Dh) * scale / tau);
      if (p == 0) {
        for (int64_t c = 0; c < Dh; ++c) yr[c] = o.exchange_only ? T(0) : vr[c];
        continue;
      }
      // Online softmax over E_pj = SiLU(U_pj), j < p, accumulated straight into the output row.
      std::fill(yr, yr + Dh, T(0));
      T m = -std::numeric_limits<T>::infinity(), l = 0;
      for (int64_t j = 0; j < p; ++j) {
        const T u = dot(p1r, p2b + j * cs, Dh) * scale;
        const T e = u * sigmoid(u);
        if (e > m) {
          const T alpha = std::exp(m - e);
          for (int64_t c = 0; c < Dh; ++c) yr[c] *= alpha;
          l *= alpha;
          m = e;
        }
        const T w = std::exp(e - m);
        l += w;
        const T* vj = vb + j * cs;
        for (int64_t c = 0; c < Dh; ++c) yr[c] += w * vj[c];
      }
      const T a = m + std::log(l) - lambda * std::log(T(p + 1));
      const T g = sigmoid(a - self);
      const T w_hist = g / l, w_self = o.exchange_only ? T(0) : 1 - g;
      for (int64_t c = 0; c < Dh; ++c) yr[c] = w_self * vr[c] + w_hist * yr[c];
    }
  });
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Entry points.

void relation_reference_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                double lambda, Tensor& y, const RelationOptions& options) {
  HeadShape d = check_inputs(p1, p2, v, options);
  check_lambda(lambda);
  prepare_output(y, p1.shape(), p1.dtype(), "y");
  blas::SingleThreadScope single;
  if (p1.dtype() == DType::F32)
    reference_forward<float>(d, p1.data<float>(), p2.data<float>(), v.data<float>(),
                             float(lambda), options, y.data<float>());
  else
    reference_forward<double>(d, p1.data<double>(), p2.data<double>(), v.data<double>(), lambda,
                              options, y.data<double>());
}

double relation_reference_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                   double lambda, const Tensor& dy, Tensor& dp1, Tensor& dp2,
                                   Tensor& dv, const RelationOptions& options) {
  HeadShape d = check_inputs(p1, p2, v, options);
  check_lambda(lambda);
  check_like(dy, p1, "dy");
  prepare_output(dp1, p1.shape(), p1.dtype(), "dp1");
  prepare_output(dp2, p1.shape(), p1.dtype(), "dp2");
  prepare_output(dv, p1.shape(), p1.dtype(), "dv");
  blas::SingleThreadScope single;
  if (p1.dtype() == DType::F32)
    return reference_backward<float>(d, p1.data<float>(), p2.data<float>(), v.data<float>(),
                                     float(lambda), dy.data<float>(), options, dp1.data<float>(),
                                     dp2.data<float>(), dv.data<float>());
  return reference_backward<double>(d, p1.data<double>(), p2.data<double>(), v.data<double>(),
                                    lambda, dy.data<double>(), options, dp1.data<double>(),
                                    dp2.data<double>(), dv.data<double>());
}

Tensor relation_reference_flow(const Tensor& p1, const Tensor& p2, double lambda,
                               const RelationOptions& options) {
  HeadShape d = check_inputs(p1, p2, p2, options);
  check_lambda(lambda);
  Tensor flow = Tensor::empty(flow_shape(d), p1.dtype());
  blas::SingleThreadScope single;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const int64_t Tn = d.T;
    std::vector<T> U(Tn * Tn), R(Tn * Tn);
    T* out = flow.data<T>();
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        std::vector<T> F(Tn * Tn);
        reference_flow<T>(d, head_view<const T>(p1.data<T>(), d, b, h),
                          head_view<const T>(p2.data<T>(), d, b, h), T(lambda), T(options.tau_s),
                          U, R, F);
        std::copy(F.begin(), F.end(), out + (b * d.H + h) * Tn * Tn);
      }
  };
  if (p1.dtype() == DType::F32)
    run(0.0f);
  else
    run(0.0);
  return flow;
}

void flash_relation_forward(const Tensor& p1, const Tensor& p2, const Tensor& v, double lambda,
                            Tensor& y, Tensor& stats, const RelationOptions& options) {
  HeadShape d = check_inputs(p1, p2, v, options);
  check_lambda(lambda);
  prepare_output(y, p1.shape(), p1.dtype(), "y");
  prepare_output(stats, stats_shape(d), p1.dtype(), "stats");
  blas::SingleThreadScope single;
  if (p1.dtype() == DType::F32)
    flash_forward<float>(d, p1.data<float>(), p2.data<float>(), v.data<float>(), float(lambda),
                         options, y.data<float>(), stats.data<float>());
  else
    flash_forward<double>(d, p1.data<double>(), p2.data<double>(), v.data<double>(), lambda,
                          options, y.data<double>(), stats.data<double>());
}

double flash_relation_backward(const Tensor& p1, const Tensor& p2, const Tensor& v, double lambda,
                               const Tensor& y, const Tensor& stats, const Tensor& dy,
                               Tensor& dp1, Tensor& dp2, Tensor& dv,
                               const RelationOptions& options) {
  HeadShape d = check_inputs(p1, p2, v, options);
  check_lambda(lambda);
  check_like(y, p1, "y");
  check_like(dy, p1, "dy");
  check_float_input(stats, "stats");
  check_dtype(stats, p1.dtype(), "stats");
  check_shape(stats, stats_shape(d), "stats");
  prepare_output(dp1, p1.shape(), p1.dtype(), "dp1");
  prepare_output(dp2, p1.shape(), p1.dtype(), "dp2");
  prepare_output(dv, p1.shape(), p1.dtype(), "dv");
  blas::SingleThreadScope single;
  if (p1.dtype() == DType::F32)
    return flash_backward<float>(d, p1.data<float>(), p2.data<float>(), v.data<float>(),
                                 float(lambda), y.data<float>(), stats.data<float>(),
                                 dy.data<float>(), options, dp1.data<float>(), dp2.data<float>(),
                                 dv.data<float>());
  return flash_backward<double>(d, p1.data<double>(), p2.data<double>(), v.data<double>(), lambda,
                                y.data<double>(), stats.data<double>(), dy.data<double>(), options,
                                dp1.data<double>(), dp2.data<double>(), dv.data<double>());
}

int64_t relation_reference_workspace_bytes(const Shape& p1_shape, DType dtype, bool backward) {
  HeadShape d = head_shape(p1_shape, "p1");
  // Forward: U, R, F; backward: U, F and G (dF, then dU), each T×T per concurrent head.
  const int64_t per_head = 3 * d.T * d.T;
  return std::min<int64_t>(num_threads(), d.B * d.H) * per_head * int64_t(dtype_size(dtype)) +
         (backward ? d.B * d.H * int64_t(sizeof(double)) : 0);
}

int64_t flash_relation_workspace_bytes(const Shape& p1_shape, DType dtype, bool backward,
                                       int64_t tile) {
  HeadShape d = head_shape(p1_shape, "p1");
  const int64_t es = int64_t(dtype_size(dtype));
  if (!backward) {
    const int64_t items = d.B * d.H * ((d.T + tile - 1) / tile);
    const int64_t per_chunk = tile * tile + tile * d.Dh + 2 * tile;
    return std::min<int64_t>(num_threads(), items) * per_chunk * es;
  }
  const int64_t per_chunk = 3 * tile * tile + 2 * d.T;
  return std::min<int64_t>(num_threads(), d.B * d.H) * per_chunk * es +
         d.B * d.H * int64_t(sizeof(double));
}

RelationCache::RelationCache(int64_t batch, int64_t capacity, int64_t heads, int64_t head_dim,
                             DType dtype) {
  detail::allocate_row_pair("RelationCache", batch, capacity, heads, head_dim, dtype, p2, v);
}

void RelationCache::append(const Tensor& p2_rows, const Tensor& v_rows) {
  length = detail::append_row_pair("RelationCache", p2, v, length, p2_rows, v_rows, "p2_rows",
                                   "v_rows");
}

void RelationCache::append_row(const Tensor& p2_row, const Tensor& v_row) {
  length = detail::append_single_row_pair("RelationCache", p2, v, length, p2_row, v_row, "p2_row",
                                          "v_row");
}

void relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                          double lambda, RelationCache& cache, Tensor& y_row,
                          const RelationOptions& options) {
  QV_CHECK(cache.p2.defined(), "relation_decode_step: the cache was never sized");
  check_lambda(lambda);
  QV_CHECK(options.tau_s > 0 && std::isfinite(options.tau_s),
           "relation: tau_s must be positive and finite, got {}", options.tau_s);
  const Shape row_shape{cache.batch(), cache.heads(), cache.head_dim()};
  for (auto [t, name] : {std::pair{&p1_row, "p1_row"}, {&p2_row, "p2_row"}, {&v_row, "v_row"}}) {
    check_float_input(*t, name);
    check_dtype(*t, cache.p2.dtype(), name);
    check_shape(*t, row_shape, name);
  }
  QV_CHECK(cache.length + 1 <= cache.capacity(),
           "relation_decode_step: the cache is full ({} rows)", cache.capacity());
  prepare_output(y_row, row_shape, p1_row.dtype(), "y_row");
  const int64_t B = cache.batch(), H = cache.heads(), Dh = cache.head_dim();
  if (p1_row.dtype() == DType::F32)
    decode_step<float>(p1_row.data<float>(), p2_row.data<float>(), v_row.data<float>(),
                       float(lambda), options, cache.p2.data<float>(), cache.v.data<float>(), B, H,
                       Dh, cache.capacity(), cache.length, y_row.data<float>());
  else
    decode_step<double>(p1_row.data<double>(), p2_row.data<double>(), v_row.data<double>(),
                        lambda, options, cache.p2.data<double>(), cache.v.data<double>(), B, H, Dh,
                        cache.capacity(), cache.length, y_row.data<double>());
  cache.append_row(p2_row, v_row);
}

}  // namespace quiver::ops
