// Linear Relation (SPEC §2.4) and its retention gate: the recurrence against the unrolled
// formula computed naively here, the chunked form against the recurrence, gradients against
// finite differences, decoding against the full forward, F32 against F64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/linear_relation.h"
#include "quiver/rng.h"
#include "testing.h"

using namespace quiver;
using quiver::testing::dot;
using quiver::testing::finite_difference_error;
using quiver::testing::poisoned;
using quiver::testing::random_tensor;

namespace {

struct Inputs {
  Tensor p1, p2, v, g;
};

// p1, p2, v standard normal; g uniform in [g_lo, g_hi] (<= 0).
Inputs make_inputs(const Shape& shape, DType dtype, Rng& rng, double g_lo = -1.0,
                   double g_hi = 0.0) {
  Inputs in{random_tensor(shape, dtype, rng), random_tensor(shape, dtype, rng),
            random_tensor(shape, dtype, rng), Tensor::empty(shape, dtype)};
  rng.fill_uniform(in.g, g_lo, g_hi);
  return in;
}

Inputs to_dtype(const Inputs& in, DType dtype) {
  return {in.p1.to(dtype), in.p2.to(dtype), in.v.to(dtype), in.g.to(dtype)};
}

struct Grads {
  Tensor dp1, dp2, dv, dg;
};

Grads poisoned_grads(const Tensor& like) {
  return {poisoned(like.shape(), like.dtype()), poisoned(like.shape(), like.dtype()),
          poisoned(like.shape(), like.dtype()), poisoned(like.shape(), like.dtype())};
}

// chunk <= 0 selects the recurrence.
Tensor forward(const Inputs& in, int64_t chunk, double tau = 2.0) {
  Tensor y = poisoned(in.p1.shape(), in.p1.dtype());
  if (chunk <= 0)
    ops::linear_relation_recurrent_forward(in.p1, in.p2, in.v, in.g, y, tau);
  else
    ops::linear_relation_chunked_forward(in.p1, in.p2, in.v, in.g, y, chunk, tau);
  return y;
}

Grads backward(const Inputs& in, const Tensor& dy, int64_t chunk, double tau = 2.0) {
  Grads gr = poisoned_grads(in.p1);
  if (chunk <= 0)
    ops::linear_relation_recurrent_backward(in.p1, in.p2, in.v, in.g, dy, gr.dp1, gr.dp2, gr.dv,
                                            gr.dg, tau);
  else
    ops::linear_relation_chunked_backward(in.p1, in.p2, in.v, in.g, dy, gr.dp1, gr.dp2, gr.dv,
                                          gr.dg, chunk, tau);
  return gr;
}

// E = y − v in F64: forward comparisons use it so that the pass-through v cannot hide errors.
Tensor mixing(const Tensor& y, const Tensor& v) {
  Tensor e = y.to(DType::F64), vv = v.to(DType::F64);
  double* pe = e.data<double>();
  const double* pv = vv.data<double>();
  for (int64_t i = 0; i < e.numel(); ++i) pe[i] -= pv[i];
  return e;
}

bool all_finite(const Tensor& t) {
  Tensor a = t.to(DType::F64);
  const double* p = a.data<double>();
  for (int64_t i = 0; i < a.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

// The unrolled formula of SPEC §2.4, written independently of the op:
//   y_t = v_t + S_t Σ_{j<t} S_j Σ_r p̂1_t[r] (Π_{u=j+1..t} α_u[r]) p̂2_j[r] v_j.
// Inputs are [B, T, H, Dh]; computed in double.
Tensor unrolled_reference(const Inputs& in, double tau) {
  const int64_t B = in.p1.dim(0), T = in.p1.dim(1), H = in.p1.dim(2), d = in.p1.dim(3);
  Tensor y = Tensor::empty(in.p1.shape(), DType::F64);
  auto normalized = [&](const Tensor& p, int64_t b, int64_t t, int64_t h) {
    std::vector<double> out(d);
    double n = 0;
    for (int64_t i = 0; i < d; ++i) n += p.at({b, t, h, i}) * p.at({b, t, h, i});
    n = std::max(std::sqrt(n), ops::kLinearRelationNormEps);
    for (int64_t i = 0; i < d; ++i) out[i] = p.at({b, t, h, i}) / n;
    return out;
  };
  auto gate = [&](int64_t b, int64_t t, int64_t h) {
    double u = 0;
    for (int64_t i = 0; i < d; ++i) u += in.p1.at({b, t, h, i}) * in.p2.at({b, t, h, i});
    return 1.0 / (1.0 + std::exp(-u / (tau * std::sqrt(static_cast<double>(d)))));
  };
  double* out = y.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> q = normalized(in.p1, b, t, h), e(d, 0.0), decay(d, 1.0);
        for (int64_t j = t - 1; j >= 0; --j) {
          for (int64_t r = 0; r < d; ++r) decay[r] *= std::exp(in.g.at({b, j + 1, h, r}));
          std::vector<double> k = normalized(in.p2, b, j, h);
          double a = 0;
          for (int64_t r = 0; r < d; ++r) a += q[r] * decay[r] * k[r];
          a *= gate(b, j, h);
          for (int64_t c = 0; c < d; ++c) e[c] += a * in.v.at({b, j, h, c});
        }
        double S = gate(b, t, h);
        for (int64_t c = 0; c < d; ++c)
          out[((b * T + t) * H + h) * d + c] = in.v.at({b, t, h, c}) + S * e[c];
      }
  return y;
}

double max_grad_error(const Grads& a, const Grads& b) {
  return std::max({rel_error(a.dp1, b.dp1), rel_error(a.dp2, b.dp2), rel_error(a.dv, b.dv),
                   rel_error(a.dg, b.dg)});
}

}  // namespace

TEST(LinearRelation, RecurrentMatchesUnrolledFormula) {
  Rng rng(11);
  for (double tau : {2.0, 0.7}) {
    Inputs in = make_inputs({2, 23, 3, 5}, DType::F64, rng);
    Tensor ref = mixing(unrolled_reference(in, tau), in.v);
    EXPECT_LT(rel_error(mixing(forward(in, 0, tau), in.v), ref), 1e-13) << "tau " << tau;
    EXPECT_LT(rel_error(mixing(forward(in, 16, tau), in.v), ref), 1e-13) << "tau " << tau;
  }
}

TEST(LinearRelation, ChunkedMatchesRecurrentForwardAndBackward) {
  Rng rng(12);
  // T = 77 is no multiple of any chunk; 64 and 100 exercise the sub-blocks inside a chunk.
  Inputs in = make_inputs({2, 77, 2, 7}, DType::F64, rng);
  Tensor dy = random_tensor(in.p1.shape(), DType::F64, rng);
  Tensor e_ref = mixing(forward(in, 0), in.v);
  Grads g_ref = backward(in, dy, 0);
  for (int64_t chunk : {1, 5, 16, 17, 64, 100}) {
    EXPECT_LT(rel_error(mixing(forward(in, chunk), in.v), e_ref), 1e-12) << "chunk " << chunk;
    Grads gr = backward(in, dy, chunk);
    EXPECT_LT(rel_error(gr.dp1, g_ref.dp1), 1e-10) << "dp1, chunk " << chunk;
    EXPECT_LT(rel_error(gr.dp2, g_ref.dp2), 1e-10) << "dp2, chunk " << chunk;
    EXPECT_LT(rel_error(gr.dv, g_ref.dv), 1e-10) << "dv, chunk " << chunk;
    EXPECT_LT(rel_error(gr.dg, g_ref.dg), 1e-10) << "dg, chunk " << chunk;
  }
}

TEST(LinearRelation, ThreeDimensionalInputIsOneBatch) {
  Rng rng(13);
  Inputs in = make_inputs({1, 19, 3, 4}, DType::F64, rng);
  Inputs flat{in.p1.reshape({19, 3, 4}), in.p2.reshape({19, 3, 4}), in.v.reshape({19, 3, 4}),
              in.g.reshape({19, 3, 4})};
  Tensor dy = random_tensor({19, 3, 4}, DType::F64, rng);
  for (int64_t chunk : {0, 8}) {
    EXPECT_EQ(rel_error(forward(flat, chunk).reshape({1, 19, 3, 4}), forward(in, chunk)), 0.0);
    Grads a = backward(flat, dy, chunk), b = backward(in, dy.reshape({1, 19, 3, 4}), chunk);
    Grads a4{a.dp1.reshape({1, 19, 3, 4}), a.dp2.reshape({1, 19, 3, 4}),
             a.dv.reshape({1, 19, 3, 4}), a.dg.reshape({1, 19, 3, 4})};
    EXPECT_EQ(max_grad_error(a4, b), 0.0);
  }
}

TEST(LinearRelation, RecurrentGradientsMatchFiniteDifferences) {
  Rng rng(14);
  // g away from 0 so that ±eps keeps it a valid log-decay.
  Inputs in = make_inputs({1, 9, 2, 4}, DType::F64, rng, -1.0, -0.05);
  Tensor w = random_tensor(in.p1.shape(), DType::F64, rng);
  Grads gr = backward(in, w, 0);
  auto loss = [&] { return dot(forward(in, 0), w); };
  EXPECT_LT(finite_difference_error(loss, in.p1, gr.dp1), 1e-7);
  EXPECT_LT(finite_difference_error(loss, in.p2, gr.dp2), 1e-7);
  EXPECT_LT(finite_difference_error(loss, in.v, gr.dv), 1e-7);
  EXPECT_LT(finite_difference_error(loss, in.g, gr.dg), 1e-7);
}

TEST(LinearRelation, ChunkedGradientsMatchFiniteDifferences) {
  Rng rng(15);
  Inputs in = make_inputs({1, 40, 1, 3}, DType::F64, rng, -1.0, -0.05);
  Tensor w = random_tensor(in.p1.shape(), DType::F64, rng);
  Grads gr = backward(in, w, 32);
  auto loss = [&] { return dot(forward(in, 32), w); };
  EXPECT_LT(finite_difference_error(loss, in.p1, gr.dp1), 1e-7);
  EXPECT_LT(finite_difference_error(loss, in.p2, gr.dp2), 1e-7);
  EXPECT_LT(finite_difference_error(loss, in.v, gr.dv), 1e-7);
  EXPECT_LT(finite_difference_error(loss, in.g, gr.dg), 1e-7);
}

TEST(LinearRelation, FirstTokenHasNoHistoryAndNoDecayIsHandled) {
  Rng rng(16);
  Inputs in = make_inputs({2, 30, 2, 6}, DType::F64, rng);
  in.g.fill(0.0);  // α = 1: a plain (ungated) causal linear attention
  Tensor ref = mixing(unrolled_reference(in, 2.0), in.v);
  for (int64_t chunk : {0, 1, 7, 64}) {
    Tensor y = forward(in, chunk);
    EXPECT_LT(rel_error(mixing(y, in.v), ref), 1e-13) << "chunk " << chunk;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t c = 0; c < 6; ++c)
          EXPECT_EQ(y.at({b, 0, h, c}), in.v.at({b, 0, h, c})) << "chunk " << chunk;
  }
  Tensor dy = random_tensor(in.p1.shape(), DType::F64, rng);
  EXPECT_LT(max_grad_error(backward(in, dy, 7), backward(in, dy, 0)), 1e-11);
  // The first token has no history: nothing of E_0 depends on p1_0.
  Tensor dy0 = Tensor::zeros(in.p1.shape(), DType::F64);
  for (int64_t c = 0; c < 6; ++c) dy0.data<double>()[c] = 1.0;
  Grads g0 = backward(in, dy0, 0);
  EXPECT_EQ(norm2(g0.dp1), 0.0);
  EXPECT_EQ(norm2(g0.dg), 0.0);
}

TEST(LinearRelation, ZeroProjectionStaysFinite) {
  Rng rng(17);
  Inputs in = make_inputs({1, 12, 1, 4}, DType::F64, rng);
  for (int64_t i = 0; i < 4; ++i) {
    in.p1.data<double>()[5 * 4 + i] = 0.0;
    in.p2.data<double>()[3 * 4 + i] = 0.0;
  }
  Tensor ref = mixing(unrolled_reference(in, 2.0), in.v);
  Tensor dy = random_tensor(in.p1.shape(), DType::F64, rng);
  for (int64_t chunk : {0, 4}) {
    EXPECT_LT(rel_error(mixing(forward(in, chunk), in.v), ref), 1e-13);
    Grads gr = backward(in, dy, chunk);
    EXPECT_TRUE(all_finite(gr.dp1) && all_finite(gr.dp2) && all_finite(gr.dv) && all_finite(gr.dg));
  }
}

TEST(LinearRelation, LongSequenceWithStrongDecayStaysFinite) {
  Rng rng(18);
  const Shape shape{1, 16384, 1, 8};
  Inputs strong = make_inputs(shape, DType::F64, rng);
  strong.g.fill(-5.0);
  Inputs mixed = make_inputs(shape, DType::F64, rng);
  {
    // Runs of g = −5, of g = 0 and of mild decay, so the state both collapses and grows.
    double* g = mixed.g.data<double>();
    for (int64_t t = 0; t < 16384; ++t)
      for (int64_t r = 0; r < 8; ++r) {
        int64_t regime = (t / 300 + r) % 3;
        g[t * 8 + r] = regime == 0 ? -5.0 : regime == 1 ? 0.0 : -0.01 * rng.uniform();
      }
  }
  for (const Inputs* in : {&strong, &mixed}) {
    Tensor dy = random_tensor(shape, DType::F64, rng);
    Tensor y_rec = forward(*in, 0), y_chk = forward(*in, 64);
    Grads g_rec = backward(*in, dy, 0), g_chk = backward(*in, dy, 64);
    EXPECT_TRUE(all_finite(y_rec) && all_finite(y_chk));
    EXPECT_TRUE(all_finite(g_chk.dp1) && all_finite(g_chk.dp2) && all_finite(g_chk.dv) &&
                all_finite(g_chk.dg));
    EXPECT_LT(rel_error(mixing(y_chk, in->v), mixing(y_rec, in->v)), 1e-12);
    EXPECT_LT(max_grad_error(g_chk, g_rec), 1e-10);
    // F32 keeps the strong decay finite too.
    Inputs in32 = to_dtype(*in, DType::F32);
    Tensor dy32 = dy.to(DType::F32);
    Grads g32 = backward(in32, dy32, 64);
    EXPECT_TRUE(all_finite(forward(in32, 64)) && all_finite(g32.dp1) && all_finite(g32.dg));
  }
}

TEST(LinearRelation, DecodeAfterPrefillReproducesForward) {
  Rng rng(19);
  const int64_t B = 2, T = 41, H = 3, d = 6, prefix = 17;
  Inputs in = make_inputs({B, T, H, d}, DType::F64, rng);
  Tensor full = forward(in, 0);
  Inputs head{in.p1.slice(1, 0, prefix).clone(), in.p2.slice(1, 0, prefix).clone(),
              in.v.slice(1, 0, prefix).clone(), in.g.slice(1, 0, prefix).clone()};
  for (DType state_dtype : {DType::F64, DType::F32}) {
    // Rounding the state to F32 each step costs about F32 epsilon, relative.
    const double tol = state_dtype == DType::F64 ? 1e-13 : 1e-6;
    Tensor y_head = poisoned(head.p1.shape(), DType::F64);
    Tensor state =
        ops::linear_relation_prefill(head.p1, head.p2, head.v, head.g, y_head, state_dtype, 8);
    EXPECT_LT(rel_error(mixing(y_head, head.v), mixing(full.slice(1, 0, prefix), head.v)), 1e-13);
    for (int64_t t = prefix; t < T; ++t) {
      auto row = [&](const Tensor& x) { return x.slice(1, t, t + 1).clone().reshape({B, H, d}); };
      Tensor y_row = poisoned({B, H, d}, DType::F64);
      ops::linear_relation_decode_step(row(in.p1), row(in.p2), row(in.v), row(in.g), state, y_row);
      EXPECT_LT(rel_error(mixing(y_row, row(in.v)), mixing(row(full), row(in.v))), tol)
          << "position " << t;
    }
  }
  // F32 rows with the F32 state: the same within F32 rounding (the prefill sums in chunks).
  {
    Inputs in32 = to_dtype(in, DType::F32);
    Tensor full32 = forward(in32, 0);
    Inputs head32 = to_dtype(head, DType::F32);
    Tensor y_head = poisoned(head32.p1.shape(), DType::F32);
    Tensor state = ops::linear_relation_prefill(head32.p1, head32.p2, head32.v, head32.g, y_head);
    for (int64_t t = prefix; t < T; ++t) {
      auto row = [&](const Tensor& x) { return x.slice(1, t, t + 1).clone().reshape({B, H, d}); };
      Tensor y_row = poisoned({B, H, d}, DType::F32);
      ops::linear_relation_decode_step(row(in32.p1), row(in32.p2), row(in32.v), row(in32.g), state,
                                       y_row);
      EXPECT_LT(rel_error(mixing(y_row, row(in32.v)), mixing(row(full32), row(in32.v))), 1e-5)
          << "position " << t;
    }
  }
  // Decoding from an empty state is the whole forward, token by token.
  Tensor state = Tensor::zeros({B, H, d, d}, DType::F64);
  for (int64_t t = 0; t < T; ++t) {
    auto row = [&](const Tensor& x) { return x.slice(1, t, t + 1).clone().reshape({B, H, d}); };
    Tensor y_row = poisoned({B, H, d}, DType::F64);
    ops::linear_relation_decode_step(row(in.p1), row(in.p2), row(in.v), row(in.g), state, y_row);
    EXPECT_LT(rel_error(mixing(y_row, row(in.v)), mixing(row(full), row(in.v))), 1e-13)
        << "position " << t;
  }
}

TEST(LinearRelation, Float32AgreesWithFloat64) {
  Rng rng(20);
  const Shape shape{2, 150, 2, 16};
  Inputs in64 = make_inputs(shape, DType::F64, rng);
  // The F64 reference runs on the F32-rounded inputs, so only arithmetic error remains.
  Inputs in32 = to_dtype(in64, DType::F32);
  Inputs ref_in = to_dtype(in32, DType::F64);
  Tensor dy32 = random_tensor(shape, DType::F32, rng);
  Tensor dy64 = dy32.to(DType::F64);
  Tensor e_ref = mixing(forward(ref_in, 0), ref_in.v);
  Grads g_ref = backward(ref_in, dy64, 0);
  // Rounding error grows like eps·sqrt(ops per output): a few hundred F32 ulps for sums over
  // ~T·Dh terms, more for gradients that cancel (dg).
  const double eps32 = std::numeric_limits<float>::epsilon();
  for (int64_t chunk : {0, 64}) {
    EXPECT_LT(rel_error(mixing(forward(in32, chunk), ref_in.v), e_ref), 50 * eps32)
        << "chunk " << chunk;
    Grads gr = backward(in32, dy32, chunk);
    EXPECT_LT(rel_error(gr.dp1, g_ref.dp1), 500 * eps32) << "chunk " << chunk;
    EXPECT_LT(rel_error(gr.dp2, g_ref.dp2), 500 * eps32) << "chunk " << chunk;
    EXPECT_LT(rel_error(gr.dv, g_ref.dv), 500 * eps32) << "chunk " << chunk;
    EXPECT_LT(rel_error(gr.dg, g_ref.dg), 500 * eps32) << "chunk " << chunk;
  }
}

TEST(LinearRelation, RejectsBadInputs) {
  Rng rng(21);
  Inputs in = make_inputs({1, 6, 2, 4}, DType::F64, rng);
  Tensor y = Tensor::empty(in.p1.shape(), DType::F64);
  auto message = [](const auto& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor short_p2 = random_tensor({1, 5, 2, 4}, DType::F64, rng);
  std::string m =
      message([&] { ops::linear_relation_recurrent_forward(in.p1, short_p2, in.v, in.g, y); });
  EXPECT_NE(m.find("p2"), std::string::npos) << m;
  EXPECT_NE(m.find("[1, 6, 2, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[1, 5, 2, 4]"), std::string::npos) << m;

  Tensor g_pos = in.g.clone();
  g_pos.data<double>()[13] = 0.25;
  m = message([&] { ops::linear_relation_chunked_forward(in.p1, in.p2, in.v, g_pos, y); });
  EXPECT_NE(m.find("g:"), std::string::npos) << m;
  EXPECT_NE(m.find("0.25"), std::string::npos) << m;

  m = message(
      [&] { ops::linear_relation_recurrent_forward(in.p1, in.p2, in.v.to(DType::F32), in.g, y); });
  EXPECT_NE(m.find("v:"), std::string::npos) << m;

  Tensor flat = random_tensor({6, 8}, DType::F64, rng);
  m = message([&] { ops::linear_relation_recurrent_forward(flat, flat, flat, flat, flat); });
  EXPECT_NE(m.find("p1"), std::string::npos) << m;

  m = message([&] { ops::linear_relation_chunked_forward(in.p1, in.p2, in.v, in.g, y, 0); });
  EXPECT_NE(m.find("chunk"), std::string::npos) << m;

  Tensor dp = Tensor::empty({1, 6, 2, 3}, DType::F64);
  m = message(
      [&] { ops::linear_relation_recurrent_backward(in.p1, in.p2, in.v, in.g, y, y, y, y, dp); });
  EXPECT_NE(m.find("dg"), std::string::npos) << m;

  Tensor rows = random_tensor({1, 2, 4}, DType::F64, rng);
  Tensor g_rows = Tensor::zeros({1, 2, 4}, DType::F64);
  Tensor bad_state = Tensor::zeros({1, 2, 4, 3}, DType::F64);
  m = message(
      [&] { ops::linear_relation_decode_step(rows, rows, rows, g_rows, bad_state, rows.clone()); });
  EXPECT_NE(m.find("state"), std::string::npos) << m;
}

// ---------------------------------------------------------------------------------------------
// Retention gate

namespace {

struct GateParams {
  Tensor x, w_down, w_up, a_log, dt_bias;
};

GateParams make_gate(int64_t B, int64_t T, int64_t D, int64_t H, int64_t Dh, Rng& rng) {
  GateParams p{random_tensor({B, T, D}, DType::F64, rng),
               random_tensor({D, Dh}, DType::F64, rng, 0.5),
               random_tensor({Dh, H * Dh}, DType::F64, rng, 0.5),
               random_tensor({H}, DType::F64, rng, 0.5), random_tensor({H * Dh}, DType::F64, rng)};
  return p;
}

Tensor gate_forward(const GateParams& p) {
  const int64_t H = p.a_log.dim(0), Dh = p.w_down.dim(1);
  Tensor g = poisoned({p.x.dim(0), p.x.dim(1), H, Dh}, p.x.dtype());
  ops::retention_gate_forward(p.x, p.w_down, p.w_up, p.a_log, p.dt_bias, g);
  return g;
}

// The gate computed naively: r = x̄ W_down W_up one entry at a time, and softplus in
// long double from its definition (|z| stays small here).
Tensor gate_reference(const GateParams& p) {
  const int64_t B = p.x.dim(0), T = p.x.dim(1), D = p.x.dim(2), H = p.a_log.dim(0),
                Dh = p.w_down.dim(1);
  Tensor g = Tensor::empty({B, T, H, Dh}, DType::F64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Dh; ++i) {
          long double r = 0;
          for (int64_t k = 0; k < Dh; ++k) {
            long double low = 0;
            for (int64_t m = 0; m < D; ++m) low += p.x.at({b, t, m}) * p.w_down.at({m, k});
            r += low * p.w_up.at({k, h * Dh + i});
          }
          long double z = r + p.dt_bias.at({h * Dh + i});
          g.data<double>()[((b * T + t) * H + h) * Dh + i] = static_cast<double>(
              -std::exp(static_cast<long double>(p.a_log.at({h}))) * std::log(1.0L + std::exp(z)));
        }
  return g;
}

}  // namespace

TEST(RetentionGate, ForwardMatchesDirectFormula) {
  Rng rng(31);
  GateParams p = make_gate(2, 5, 7, 3, 4, rng);
  EXPECT_LT(rel_error(gate_forward(p), gate_reference(p)), 1e-14);
  // A 2-d x̄ is one sequence.
  Tensor g2 = poisoned({5, 3, 4}, DType::F64);
  Tensor x2 = p.x.slice(0, 0, 1).clone().reshape({5, 7});
  ops::retention_gate_forward(x2, p.w_down, p.w_up, p.a_log, p.dt_bias, g2);
  EXPECT_EQ(rel_error(g2, gate_forward(p).slice(0, 0, 1).clone().reshape({5, 3, 4})), 0.0);
}

TEST(RetentionGate, GradientsMatchFiniteDifferences) {
  Rng rng(32);
  GateParams p = make_gate(2, 3, 5, 2, 3, rng);
  Tensor w = random_tensor({2, 3, 2, 3}, DType::F64, rng);
  Tensor dx = poisoned(p.x.shape(), DType::F64), dwd = poisoned(p.w_down.shape(), DType::F64);
  Tensor dwu = poisoned(p.w_up.shape(), DType::F64), dal = poisoned(p.a_log.shape(), DType::F64);
  Tensor dbias = poisoned(p.dt_bias.shape(), DType::F64);
  ops::retention_gate_backward(p.x, p.w_down, p.w_up, p.a_log, p.dt_bias, w, dx, dwd, dwu, dal,
                               dbias);
  auto loss = [&] { return dot(gate_forward(p), w); };
  EXPECT_LT(finite_difference_error(loss, p.x, dx), 1e-8);
  EXPECT_LT(finite_difference_error(loss, p.w_down, dwd), 1e-8);
  EXPECT_LT(finite_difference_error(loss, p.w_up, dwu), 1e-8);
  EXPECT_LT(finite_difference_error(loss, p.a_log, dal), 1e-8);
  EXPECT_LT(finite_difference_error(loss, p.dt_bias, dbias), 1e-8);
}

TEST(RetentionGate, SoftplusIsStableForLargeInputs) {
  Rng rng(33);
  GateParams p = make_gate(1, 2, 3, 2, 2, rng);
  p.x.fill(0.0);  // r = 0, so z = dt_bias exactly
  const double z[] = {800.0, -800.0, 40.0, -40.0};
  for (int i = 0; i < 4; ++i) p.dt_bias.data<double>()[i] = z[i];
  Tensor g = gate_forward(p);
  Tensor w = Tensor::empty(g.shape(), DType::F64);
  w.fill(1.0);
  Tensor dx = poisoned(p.x.shape(), DType::F64), dwd = poisoned(p.w_down.shape(), DType::F64);
  Tensor dwu = poisoned(p.w_up.shape(), DType::F64), dal = poisoned(p.a_log.shape(), DType::F64);
  Tensor dbias = poisoned(p.dt_bias.shape(), DType::F64);
  ops::retention_gate_backward(p.x, p.w_down, p.w_up, p.a_log, p.dt_bias, w, dx, dwd, dwu, dal,
                               dbias);
  for (int i = 0; i < 4; ++i) {
    // softplus(z) → z for large z and → e^z for very negative z.
    double A = std::exp(p.a_log.data<double>()[i / 2]);
    double expect = z[i] > 0 ? z[i] + std::exp(-z[i]) : std::exp(z[i]);
    for (int64_t t = 0; t < 2; ++t) {
      double got = g.data<double>()[t * 4 + i];
      EXPECT_TRUE(std::isfinite(got));
      EXPECT_LE(std::abs(got + A * expect), 1e-15 * A * expect + 1e-300) << "z " << z[i];
    }
    // dg/ddt_bias = −A sigmoid(z), summed over the two tokens.
    double sig = z[i] > 0 ? 1.0 / (1.0 + std::exp(-z[i])) : std::exp(z[i]) / (1.0 + std::exp(z[i]));
    EXPECT_NEAR(dbias.data<double>()[i], -2 * A * sig, 1e-14 * A);
  }
  EXPECT_TRUE(all_finite(dx) && all_finite(dwd) && all_finite(dwu) && all_finite(dal));
}

TEST(RetentionGate, RejectsBadShapes) {
  Rng rng(34);
  GateParams p = make_gate(1, 4, 5, 2, 3, rng);
  Tensor g = Tensor::empty({1, 4, 2, 3}, DType::F64);
  Tensor bad_up = random_tensor({3, 5}, DType::F64, rng);
  try {
    ops::retention_gate_forward(p.x, p.w_down, bad_up, p.a_log, p.dt_bias, g);
    FAIL() << "no error for a bad w_up";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("w_up"), std::string::npos) << m;
    EXPECT_NE(m.find("[3, 6]"), std::string::npos) << m;
  }
  Tensor bad_g = Tensor::empty({1, 4, 6}, DType::F64);
  EXPECT_THROW(ops::retention_gate_forward(p.x, p.w_down, p.w_up, p.a_log, p.dt_bias, bad_g),
               Error);
  EXPECT_THROW(
      ops::retention_gate_forward(p.x, p.w_down.to(DType::F32), p.w_up, p.a_log, p.dt_bias, g),
      Error);
}
