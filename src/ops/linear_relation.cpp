// Linear Relation on the CPU: the recurrence (reference), the chunkwise-parallel form, their
// backward passes, decoding, and the retention gate. See linear_relation.h for the math.
//
// Per head (one sequence of one batch element), with q_t = S_t p̂1_t, k_t = p̂2_t, w_t = S_t v_t
// and G the cumulative log-decay inside a chunk (G_i = Σ_{u<=i} g_u, relative to the chunk
// start, so G is non-increasing and <= 0):
//   E_i = (q_i ⊙ e^{G_i})ᵀ C_prev + Σ_{j<i} A_ij w_j,   A_ij = Σ_r q_i[r] k_j[r] e^{G_i[r]−G_j[r]}
//   C_next = Diag(e^{Γ}) C_prev + Σ_j (k_j ⊙ e^{Γ−G_j}) w_jᵀ,   Γ = G_{L−1}
// Only factors e^{G_i − G_j} with j <= i appear, each formed as a product of α's in [0, 1], so
// nothing overflows however strong the decay or long the sequence, and nothing is divided by a
// decay. A is built in sub-blocks of kSubBlock tokens: for a query sub-block I after a key
// sub-block J the factor splits into (I's part) ⊙ (the sub-blocks between) ⊙ (J's part), all
// <= 1, which turns the block into a GEMM; inside one sub-block it is a running product.
// The Dh×Dh and chunk×chunk products go through OpenBLAS (single-threaded inside the
// parallel loop over heads).
#include "ops/linear_relation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/blas.h"
#include "quiver/error.h"
#include "quiver/parallel.h"

namespace quiver::ops {
namespace {

constexpr int64_t kSubBlock = 16;
constexpr int64_t kMinCheckpointEvery = 16;

// A [B, T, H, Dh] problem; 3-d inputs have B = 1.
struct Dims {
  int64_t B = 1, T = 0, H = 0, d = 0;
  int64_t heads() const { return B * H; }
  int64_t stride() const { return H * d; }
  int64_t head_offset(int64_t bh) const { return (bh / H) * T * H * d + (bh % H) * d; }
};

Dims sequence_dims(const Tensor& t, const char* name) {
  QV_CHECK(t.ndim() == 3 || t.ndim() == 4, "{}: expected shape [T, H, Dh] or [B, T, H, Dh], got {}",
           name, shape_str(t.shape()));
  Dims dm;
  int lead = t.ndim() - 3;
  dm.B = lead ? t.dim(0) : 1;
  dm.T = t.dim(lead);
  dm.H = t.dim(lead + 1);
  dm.d = t.dim(lead + 2);
  QV_CHECK(dm.d >= 1, "{}: head width Dh must be at least 1, got shape {}", name,
           shape_str(t.shape()));
  return dm;
}

void check_float_dtype(const Tensor& t, const char* name) {
  QV_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64,
           "{}: expected dtype F32 or F64, got {}", name, dtype_name(t.dtype()));
}

// Same shape and dtype as `ref`, CPU, contiguous.
void check_like(const Tensor& t, const Tensor& ref, const char* name) {
  check_shape(t, ref.shape(), name);
  check_dtype(t, ref.dtype(), name);
  check_cpu_contiguous(t, name);
}

std::string index_str(const Shape& shape, int64_t flat) {
  Shape idx(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return shape_str(idx);
}

template <typename T>
void check_log_decay_typed(const Tensor& g, const char* name) {
  const T* p = g.data<T>();
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (!(p[i] <= T(0)) || !std::isfinite(p[i]))
      fail("{}: the log-decay must be finite and <= 0 (α = exp(g) in (0, 1]), got {} at index {}",
           name, static_cast<double>(p[i]), index_str(g.shape(), i));
  }
}

void check_log_decay(const Tensor& g, const char* name) {
  if (g.dtype() == DType::F32)
    check_log_decay_typed<float>(g, name);
  else
    check_log_decay_typed<double>(g, name);
}

void check_tau(double tau_s) {
  QV_CHECK(std::isfinite(tau_s) && tau_s > 0, "tau_s must be finite and positive, got {}", tau_s);
}

// Validates p1, p2, v, g of a sequence op and returns the problem's dimensions.
Dims check_sequence_inputs(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                           double tau_s) {
  Dims dm = sequence_dims(p1, "p1");
  check_float_dtype(p1, "p1");
  check_cpu_contiguous(p1, "p1");
  check_like(p2, p1, "p2");
  check_like(v, p1, "v");
  check_like(g, p1, "g");
  check_log_decay(g, "g");
  check_tau(tau_s);
  return dm;
}

void check_chunk(int64_t chunk) { QV_CHECK(chunk >= 1, "chunk must be at least 1, got {}", chunk); }

template <typename T>
T sigmoid(T u) {
  if (u >= T(0)) return T(1) / (T(1) + std::exp(-u));
  T e = std::exp(u);
  return e / (T(1) + e);
}

template <typename T>
T softplus(T z) {
  return std::max(z, T(0)) + std::log1p(std::exp(-std::abs(z)));
}

// Eight independent partial sums, so the compiler can vectorize without reassociating.
template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  T tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail;
}

// y += a·x
template <typename T>
void axpy(T a, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// One (batch, head) sequence inside [B, T, H, Dh] tensors: token t of a tensor starts at
// base + t·stride.
template <typename T>
struct HeadSeq {
  const T* p1;
  const T* p2;
  const T* v;
  const T* g;
  int64_t len, d, stride;
  T gate_scale;  // 1 / (τ_S sqrt(Dh))
};

template <typename T>
HeadSeq<T> head_seq(const Dims& dm, int64_t bh, const Tensor& p1, const Tensor& p2, const Tensor& v,
                    const Tensor& g, double tau_s) {
  int64_t off = dm.head_offset(bh);
  const T gate_scale = static_cast<T>(1.0 / (tau_s * std::sqrt(static_cast<double>(dm.d))));
  HeadSeq<T> s;
  s.p1 = p1.data<T>() + off;
  s.p2 = p2.data<T>() + off;
  s.v = v.data<T>() + off;
  s.g = g.data<T>() + off;
  s.len = dm.T;
  s.d = dm.d;
  s.stride = dm.stride();
  s.gate_scale = gate_scale;
  return s;
}

// Per-token gate and the raw (unclamped) norms of p1 and p2, kept for the backward.
template <typename T>
struct TokenGate {
  T S, norm1, norm2;
};

template <typename T>
T inverse_clamped_norm(T norm) {
  return T(1) / std::max(norm, static_cast<T>(kLinearRelationNormEps));
}

template <typename T>
TokenGate<T> token_gate(const T* p1, const T* p2, int64_t d, T gate_scale) {
  return {sigmoid(dot(p1, p2, d) * gate_scale), std::sqrt(dot(p1, p1, d)),
          std::sqrt(dot(p2, p2, d))};
}

// S and the normalized p̂1, p̂2 of one token.
template <typename T>
TokenGate<T> prepare_token(const T* p1, const T* p2, int64_t d, T gate_scale, T* p1hat, T* p2hat) {
  TokenGate<T> tg = token_gate(p1, p2, d, gate_scale);
  T inv1 = inverse_clamped_norm(tg.norm1), inv2 = inverse_clamped_norm(tg.norm2);
  for (int64_t i = 0; i < d; ++i) {
    p1hat[i] = p1[i] * inv1;
    p2hat[i] = p2[i] * inv2;
  }
  return tg;
}

// dp (assigned) from dp̂ through p̂ = p / max(‖p‖, eps).
template <typename T>
void normalize_backward(const T* p, T norm, const T* dphat, int64_t d, T* dp) {
  const T eps = static_cast<T>(kLinearRelationNormEps);
  if (norm > eps) {
    T inv = T(1) / norm;
    T proj = dot(p, dphat, d) * inv * inv;
    for (int64_t i = 0; i < d; ++i) dp[i] = (dphat[i] - p[i] * proj) * inv;
  } else {
    for (int64_t i = 0; i < d; ++i) dp[i] = dphat[i] / eps;
  }
}

// dp1, dp2 (assigned) of one token from the gradients w.r.t. p̂1, p̂2 and S.
template <typename T>
void token_backward(const T* p1, const T* p2, int64_t d, T gate_scale, const TokenGate<T>& tg,
                    const T* dp1hat, const T* dp2hat, T dS, T* dp1, T* dp2) {
  T du = dS * tg.S * (T(1) - tg.S) * gate_scale;
  normalize_backward(p1, tg.norm1, dp1hat, d, dp1);
  normalize_backward(p2, tg.norm2, dp2hat, d, dp2);
  for (int64_t i = 0; i < d; ++i) {
    dp1[i] += du * p2[i];
    dp2[i] += du * p1[i];
  }
}

template <typename Fn>
void for_each_head(const Dims& dm, Fn&& fn) {
  parallel_for(dm.heads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) fn(bh);
  });
}

// ---------------------------------------------------------------------------------------------
// Recurrence

template <typename T>
void recurrent_forward_head(const HeadSeq<T>& s, T* y) {
  const int64_t d = s.d;
  std::vector<T> C(d * d, T(0)), p1h(d), p2h(d), E(d);
  for (int64_t t = 0; t < s.len; ++t) {
    const T* v = s.v + t * s.stride;
    const T* g = s.g + t * s.stride;
    TokenGate<T> tg = prepare_token(s.p1 + t * s.stride, s.p2 + t * s.stride, d, s.gate_scale,
                                    p1h.data(), p2h.data());
    std::fill(E.begin(), E.end(), T(0));
    for (int64_t r = 0; r < d; ++r) {
      T a = std::exp(g[r]), qr = tg.S * p1h[r], kr = tg.S * p2h[r];
      T* Cr = C.data() + r * d;
      for (int64_t c = 0; c < d; ++c) {
        T cm = a * Cr[c];
        E[c] += qr * cm;
        Cr[c] = cm + kr * v[c];
      }
    }
    T* yt = y + t * s.stride;
    for (int64_t c = 0; c < d; ++c) yt[c] = v[c] + E[c];
  }
}

// C ← C_t from C_{t−1}; when Cminus is given it receives C_t⁻ = Diag(α_t) C_{t−1}.
template <typename T>
void recurrent_advance(const HeadSeq<T>& s, int64_t t, T* C, T* Cminus, T* p1h, T* p2h) {
  const int64_t d = s.d;
  const T* v = s.v + t * s.stride;
  const T* g = s.g + t * s.stride;
  TokenGate<T> tg =
      prepare_token(s.p1 + t * s.stride, s.p2 + t * s.stride, d, s.gate_scale, p1h, p2h);
  for (int64_t r = 0; r < d; ++r) {
    T a = std::exp(g[r]), kr = tg.S * p2h[r];
    T* Cr = C + r * d;
    for (int64_t c = 0; c < d; ++c) {
      T cm = a * Cr[c];
      if (Cminus) Cminus[r * d + c] = cm;
      Cr[c] = cm + kr * v[c];
    }
  }
}

// Reverse-time recurrence with D = dL/dC_t:
//   dC_t⁻ = D + S p̂1 dEᵀ,  dg[r] = Σ_c dC_t⁻[r,c] C_t⁻[r,c],  D_{t−1} = Diag(α_t) dC_t⁻,
//   dv = dy + S Dᵀ p̂2,  dp̂2 = S D v,  dp̂1 = S C_t⁻ dE,  dS = p̂2ᵀ D v + p̂1ᵀ C_t⁻ dE.
// C_t⁻ of one segment is recomputed from the state saved at the segment's start.
template <typename T>
void recurrent_backward_head(const HeadSeq<T>& s, const T* dy, T* dp1, T* dp2, T* dv, T* dg) {
  const int64_t d = s.d, dd = d * d, len = s.len;
  const int64_t every = std::max(d, kMinCheckpointEvery);
  const int64_t segments = (len + every - 1) / every;
  std::vector<T> checkpoints(segments * dd), C(dd, T(0)), Cminus(every * dd), D(dd, T(0));
  std::vector<T> p1h(d), p2h(d), dp1h(d), dp2h(d), dvacc(d);
  for (int64_t t = 0; t < len; ++t) {
    if (t % every == 0) std::copy(C.begin(), C.end(), checkpoints.begin() + (t / every) * dd);
    recurrent_advance(s, t, C.data(), static_cast<T*>(nullptr), p1h.data(), p2h.data());
  }
  for (int64_t seg = segments - 1; seg >= 0; --seg) {
    const int64_t t0 = seg * every, t1 = std::min(len, t0 + every);
    std::copy(checkpoints.begin() + seg * dd, checkpoints.begin() + (seg + 1) * dd, C.begin());
    for (int64_t t = t0; t < t1; ++t)
      recurrent_advance(s, t, C.data(), Cminus.data() + (t - t0) * dd, p1h.data(), p2h.data());
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const int64_t off = t * s.stride;
      const T* v = s.v + off;
      const T* g = s.g + off;
      const T* dE = dy + off;
      const T* Cm = Cminus.data() + (t - t0) * dd;
      TokenGate<T> tg =
          prepare_token(s.p1 + off, s.p2 + off, d, s.gate_scale, p1h.data(), p2h.data());
      T dS = 0;
      std::fill(dvacc.begin(), dvacc.end(), T(0));
      for (int64_t r = 0; r < d; ++r) {
        T* Dr = D.data() + r * d;
        const T* Cr = Cm + r * d;
        T Dv = dot(Dr, v, d), CdE = dot(Cr, dE, d);
        axpy(p2h[r], Dr, dvacc.data(), d);
        dp2h[r] = tg.S * Dv;
        dp1h[r] = tg.S * CdE;
        dS += p2h[r] * Dv + p1h[r] * CdE;
        axpy(tg.S * p1h[r], dE, Dr, d);  // Dr is now row r of dC_t⁻
        dg[off + r] = dot(Dr, Cr, d);
        const T a = std::exp(g[r]);
        for (int64_t c = 0; c < d; ++c) Dr[c] *= a;
      }
      for (int64_t c = 0; c < d; ++c) dv[off + c] = dE[c] + tg.S * dvacc[c];
      token_backward(s.p1 + off, s.p2 + off, d, s.gate_scale, tg, dp1h.data(), dp2h.data(), dS,
                     dp1 + off, dp2 + off);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Chunked form

// One chunk's per-token quantities, each [len, Dh] row-major (rows are tokens of the chunk),
// and the chunk's intra-chunk matrix A [len, len] (strictly lower triangular).
// Every decay factor is a product of α's, so each lies in [0, 1]:
//   eG_i = e^{G_i}              (from the chunk start through token i)
//   eK_j = e^{Γ − G_j}          (after token j to the chunk end)
//   xs_i = e^{G_i − G_{b−1}}    (from the start b of i's sub-block through i)
//   Kf_j = e^{G_e − G_j}        (after j to the end e of j's sub-block), Kb_j = k_j ⊙ Kf_j
//   P[I] = e^{G_e − G_{b−1}}    (the whole of sub-block I)
template <typename T>
struct Chunk {
  int64_t cap, d;
  std::vector<TokenGate<T>> gates;
  std::vector<T> p1h, q, k, w, alpha, eG, eK, qd, kd, xs, Kf, Kb, P, A, lambda, xq;
  Chunk(int64_t cap_, int64_t d_)
      : cap(cap_), d(d_), gates(cap_), p1h(cap_ * d_), q(cap_ * d_), k(cap_ * d_), w(cap_ * d_),
        alpha(cap_ * d_), eG(cap_ * d_), eK(cap_ * d_), qd(cap_ * d_), kd(cap_ * d_), xs(cap_ * d_),
        Kf(cap_ * d_), Kb(cap_ * d_), P(((cap_ + kSubBlock - 1) / kSubBlock) * d_), A(cap_ * cap_),
        lambda(d_), xq(kSubBlock * d_) {}

  // Without `intra` only what chunk_advance needs is guaranteed (A is left stale).
  void load(const HeadSeq<T>& s, int64_t t0, int64_t len, bool intra = true) {
    for (int64_t i = 0; i < len; ++i) {
      const int64_t off = (t0 + i) * s.stride;
      T* p1i = &p1h[i * d];
      gates[i] = prepare_token(s.p1 + off, s.p2 + off, d, s.gate_scale, p1i, &k[i * d]);
      const T S = gates[i].S;
      const T* v = s.v + off;
      const T* g = s.g + off;
      const bool block_start = i % kSubBlock == 0;
      for (int64_t r = 0; r < d; ++r) {
        const int64_t ir = i * d + r;
        const T a = std::exp(g[r]);
        q[ir] = S * p1i[r];
        w[ir] = S * v[r];
        alpha[ir] = a;
        eG[ir] = i ? eG[ir - d] * a : a;
        qd[ir] = q[ir] * eG[ir];
        xs[ir] = block_start ? a : xs[ir - d] * a;
      }
    }
    for (int64_t j = len - 1; j >= 0; --j) {
      const bool last = j == len - 1;
      const bool block_end = last || (j + 1) % kSubBlock == 0;
      for (int64_t r = 0; r < d; ++r) {
        const int64_t jr = j * d + r;
        eK[jr] = last ? T(1) : eK[jr + d] * alpha[jr + d];
        kd[jr] = k[jr] * eK[jr];
        Kf[jr] = block_end ? T(1) : Kf[jr + d] * alpha[jr + d];
        Kb[jr] = k[jr] * Kf[jr];
      }
    }
    for (int64_t I0 = 0; I0 < len; I0 += kSubBlock) {
      const int64_t e = std::min(len, I0 + kSubBlock) - 1;
      std::copy(&xs[e * d], &xs[e * d] + d, &P[(I0 / kSubBlock) * d]);
    }
    if (intra) build_intra(len);
  }

  // A_ij = Σ_r q_i[r] k_j[r] e^{G_i[r] − G_j[r]} for j < i, else 0. For a query sub-block I
  // and an earlier key sub-block J, e^{G_i − G_j} = xs_i ⊙ λ ⊙ Kf_j with λ the decay of the
  // sub-blocks strictly between; inside one sub-block the factor gains one α per step back.
  void build_intra(int64_t len) {
    std::fill(A.begin(), A.begin() + len * len, T(0));
    for (int64_t I0 = 0; I0 < len; I0 += kSubBlock) {
      const int64_t I1 = std::min(len, I0 + kSubBlock);
      std::fill(lambda.begin(), lambda.end(), T(1));
      for (int64_t J0 = I0 - kSubBlock; J0 >= 0; J0 -= kSubBlock) {
        for (int64_t i = I0; i < I1; ++i)
          for (int64_t r = 0; r < d; ++r)
            xq[(i - I0) * d + r] = q[i * d + r] * xs[i * d + r] * lambda[r];
        blas::gemm(false, true, I1 - I0, kSubBlock, d, T(1), xq.data(), d, &Kb[J0 * d], d, T(0),
                   &A[I0 * len + J0], len);
        for (int64_t r = 0; r < d; ++r) lambda[r] *= P[(J0 / kSubBlock) * d + r];
      }
      T* f = xq.data();
      for (int64_t i = I0; i < I1; ++i) {
        for (int64_t r = 0; r < d; ++r) f[r] = q[i * d + r] * alpha[i * d + r];
        for (int64_t j = i - 1; j >= I0; --j) {
          A[i * len + j] = dot(f, &k[j * d], d);
          for (int64_t r = 0; r < d; ++r) f[r] *= alpha[j * d + r];
        }
      }
    }
  }
};

// E (len×Dh, assigned) = (q ⊙ e^G) C_prev + A w.
template <typename T>
void chunk_read(const Chunk<T>& ck, int64_t len, const T* C, T* E) {
  const int64_t d = ck.d;
  blas::gemm(false, false, len, d, d, T(1), ck.qd.data(), d, C, d, T(0), E, d);
  blas::gemm(false, false, len, d, len, T(1), ck.A.data(), len, ck.w.data(), d, T(1), E, d);
}

// C ← C_next = Diag(e^Γ) C + (k ⊙ e^{Γ−G})ᵀ w.
template <typename T>
void chunk_advance(const Chunk<T>& ck, int64_t len, T* C) {
  const int64_t d = ck.d;
  const T* eGam = &ck.eG[(len - 1) * d];
  for (int64_t r = 0; r < d; ++r)
    for (int64_t c = 0; c < d; ++c) C[r * d + c] *= eGam[r];
  blas::gemm(true, false, d, d, len, T(1), ck.kd.data(), d, ck.w.data(), d, T(1), C, d);
}

// Scratch for one chunk's backward.
template <typename T>
struct ChunkGrads {
  std::vector<T> dE, dq, dk, dw, dG, dKb, dA, dGam, lambda, x, xq, acc, f;
  ChunkGrads(int64_t cap, int64_t d)
      : dE(cap * d), dq(cap * d), dk(cap * d), dw(cap * d), dG(cap * d), dKb(cap * d),
        dA(cap * cap), dGam(d), lambda(d), x(kSubBlock * d), xq(kSubBlock * d), acc(kSubBlock * d),
        f(d) {}
};

// Gradients of one chunk. In: gr.dE (dL/dE, len×Dh), D = dL/dC_next. Out: gr.dq, dk, dw and
// dG (w.r.t. q, k, w and the cumulative G), and D ← dL/dC_prev.
template <typename T>
void chunk_backward(const Chunk<T>& ck, int64_t len, const T* Cprev, T* D, ChunkGrads<T>& gr) {
  const int64_t d = ck.d;
  const T* eGam = &ck.eG[(len - 1) * d];
  T* dq = gr.dq.data();
  T* dk = gr.dk.data();
  T* dw = gr.dw.data();
  T* dA = gr.dA.data();
  const T* dE = gr.dE.data();
  // Through C_next's writes: dk = e^{Γ−G} ⊙ (w Dᵀ), dw = (k ⊙ e^{Γ−G}) D.
  blas::gemm(false, true, len, d, d, T(1), ck.w.data(), d, D, d, T(0), dk, d);
  for (int64_t j = 0; j < len * d; ++j) dk[j] *= ck.eK[j];
  blas::gemm(false, false, len, d, d, T(1), ck.kd.data(), d, D, d, T(0), dw, d);
  // dΓ: the writes' decay and the decay of C_prev.
  for (int64_t r = 0; r < d; ++r) gr.dGam[r] = eGam[r] * dot(D + r * d, Cprev + r * d, d);
  for (int64_t j = 0; j < len; ++j)
    for (int64_t r = 0; r < d; ++r) gr.dGam[r] += ck.k[j * d + r] * dk[j * d + r];
  // Through the inter-chunk read: dq = e^G ⊙ (dE C_prevᵀ).
  blas::gemm(false, true, len, d, d, T(1), dE, d, Cprev, d, T(0), dq, d);
  for (int64_t j = 0; j < len * d; ++j) dq[j] *= ck.eG[j];
  // D ← Diag(e^Γ) D + (q ⊙ e^G)ᵀ dE.
  for (int64_t r = 0; r < d; ++r)
    for (int64_t c = 0; c < d; ++c) D[r * d + c] *= eGam[r];
  blas::gemm(true, false, d, d, len, T(1), ck.qd.data(), d, dE, d, T(1), D, d);
  // Intra-chunk: dA = dE wᵀ (used where j < i), dw += Aᵀ dE, then dq, dk through A's factors.
  blas::gemm(false, true, len, len, d, T(1), dE, d, ck.w.data(), d, T(0), dA, len);
  blas::gemm(true, false, len, d, len, T(1), ck.A.data(), len, dE, d, T(1), dw, d);
  std::fill(gr.dKb.begin(), gr.dKb.begin() + len * d, T(0));
  T* lambda = gr.lambda.data();
  T* x = gr.x.data();
  T* xq = gr.xq.data();
  T* acc = gr.acc.data();
  T* f = gr.f.data();
  for (int64_t I0 = 0; I0 < len; I0 += kSubBlock) {
    const int64_t I1 = std::min(len, I0 + kSubBlock);
    std::fill(lambda, lambda + d, T(1));
    const int64_t nI = I1 - I0;
    for (int64_t J0 = I0 - kSubBlock; J0 >= 0; J0 -= kSubBlock) {
      for (int64_t i = I0; i < I1; ++i)
        for (int64_t r = 0; r < d; ++r) {
          x[(i - I0) * d + r] = ck.xs[i * d + r] * lambda[r];
          xq[(i - I0) * d + r] = ck.q[i * d + r] * x[(i - I0) * d + r];
        }
      // dq_I += x ⊙ (dA_IJ Kb_J);  dKb_J += dA_IJᵀ (q_I ⊙ x).
      blas::gemm(false, false, nI, d, kSubBlock, T(1), &dA[I0 * len + J0], len, &ck.Kb[J0 * d], d,
                 T(0), acc, d);
      for (int64_t j = 0; j < nI * d; ++j) dq[I0 * d + j] += x[j] * acc[j];
      blas::gemm(true, false, kSubBlock, d, nI, T(1), &dA[I0 * len + J0], len, xq, d, T(1),
                 &gr.dKb[J0 * d], d);
      for (int64_t r = 0; r < d; ++r) lambda[r] *= ck.P[(J0 / kSubBlock) * d + r];
    }
    for (int64_t i = I0; i < I1; ++i) {
      std::copy(&ck.alpha[i * d], &ck.alpha[i * d] + d, f);
      for (int64_t r = 0; r < d; ++r) xq[r] = ck.q[i * d + r] * f[r];
      std::fill(acc, acc + d, T(0));
      for (int64_t j = i - 1; j >= I0; --j) {
        const T* kj = &ck.k[j * d];
        const T da = dA[i * len + j];
        axpy(da, xq, dk + j * d, d);
        for (int64_t r = 0; r < d; ++r) {
          acc[r] += da * kj[r] * f[r];
          f[r] *= ck.alpha[j * d + r];
          xq[r] *= ck.alpha[j * d + r];
        }
      }
      axpy(T(1), acc, dq + i * d, d);
    }
  }
  for (int64_t j = 0; j < len * d; ++j) dk[j] += ck.Kf[j] * gr.dKb[j];
  // dG_i = q_i ⊙ dq_i − k_i ⊙ dk_i, plus dΓ on the last row.
  for (int64_t j = 0; j < len * d; ++j) gr.dG[j] = ck.q[j] * dq[j] - ck.k[j] * dk[j];
  for (int64_t r = 0; r < d; ++r) gr.dG[(len - 1) * d + r] += gr.dGam[r];
}

template <typename T>
void chunked_forward_head(const HeadSeq<T>& s, int64_t chunk, T* y, T* final_state) {
  const int64_t d = s.d, len = s.len;
  const int64_t L = std::min(chunk, len);
  Chunk<T> ck(L, d);
  std::vector<T> C(d * d, T(0)), E(L * d);
  for (int64_t t0 = 0; t0 < len; t0 += L) {
    const int64_t n = std::min(L, len - t0);
    ck.load(s, t0, n);
    chunk_read(ck, n, C.data(), E.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t off = (t0 + i) * s.stride;
      for (int64_t c = 0; c < d; ++c) y[off + c] = s.v[off + c] + E[i * d + c];
    }
    chunk_advance(ck, n, C.data());
  }
  if (final_state) std::copy(C.begin(), C.end(), final_state);
}

template <typename T>
void chunked_backward_head(const HeadSeq<T>& s, int64_t chunk, const T* dy, T* dp1, T* dp2, T* dv,
                           T* dgout) {
  const int64_t d = s.d, dd = d * d, len = s.len;
  const int64_t L = std::min(chunk, len);
  const int64_t chunks = (len + L - 1) / L;
  const int64_t every = std::max<int64_t>(1, (d + L - 1) / L);  // chunks per checkpoint
  const int64_t segments = (chunks + every - 1) / every;
  Chunk<T> ck(L, d);
  ChunkGrads<T> gr(L, d);
  std::vector<T> checkpoints(segments * dd), Cprev(every * dd), C(dd, T(0)), D(dd, T(0));
  std::vector<T> dp1h(d);
  for (int64_t c = 0; c < chunks; ++c) {
    if (c % every == 0) std::copy(C.begin(), C.end(), checkpoints.begin() + (c / every) * dd);
    const int64_t t0 = c * L, n = std::min(L, len - t0);
    ck.load(s, t0, n, false);
    chunk_advance(ck, n, C.data());
  }
  for (int64_t seg = segments - 1; seg >= 0; --seg) {
    const int64_t c0 = seg * every, c1 = std::min(chunks, c0 + every);
    std::copy(checkpoints.begin() + seg * dd, checkpoints.begin() + (seg + 1) * dd, C.begin());
    for (int64_t c = c0; c < c1; ++c) {
      std::copy(C.begin(), C.end(), Cprev.begin() + (c - c0) * dd);
      if (c + 1 < c1) {
        const int64_t t0 = c * L, n = std::min(L, len - t0);
        ck.load(s, t0, n, false);
        chunk_advance(ck, n, C.data());
      }
    }
    for (int64_t c = c1 - 1; c >= c0; --c) {
      const int64_t t0 = c * L, n = std::min(L, len - t0);
      ck.load(s, t0, n);
      for (int64_t i = 0; i < n; ++i)
        std::copy(dy + (t0 + i) * s.stride, dy + (t0 + i) * s.stride + d, &gr.dE[i * d]);
      chunk_backward(ck, n, Cprev.data() + (c - c0) * dd, D.data(), gr);
      // dg_u = Σ_{i>=u} dG_i inside the chunk.
      for (int64_t i = n - 1; i >= 0; --i) {
        T* dgi = dgout + (t0 + i) * s.stride;
        for (int64_t r = 0; r < d; ++r)
          dgi[r] = gr.dG[i * d + r] + (i + 1 < n ? dgout[(t0 + i + 1) * s.stride + r] : T(0));
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = (t0 + i) * s.stride;
        const TokenGate<T>& tg = ck.gates[i];
        const T* dqi = &gr.dq[i * d];
        const T* dwi = &gr.dw[i * d];
        T dS = dot(dqi, &ck.p1h[i * d], d) + dot(dwi, s.v + off, d);
        for (int64_t r = 0; r < d; ++r) {
          dp1h[r] = tg.S * dqi[r];
          dv[off + r] = gr.dE[i * d + r] + tg.S * dwi[r];
        }
        token_backward(s.p1 + off, s.p2 + off, d, s.gate_scale, tg, dp1h.data(), &gr.dk[i * d], dS,
                       dp1 + off, dp2 + off);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dispatch

template <typename T>
void recurrent_forward(const Dims& dm, const Tensor& p1, const Tensor& p2, const Tensor& v,
                       const Tensor& g, const Tensor& y, double tau_s) {
  if (dm.T == 0) return;
  for_each_head(dm, [&](int64_t bh) {
    recurrent_forward_head(head_seq<T>(dm, bh, p1, p2, v, g, tau_s),
                           y.data<T>() + dm.head_offset(bh));
  });
}

template <typename T>
void recurrent_backward(const Dims& dm, const Tensor& p1, const Tensor& p2, const Tensor& v,
                        const Tensor& g, const Tensor& dy, const Tensor& dp1, const Tensor& dp2,
                        const Tensor& dv, const Tensor& dg, double tau_s) {
  if (dm.T == 0) return;
  for_each_head(dm, [&](int64_t bh) {
    int64_t off = dm.head_offset(bh);
    recurrent_backward_head(head_seq<T>(dm, bh, p1, p2, v, g, tau_s), dy.data<T>() + off,
                            dp1.data<T>() + off, dp2.data<T>() + off, dv.data<T>() + off,
                            dg.data<T>() + off);
  });
}

template <typename T, typename StateT>
void chunked_forward(const Dims& dm, const Tensor& p1, const Tensor& p2, const Tensor& v,
                     const Tensor& g, const Tensor& y, int64_t chunk, double tau_s, StateT* state) {
  const int64_t dd = dm.d * dm.d;
  blas::SingleThreadScope single_threaded_blas;  // GEMMs run inside the loop over heads
  for_each_head(dm, [&](int64_t bh) {
    std::vector<T> final_state(state ? dd : 0, T(0));
    if (dm.T > 0)
      chunked_forward_head(head_seq<T>(dm, bh, p1, p2, v, g, tau_s), chunk,
                           y.data<T>() + dm.head_offset(bh), state ? final_state.data() : nullptr);
    if (state)
      for (int64_t i = 0; i < dd; ++i) state[bh * dd + i] = static_cast<StateT>(final_state[i]);
  });
}

template <typename T>
void chunked_backward(const Dims& dm, const Tensor& p1, const Tensor& p2, const Tensor& v,
                      const Tensor& g, const Tensor& dy, const Tensor& dp1, const Tensor& dp2,
                      const Tensor& dv, const Tensor& dg, int64_t chunk, double tau_s) {
  if (dm.T == 0) return;
  blas::SingleThreadScope single_threaded_blas;  // GEMMs run inside the loop over heads
  for_each_head(dm, [&](int64_t bh) {
    int64_t off = dm.head_offset(bh);
    chunked_backward_head(head_seq<T>(dm, bh, p1, p2, v, g, tau_s), chunk, dy.data<T>() + off,
                          dp1.data<T>() + off, dp2.data<T>() + off, dv.data<T>() + off,
                          dg.data<T>() + off);
  });
}

// One token per (batch, head); E is accumulated in y first so that y = v + E rounds as the
// recurrence does.
template <typename T, typename StateT>
void decode_step(int64_t heads, int64_t d, const T* p1, const T* p2, const T* v, const T* g,
                 StateT* state, T* y, double tau_s) {
  const T gate_scale = static_cast<T>(1.0 / (tau_s * std::sqrt(static_cast<double>(d))));
  const int64_t grain = std::max<int64_t>(1, 16384 / (d * d));
  parallel_for(heads, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t o = bh * d;
      const TokenGate<T> tg = token_gate(p1 + o, p2 + o, d, gate_scale);
      const T S = tg.S;
      const T inv1 = inverse_clamped_norm(tg.norm1), inv2 = inverse_clamped_norm(tg.norm2);
      T* yh = y + o;
      std::fill(yh, yh + d, T(0));
      for (int64_t r = 0; r < d; ++r) {
        T a = std::exp(g[o + r]), qr = S * (p1[o + r] * inv1), kr = S * (p2[o + r] * inv2);
        StateT* Cr = state + bh * d * d + r * d;
        for (int64_t c = 0; c < d; ++c) {
          T cm = a * static_cast<T>(Cr[c]);
          yh[c] += qr * cm;
          Cr[c] = static_cast<StateT>(cm + kr * v[o + c]);
        }
      }
      for (int64_t c = 0; c < d; ++c) yh[c] = v[o + c] + yh[c];
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Retention gate

struct GateDims {
  int64_t N, D, Dh, H;  // N = B·T rows
};

GateDims check_gate_inputs(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                           const Tensor& a_log, const Tensor& dt_bias) {
  QV_CHECK(x.ndim() == 2 || x.ndim() == 3, "x: expected shape [T, D] or [B, T, D], got {}",
           shape_str(x.shape()));
  check_float_dtype(x, "x");
  check_cpu_contiguous(x, "x");
  check_ndim(w_down, 2, "w_down");
  check_ndim(a_log, 1, "a_log");
  GateDims gd;
  gd.D = x.dim(-1);
  gd.N = x.ndim() == 2 ? x.dim(0) : x.dim(0) * x.dim(1);
  gd.Dh = w_down.dim(1);
  gd.H = a_log.dim(0);
  QV_CHECK(gd.Dh >= 1, "w_down: expected shape [D, Dh] with Dh >= 1, got {}",
           shape_str(w_down.shape()));
  check_shape(w_down, {gd.D, gd.Dh}, "w_down");
  check_shape(w_up, {gd.Dh, gd.H * gd.Dh}, "w_up");
  check_shape(dt_bias, {gd.H * gd.Dh}, "dt_bias");
  for (auto [t, name] : {std::pair{&w_down, "w_down"}, std::pair{&w_up, "w_up"},
                         std::pair{&a_log, "a_log"}, std::pair{&dt_bias, "dt_bias"}}) {
    check_dtype(*t, x.dtype(), name);
    check_cpu_contiguous(*t, name);
  }
  return gd;
}

Shape gate_output_shape(const Tensor& x, const GateDims& gd) {
  if (x.ndim() == 2) return {x.dim(0), gd.H, gd.Dh};
  return {x.dim(0), x.dim(1), gd.H, gd.Dh};
}

// h = x W_down [N, Dh] and r = h W_up [N, H·Dh].
template <typename T>
void gate_projections(const GateDims& gd, const T* x, const T* wd, const T* wu, std::vector<T>& h,
                      std::vector<T>& r) {
  const int64_t HD = gd.H * gd.Dh;
  h.assign(gd.N * gd.Dh, T(0));
  r.assign(gd.N * HD, T(0));
  if (gd.N == 0) return;
  if (gd.D > 0)
    blas::gemm(false, false, gd.N, gd.Dh, gd.D, T(1), x, gd.D, wd, gd.Dh, T(0), h.data(), gd.Dh);
  if (HD > 0)
    blas::gemm(false, false, gd.N, HD, gd.Dh, T(1), h.data(), gd.Dh, wu, HD, T(0), r.data(), HD);
}

template <typename T>
void gate_forward(const GateDims& gd, const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                  const Tensor& a_log, const Tensor& dt_bias, const Tensor& g) {
  std::vector<T> h, r;
  gate_projections(gd, x.data<T>(), w_down.data<T>(), w_up.data<T>(), h, r);
  const T* alog = a_log.data<T>();
  const T* bias = dt_bias.data<T>();
  T* out = g.data<T>();
  const int64_t HD = gd.H * gd.Dh;
  for (int64_t n = 0; n < gd.N; ++n)
    for (int64_t j = 0; j < HD; ++j)
      out[n * HD + j] = -std::exp(alog[j / gd.Dh]) * softplus(r[n * HD + j] + bias[j]);
}

template <typename T>
void gate_backward(const GateDims& gd, const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                   const Tensor& a_log, const Tensor& dt_bias, const Tensor& dg, const Tensor& dx,
                   const Tensor& dw_down, const Tensor& dw_up, const Tensor& da_log,
                   const Tensor& ddt_bias) {
  const int64_t HD = gd.H * gd.Dh;
  std::vector<T> h, r;
  gate_projections(gd, x.data<T>(), w_down.data<T>(), w_up.data<T>(), h, r);
  const T* alog = a_log.data<T>();
  const T* bias = dt_bias.data<T>();
  const T* dgp = dg.data<T>();
  T* dal = da_log.data<T>();
  T* dbias = ddt_bias.data<T>();
  std::fill(dal, dal + gd.H, T(0));
  std::fill(dbias, dbias + HD, T(0));
  // g = −e^{A} softplus(z): dz = dg · (−e^{A} sigmoid(z)), dA = dg · g. dz overwrites r.
  for (int64_t n = 0; n < gd.N; ++n) {
    for (int64_t j = 0; j < HD; ++j) {
      const T A = std::exp(alog[j / gd.Dh]), z = r[n * HD + j] + bias[j], dgv = dgp[n * HD + j];
      dal[j / gd.Dh] += dgv * (-A * softplus(z));
      const T dz = -dgv * A * sigmoid(z);
      dbias[j] += dz;
      r[n * HD + j] = dz;
    }
  }
  T* dwu = dw_up.data<T>();
  T* dwd = dw_down.data<T>();
  T* dxp = dx.data<T>();
  std::vector<T> dh(gd.N * gd.Dh, T(0));
  if (gd.N == 0 || HD == 0) {
    std::fill(dwu, dwu + gd.Dh * HD, T(0));
  } else {
    blas::gemm(true, false, gd.Dh, HD, gd.N, T(1), h.data(), gd.Dh, r.data(), HD, T(0), dwu, HD);
    blas::gemm(false, true, gd.N, gd.Dh, HD, T(1), r.data(), HD, w_up.data<T>(), HD, T(0),
               dh.data(), gd.Dh);
  }
  if (gd.N == 0 || gd.D == 0) {
    std::fill(dwd, dwd + gd.D * gd.Dh, T(0));
    std::fill(dxp, dxp + gd.N * gd.D, T(0));
  } else {
    blas::gemm(true, false, gd.D, gd.Dh, gd.N, T(1), x.data<T>(), gd.D, dh.data(), gd.Dh, T(0), dwd,
               gd.Dh);
    blas::gemm(false, true, gd.N, gd.D, gd.Dh, T(1), dh.data(), gd.Dh, w_down.data<T>(), gd.Dh,
               T(0), dxp, gd.D);
  }
}

}  // namespace

void linear_relation_recurrent_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                       const Tensor& g, const Tensor& y, double tau_s) {
  Dims dm = check_sequence_inputs(p1, p2, v, g, tau_s);
  check_like(y, p1, "y");
  if (p1.dtype() == DType::F32)
    recurrent_forward<float>(dm, p1, p2, v, g, y, tau_s);
  else
    recurrent_forward<double>(dm, p1, p2, v, g, y, tau_s);
}

void linear_relation_recurrent_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                        const Tensor& g, const Tensor& dy, const Tensor& dp1,
                                        const Tensor& dp2, const Tensor& dv, const Tensor& dg,
                                        double tau_s) {
  Dims dm = check_sequence_inputs(p1, p2, v, g, tau_s);
  check_like(dy, p1, "dy");
  check_like(dp1, p1, "dp1");
  check_like(dp2, p1, "dp2");
  check_like(dv, p1, "dv");
  check_like(dg, p1, "dg");
  if (p1.dtype() == DType::F32)
    recurrent_backward<float>(dm, p1, p2, v, g, dy, dp1, dp2, dv, dg, tau_s);
  else
    recurrent_backward<double>(dm, p1, p2, v, g, dy, dp1, dp2, dv, dg, tau_s);
}

void linear_relation_chunked_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                     const Tensor& g, const Tensor& y, int64_t chunk,
                                     double tau_s) {
  Dims dm = check_sequence_inputs(p1, p2, v, g, tau_s);
  check_chunk(chunk);
  check_like(y, p1, "y");
  if (p1.dtype() == DType::F32)
    chunked_forward<float, float>(dm, p1, p2, v, g, y, chunk, tau_s, nullptr);
  else
    chunked_forward<double, double>(dm, p1, p2, v, g, y, chunk, tau_s, nullptr);
}

void linear_relation_chunked_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                      const Tensor& g, const Tensor& dy, const Tensor& dp1,
                                      const Tensor& dp2, const Tensor& dv, const Tensor& dg,
                                      int64_t chunk, double tau_s) {
  Dims dm = check_sequence_inputs(p1, p2, v, g, tau_s);
  check_chunk(chunk);
  check_like(dy, p1, "dy");
  check_like(dp1, p1, "dp1");
  check_like(dp2, p1, "dp2");
  check_like(dv, p1, "dv");
  check_like(dg, p1, "dg");
  if (p1.dtype() == DType::F32)
    chunked_backward<float>(dm, p1, p2, v, g, dy, dp1, dp2, dv, dg, chunk, tau_s);
  else
    chunked_backward<double>(dm, p1, p2, v, g, dy, dp1, dp2, dv, dg, chunk, tau_s);
}

Tensor linear_relation_prefill(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                               const Tensor& y, DType state_dtype, int64_t chunk, double tau_s) {
  Dims dm = check_sequence_inputs(p1, p2, v, g, tau_s);
  check_chunk(chunk);
  check_like(y, p1, "y");
  QV_CHECK(state_dtype == DType::F32 || state_dtype == p1.dtype(),
           "state: dtype must be F32 or the inputs' dtype {}, got {}", dtype_name(p1.dtype()),
           dtype_name(state_dtype));
  Tensor state = Tensor::empty({dm.B, dm.H, dm.d, dm.d}, state_dtype);
  if (p1.dtype() == DType::F32)
    chunked_forward<float, float>(dm, p1, p2, v, g, y, chunk, tau_s, state.data<float>());
  else if (state_dtype == DType::F32)
    chunked_forward<double, float>(dm, p1, p2, v, g, y, chunk, tau_s, state.data<float>());
  else
    chunked_forward<double, double>(dm, p1, p2, v, g, y, chunk, tau_s, state.data<double>());
  return state;
}

void linear_relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                                 const Tensor& g_row, const Tensor& state, const Tensor& y_row,
                                 double tau_s) {
  check_ndim(p1_row, 3, "p1_row");
  check_float_dtype(p1_row, "p1_row");
  check_cpu_contiguous(p1_row, "p1_row");
  const int64_t B = p1_row.dim(0), H = p1_row.dim(1), d = p1_row.dim(2);
  QV_CHECK(d >= 1, "p1_row: head width Dh must be at least 1, got shape {}",
           shape_str(p1_row.shape()));
  check_like(p2_row, p1_row, "p2_row");
  check_like(v_row, p1_row, "v_row");
  check_like(g_row, p1_row, "g_row");
  check_like(y_row, p1_row, "y_row");
  check_log_decay(g_row, "g_row");
  check_tau(tau_s);
  check_shape(state, {B, H, d, d}, "state");
  check_cpu_contiguous(state, "state");
  QV_CHECK(state.dtype() == DType::F32 || state.dtype() == p1_row.dtype(),
           "state: dtype must be F32 or the rows' dtype {}, got {}", dtype_name(p1_row.dtype()),
           dtype_name(state.dtype()));
  if (p1_row.dtype() == DType::F32)
    decode_step(B * H, d, p1_row.data<float>(), p2_row.data<float>(), v_row.data<float>(),
                g_row.data<float>(), state.data<float>(), y_row.data<float>(), tau_s);
  else if (state.dtype() == DType::F32)
    decode_step(B * H, d, p1_row.data<double>(), p2_row.data<double>(), v_row.data<double>(),
                g_row.data<double>(), state.data<float>(), y_row.data<double>(), tau_s);
  else
    decode_step(B * H, d, p1_row.data<double>(), p2_row.data<double>(), v_row.data<double>(),
                g_row.data<double>(), state.data<double>(), y_row.data<double>(), tau_s);
}

void retention_gate_forward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                            const Tensor& a_log, const Tensor& dt_bias, const Tensor& g) {
  GateDims gd = check_gate_inputs(x, w_down, w_up, a_log, dt_bias);
  check_shape(g, gate_output_shape(x, gd), "g");
  check_dtype(g, x.dtype(), "g");
  check_cpu_contiguous(g, "g");
  if (x.dtype() == DType::F32)
    gate_forward<float>(gd, x, w_down, w_up, a_log, dt_bias, g);
  else
    gate_forward<double>(gd, x, w_down, w_up, a_log, dt_bias, g);
}

void retention_gate_backward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                             const Tensor& a_log, const Tensor& dt_bias, const Tensor& dg,
                             const Tensor& dx, const Tensor& dw_down, const Tensor& dw_up,
                             const Tensor& da_log, const Tensor& ddt_bias) {
  GateDims gd = check_gate_inputs(x, w_down, w_up, a_log, dt_bias);
  check_shape(dg, gate_output_shape(x, gd), "dg");
  check_dtype(dg, x.dtype(), "dg");
  check_cpu_contiguous(dg, "dg");
  check_like(dx, x, "dx");
  check_like(dw_down, w_down, "dw_down");
  check_like(dw_up, w_up, "dw_up");
  check_like(da_log, a_log, "da_log");
  check_like(ddt_bias, dt_bias, "ddt_bias");
  if (x.dtype() == DType::F32)
    gate_backward<float>(gd, x, w_down, w_up, a_log, dt_bias, dg, dx, dw_down, dw_up, da_log,
                         ddt_bias);
  else
    gate_backward<double>(gd, x, w_down, w_up, a_log, dt_bias, dg, dx, dw_down, dw_up, da_log,
                          ddt_bias);
}

}  // namespace quiver::ops
