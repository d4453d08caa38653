#include "ops/attention.h"

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

// The tile products run inside quiver's own parallel loops, so OpenBLAS must not spawn
// threads of its own underneath them.
// Validated sizes of one attention call.
struct AttnDims {
  int64_t B, T, Hq, Hkv, Dh;
  Shape lse_shape;
};

AttnDims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float_input(q, "q");
  check_float_input(k, "k");
  check_float_input(v, "v");
  HeadShape dq = head_shape(q.shape(), "q");
  HeadShape dk = head_shape(k.shape(), "k");
  QV_CHECK(k.ndim() == q.ndim(), "k: expected a {}-d tensor like q, got shape {}", q.ndim(),
           shape_str(k.shape()));
  check_dtype(k, q.dtype(), "k");
  check_dtype(v, q.dtype(), "v");
  QV_CHECK(dk.B == dq.B && dk.T == dq.T && dk.Dh == dq.Dh,
           "k: expected batch, time and head width of q {} with any divisor of {} heads, got {}",
           shape_str(q.shape()), dq.H, shape_str(k.shape()));
  QV_CHECK(dq.H % dk.H == 0, "k: {} kv heads do not divide the {} query heads of q", dk.H, dq.H);
  check_shape(v, k.shape(), "v");
  AttnDims d{dq.B, dq.T, dq.H, dk.H, dq.Dh, {}};
  d.lse_shape = q.ndim() == 4 ? Shape{d.B, d.Hq, d.T} : Shape{d.Hq, d.T};
  return d;
}

// Query tile k of n in the order 0, n−1, 1, n−2, ...: a causal tile's cost grows with its
// index, so this pairs light and heavy tiles inside every contiguous chunk of work.
int64_t zigzag(int64_t k, int64_t n) { return k % 2 == 0 ? k / 2 : n - 1 - k / 2; }

template <typename T>
void flash_forward(const AttnDims& d, const T* q, const T* k, const T* v, T* y, T* lse,
                   int64_t tile) {
  const int64_t group = d.Hq / d.Hkv, qs = d.Hq * d.Dh, ks = d.Hkv * d.Dh, Dh = d.Dh, Tn = d.T;
  const int64_t ntiles = (Tn + tile - 1) / tile;
  const T scale = T(1) / std::sqrt(T(Dh));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  parallel_for(d.B * d.Hq * ntiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> s(tile * tile), acc(tile * Dh), m(tile), l(tile);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (d.Hq * ntiles), h = item / ntiles % d.Hq;
      const int64_t p0 = zigzag(item % ntiles, ntiles) * tile;
      const int64_t bq = std::min(tile, Tn - p0), g = h / group;
      const T* qp = q + ((b * Tn + p0) * d.Hq + h) * Dh;
      const T* kb = k + (b * Tn * d.Hkv + g) * Dh;
      const T* vb = v + (b * Tn * d.Hkv + g) * Dh;
      std::fill(m.begin(), m.end(), neg_inf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t j0 = 0; j0 < p0 + bq; j0 += tile) {
        const int64_t bk = std::min(tile, p0 + bq - j0);
        blas::gemm(false, true, bq, bk, Dh, scale, qp, qs, kb + j0 * ks, ks, T(0), s.data(), tile);
        for (int64_t r = 0; r < bq; ++r) {
          T* sr = s.data() + r * tile;
          const int64_t valid = std::min(bk, p0 + r - j0 + 1);  // causal: key j <= query p
          if (valid <= 0) {
            std::fill(sr, sr + bk, T(0));
            continue;
          }
          online_softmax_row(sr, valid, bk, m[r], l[r], acc.data() + r * Dh, Dh);
        }
        blas::gemm(false, false, bq, Dh, bk, T(1), s.data(), tile, vb + j0 * ks, ks, T(1),
                   acc.data(), Dh);
      }
      for (int64_t r = 0; r < bq; ++r) {
        T* yr = y + ((b * Tn + p0 + r) * d.Hq + h) * Dh;
        const T inv = T(1) / l[r];
        for (int64_t c = 0; c < Dh; ++c) yr[c] = acc[r * Dh + c] * inv;
        lse[(b * d.Hq + h) * Tn + p0 + r] = m[r] + std::log(l[r]);
      }
    }
  });
}

template <typename T>
void flash_backward(const AttnDims& d, const T* q, const T* k, const T* v, const T* y,
                    const T* lse, const T* dy, T* dq, T* dk, T* dv, int64_t tile) {
  const int64_t group = d.Hq / d.Hkv, qs = d.Hq * d.Dh, ks = d.Hkv * d.Dh, Dh = d.Dh, Tn = d.T;
  const T scale = T(1) / std::sqrt(T(Dh));
  // One work item per (batch, kv head): it owns dk and dv of that head and dq of its group.
  parallel_for(d.B * d.Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> p(tile * tile), dp(tile * tile), delta(Tn);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / d.Hkv, g = item % d.Hkv;
      const T* kb = k + (b * Tn * d.Hkv + g) * Dh;
      const T* vb = v + (b * Tn * d.Hkv + g) * Dh;
      T* dkb = dk + (b * Tn * d.Hkv + g) * Dh;
      T* dvb = dv + (b * Tn * d.Hkv + g) * Dh;
      for (int64_t t = 0; t < Tn; ++t) {
        std::fill(dkb + t * ks, dkb + t * ks + Dh, T(0));
        std::fill(dvb + t * ks, dvb + t * ks + Dh, T(0));
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t off = (b * Tn * d.Hq + h) * Dh;
        const T *qb = q + off, *yb = y + off, *dyb = dy + off;
        const T* lb = lse + (b * d.Hq + h) * Tn;
        T* dqb = dq + off;
        for (int64_t t = 0; t < Tn; ++t) {
          T acc = 0;
          for (int64_t c = 0; c < Dh; ++c) acc += dyb[t * qs + c] * yb[t * qs + c];
          delta[t] = acc;
          std::fill(dqb + t * qs, dqb + t * qs + Dh, T(0));
        }
        for (int64_t j0 = 0; j0 < Tn; j0 += tile) {
          const int64_t bk = std::min(tile, Tn - j0);
          for (int64_t p0 = j0; p0 < Tn; p0 += tile) {
            const int64_t bq = std::min(tile, Tn - p0);
            blas::gemm(false, true, bq, bk, Dh, scale, qb + p0 * qs, qs, kb + j0 * ks, ks, T(0),
                       p.data(), tile);
            blas::gemm(false, true, bq, bk, Dh, T(1), dyb + p0 * qs, qs, vb + j0 * ks, ks, T(0),
                       dp.data(), tile);
            for (int64_t r = 0; r < bq; ++r) {
              const int64_t valid = std::min(bk, p0 + r - j0 + 1);
              T* pr = p.data() + r * tile;
              T* dpr = dp.data() + r * tile;
              for (int64_t c = 0; c < bk; ++c) {
                if (c < valid) {
                  pr[c] = std::exp(pr[c] - lb[p0 + r]);
                  dpr[c] = pr[c] * (dpr[c] - delta[p0 + r]);
                } else {
                  pr[c] = 0;
                  dpr[c] = 0;
                }
              }
            }
            blas::gemm(true, false, bk, Dh, bq, T(1), p.data(), tile, dyb + p0 * qs, qs, T(1),
                       dvb + j0 * ks, ks);
            blas::gemm(false, false, bq, Dh, bk, scale, dp.data(), tile, kb + j0 * ks, ks, T(1),
                       dqb + p0 * qs, qs);
            blas::gemm(true, false, bk, Dh, bq, scale, dp.data(), tile, qb + p0 * qs, qs, T(1),
                       dkb + j0 * ks, ks);
          }
        }
      }
    }
  });
}

template <typename T>
void reference_forward(const AttnDims& d, const T* q, const T* k, const T* v, T* y) {
  const int64_t group = d.Hq / d.Hkv, Dh = d.Dh, Tn = d.T;
  const double scale = 1.0 / std::sqrt(double(Dh));
  parallel_for(d.B * d.Hq, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> prob(Tn * Tn);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / d.Hq, h = item % d.Hq, g = h / group;
      auto qrow = [&](int64_t t) { return q + ((b * Tn + t) * d.Hq + h) * Dh; };
      auto krow = [&](int64_t t) { return k + ((b * Tn + t) * d.Hkv + g) * Dh; };
      auto vrow = [&](int64_t t) { return v + ((b * Tn + t) * d.Hkv + g) * Dh; };
      for (int64_t i = 0; i < Tn; ++i) {
        double* pr = prob.data() + i * Tn;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t c = 0; c < Dh; ++c) s += double(qrow(i)[c]) * krow(j)[c];
          pr[j] = s * scale;
          mx = std::max(mx, pr[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += pr[j] = std::exp(pr[j] - mx);
        for (int64_t j = 0; j <= i; ++j) pr[j] /= sum;
        for (int64_t j = i + 1; j < Tn; ++j) pr[j] = 0;
        T* yr = y + ((b * Tn + i) * d.Hq + h) * Dh;
        for (int64_t c = 0; c < Dh; ++c) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += pr[j] * vrow(j)[c];
          yr[c] = T(acc);
        }
      }
    }
  });
}

template <typename T>
void reference_backward(const AttnDims& d, const T* q, const T* k, const T* v, const T* dy, T* dq,
                        T* dk, T* dv) {
  const int64_t group = d.Hq / d.Hkv, Dh = d.Dh, Tn = d.T;
  const double scale = 1.0 / std::sqrt(double(Dh));
  // Per (batch, kv head) so that the group's contributions to dk and dv add up in one place.
  parallel_for(d.B * d.Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> prob(Tn * Tn), dprob(Tn * Tn), dkacc(Tn * Dh), dvacc(Tn * Dh);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / d.Hkv, g = item % d.Hkv;
      auto krow = [&](int64_t t) { return k + ((b * Tn + t) * d.Hkv + g) * Dh; };
      auto vrow = [&](int64_t t) { return v + ((b * Tn + t) * d.Hkv + g) * Dh; };
      std::fill(dkacc.begin(), dkacc.end(), 0.0);
      std::fill(dvacc.begin(), dvacc.end(), 0.0);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        auto qrow = [&](int64_t t) { return q + ((b * Tn + t) * d.Hq + h) * Dh; };
        auto dyrow = [&](int64_t t) { return dy + ((b * Tn + t) * d.Hq + h) * Dh; };
        // P: causal softmax of the scaled scores.
        for (int64_t i = 0; i < Tn; ++i) {
          double* pr = prob.data() + i * Tn;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0;
            for (int64_t c = 0; c < Dh; ++c) s += double(qrow(i)[c]) * krow(j)[c];
            pr[j] = s * scale;
            mx = std::max(mx, pr[j]);
          }
          double sum = 0;
          for (int64_t j = 0; j <= i; ++j) sum += pr[j] = std::exp(pr[j] - mx);
          for (int64_t j = 0; j <= i; ++j) pr[j] /= sum;
        }
        // dP = dY Vᵀ; dS = P ⊙ (dP − rowsum(P ⊙ dP)).
        for (int64_t i = 0; i < Tn; ++i) {
          double* pr = prob.data() + i * Tn;
          double* dpr = dprob.data() + i * Tn;
          double rowsum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0;
            for (int64_t c = 0; c < Dh; ++c) s += double(dyrow(i)[c]) * vrow(j)[c];
            dpr[j] = s;
            rowsum += pr[j] * s;
          }
          for (int64_t j = 0; j <= i; ++j) dpr[j] = pr[j] * (dpr[j] - rowsum);
        }
        for (int64_t i = 0; i < Tn; ++i) {
          T* dqr = dq + ((b * Tn + i) * d.Hq + h) * Dh;
          for (int64_t c = 0; c < Dh; ++c) {
            double acc = 0;
            for (int64_t j = 0; j <= i; ++j) acc += dprob[i * Tn + j] * krow(j)[c];
            dqr[c] = T(acc * scale);
          }
        }
        for (int64_t j = 0; j < Tn; ++j) {
          for (int64_t c = 0; c < Dh; ++c) {
            double ak = 0, av = 0;
            for (int64_t i = j; i < Tn; ++i) {
              ak += dprob[i * Tn + j] * qrow(i)[c];
              av += prob[i * Tn + j] * dyrow(i)[c];
            }
            dkacc[j * Dh + c] += ak * scale;
            dvacc[j * Dh + c] += av;
          }
        }
      }
      for (int64_t j = 0; j < Tn; ++j) {
        T* dkr = dk + ((b * Tn + j) * d.Hkv + g) * Dh;
        T* dvr = dv + ((b * Tn + j) * d.Hkv + g) * Dh;
        for (int64_t c = 0; c < Dh; ++c) {
          dkr[c] = T(dkacc[j * Dh + c]);
          dvr[c] = T(dvacc[j * Dh + c]);
        }
      }
    }
  });
}

template <typename T>
void decode_step(const T* q, const T* kc, const T* vc, T* y, int64_t B, int64_t Hq, int64_t Hkv,
                 int64_t Dh, int64_t capacity, int64_t length) {
  const int64_t group = Hq / Hkv, ks = Hkv * Dh;
  const T scale = T(1) / std::sqrt(T(Dh));
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, length * Dh));
  parallel_for(B * Hq, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hq, h = item % Hq, g = h / group;
      const T* qr = q + item * Dh;
      const T* kb = kc + (b * capacity * Hkv + g) * Dh;
      const T* vb = vc + (b * capacity * Hkv + g) * Dh;
      T* yr = y + item * Dh;
      std::fill(yr, yr + Dh, T(0));
      // Online softmax accumulated straight into the output row.
      T m = -std::numeric_limits<T>::infinity(), l = 0;
      for (int64_t j = 0; j < length; ++j) {
        T s = 0;
        for (int64_t c = 0; c < Dh; ++c) s += qr[c] * kb[j * ks + c];
        s *= scale;
        if (s > m) {
          const T alpha = std::exp(m - s);
          for (int64_t c = 0; c < Dh; ++c) yr[c] *= alpha;
          l *= alpha;
          m = s;
        }
        const T w = std::exp(s - m);
        l += w;
        for (int64_t c = 0; c < Dh; ++c) yr[c] += w * vb[j * ks + c];
      }
      const T inv = T(1) / l;
      for (int64_t c = 0; c < Dh; ++c) yr[c] *= inv;
    }
  });
}

void check_tile(int64_t tile) { QV_CHECK(tile >= 1, "attention: tile must be positive, got {}", tile); }

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y, Tensor& lse,
                       int64_t tile) {
  check_tile(tile);
  AttnDims d = check_qkv(q, k, v);
  prepare_output(y, q.shape(), q.dtype(), "y");
  prepare_output(lse, d.lse_shape, q.dtype(), "lse");
  blas::SingleThreadScope single;
  if (q.dtype() == DType::F32)
    flash_forward<float>(d, q.data<float>(), k.data<float>(), v.data<float>(), y.data<float>(),
                         lse.data<float>(), tile);
  else
    flash_forward<double>(d, q.data<double>(), k.data<double>(), v.data<double>(),
                          y.data<double>(), lse.data<double>(), tile);
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                        const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv,
                        int64_t tile) {
  check_tile(tile);
  AttnDims d = check_qkv(q, k, v);
  for (auto [t, name] : {std::pair{&y, "y"}, {&dy, "dy"}}) {
    check_float_input(*t, name);
    check_dtype(*t, q.dtype(), name);
    check_shape(*t, q.shape(), name);
  }
  check_float_input(lse, "lse");
  check_dtype(lse, q.dtype(), "lse");
  check_shape(lse, d.lse_shape, "lse");
  prepare_output(dq, q.shape(), q.dtype(), "dq");
  prepare_output(dk, k.shape(), q.dtype(), "dk");
  prepare_output(dv, v.shape(), q.dtype(), "dv");
  blas::SingleThreadScope single;
  if (q.dtype() == DType::F32)
    flash_backward<float>(d, q.data<float>(), k.data<float>(), v.data<float>(), y.data<float>(),
                          lse.data<float>(), dy.data<float>(), dq.data<float>(), dk.data<float>(),
                          dv.data<float>(), tile);
  else
    flash_backward<double>(d, q.data<double>(), k.data<double>(), v.data<double>(),
                           y.data<double>(), lse.data<double>(), dy.data<double>(),
                           dq.data<double>(), dk.data<double>(), dv.data<double>(), tile);
}

void attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y) {
  AttnDims d = check_qkv(q, k, v);
  prepare_output(y, q.shape(), q.dtype(), "y");
  if (q.dtype() == DType::F32)
    reference_forward<float>(d, q.data<float>(), k.data<float>(), v.data<float>(), y.data<float>());
  else
    reference_forward<double>(d, q.data<double>(), k.data<double>(), v.data<double>(),
                              y.data<double>());
}

void attention_reference_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv) {
  AttnDims d = check_qkv(q, k, v);
  check_float_input(dy, "dy");
  check_dtype(dy, q.dtype(), "dy");
  check_shape(dy, q.shape(), "dy");
  prepare_output(dq, q.shape(), q.dtype(), "dq");
  prepare_output(dk, k.shape(), q.dtype(), "dk");
  prepare_output(dv, v.shape(), q.dtype(), "dv");
  if (q.dtype() == DType::F32)
    reference_backward<float>(d, q.data<float>(), k.data<float>(), v.data<float>(),
                              dy.data<float>(), dq.data<float>(), dk.data<float>(),
                              dv.data<float>());
  else
    reference_backward<double>(d, q.data<double>(), k.data<double>(), v.data<double>(),
                               dy.data<double>(), dq.data<double>(), dk.data<double>(),
                               dv.data<double>());
}

int64_t attention_forward_workspace_bytes(const Shape& q_shape, DType dtype, int64_t tile) {
  HeadShape d = head_shape(q_shape, "q");
  const int64_t items = d.B * d.H * ((d.T + tile - 1) / tile);
  const int64_t per_chunk = tile * tile + tile * d.Dh + 2 * tile;
  return std::min<int64_t>(num_threads(), items) * per_chunk * int64_t(dtype_size(dtype));
}

int64_t attention_reference_forward_workspace_bytes(const Shape& q_shape, DType dtype) {
  HeadShape d = head_shape(q_shape, "q");
  return std::min<int64_t>(num_threads(), d.B * d.H) * d.T * d.T * int64_t(sizeof(double));
}

KVCache::KVCache(int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                 DType dtype) {
  detail::allocate_row_pair("KVCache", batch, capacity, kv_heads, head_dim, dtype, k, v);
}

void KVCache::append(const Tensor& k_rows, const Tensor& v_rows) {
  length = detail::append_row_pair("KVCache", k, v, length, k_rows, v_rows, "k_rows", "v_rows");
}

void KVCache::append_row(const Tensor& k_row, const Tensor& v_row) {
  length = detail::append_single_row_pair("KVCache", k, v, length, k_row, v_row, "k_row",
                                          "v_row");
}

void attention_decode_step(const Tensor& q_row, const KVCache& cache, Tensor& y_row) {
  QV_CHECK(cache.k.defined(), "attention_decode_step: the cache was never sized");
  QV_CHECK(cache.length >= 1,
           "attention_decode_step: the cache is empty; append this position's k and v first");
  check_float_input(q_row, "q_row");
  check_dtype(q_row, cache.k.dtype(), "q_row");
  QV_CHECK(q_row.ndim() == 3 && q_row.dim(0) == cache.batch() && q_row.dim(2) == cache.head_dim() &&
               q_row.dim(1) >= 1 && q_row.dim(1) % cache.kv_heads() == 0,
           "q_row: expected shape [{}, Hq, {}] with Hq a multiple of {} kv heads, got {}",
           cache.batch(), cache.head_dim(), cache.kv_heads(), shape_str(q_row.shape()));
  prepare_output(y_row, q_row.shape(), q_row.dtype(), "y_row");
  const int64_t B = cache.batch(), Hq = q_row.dim(1), Hkv = cache.kv_heads(), Dh = cache.head_dim();
  if (q_row.dtype() == DType::F32)
    decode_step<float>(q_row.data<float>(), cache.k.data<float>(), cache.v.data<float>(),
                       y_row.data<float>(), B, Hq, Hkv, Dh, cache.capacity(), cache.length);
  else
    decode_step<double>(q_row.data<double>(), cache.k.data<double>(), cache.v.data<double>(),
                        y_row.data<double>(), B, Hq, Hkv, Dh, cache.capacity(), cache.length);
}

}  // namespace quiver::ops
