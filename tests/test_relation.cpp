// Self–Exchange Relation on the CPU: FlashRelation against the materialized reference,
// finite differences on the reference, the Self/Exchange factorization, the first-token
// boundary, the exchange-only ablation, Relation Cache decoding, precision and shape checks.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "ops/relation.h"
#include "testing.h"

using namespace quiver;
using quiver::testing::poisoned;
using quiver::testing::random_tensor;

namespace {

struct RelInputs {
  Tensor p1, p2, v;
};

RelInputs random_inputs(const Shape& shape, DType dtype, Rng& rng, double stddev = 1.0) {
  return {random_tensor(shape, dtype, rng, stddev), random_tensor(shape, dtype, rng, stddev),
          random_tensor(shape, dtype, rng)};
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// S_p and A_p of head h of 3-d inputs, computed directly from SPEC §2.1 (no shared code).
struct SelfExchange {
  double self, a, lse;
};

SelfExchange self_exchange(const Tensor& p1, const Tensor& p2, int64_t h, int64_t p,
                           double lambda, double tau) {
  const int64_t Dh = p1.dim(2);
  auto u = [&](int64_t i, int64_t j) {
    double s = 0;
    for (int64_t c = 0; c < Dh; ++c) s += p1.at({i, h, c}) * p2.at({j, h, c});
    return s / std::sqrt(double(Dh));
  };
  SelfExchange out{sigmoid(u(p, p) / tau), 0, 0};
  double sum = 0;
  for (int64_t j = 0; j < p; ++j) {
    double x = u(p, j);
    sum += std::exp(x * sigmoid(x));
  }
  out.lse = std::log(sum);
  out.a = out.lse - lambda * std::log(double(p + 1));
  return out;
}

void expect_error_naming(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Row t of a [B, T, H, Dh] tensor as a contiguous [B, H, Dh] copy.
Tensor step_rows(const Tensor& x, int64_t t) {
  return x.slice(1, t, t + 1).clone().reshape({x.dim(0), x.dim(2), x.dim(3)});
}

}  // namespace

TEST(FlashRelation, MatchesReferenceAtPaperHeadWidths) {
  struct Case {
    int64_t B, T, H, Dh, tile;  // B = 0: 3-d inputs
  };
  const Case cases[] = {
      {0, 45, 2, 24, 16}, {2, 37, 2, 48, 8}, {0, 70, 1, 60, 64},
      {0, 50, 2, 64, 16}, {1, 29, 2, 80, 7}, {0, 1, 2, 24, 64},
  };
  Rng rng(42);
  for (const Case& c : cases) {
    for (bool exchange_only : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H
                                        << " Dh=" << c.Dh << " tile=" << c.tile
                                        << " exchange_only=" << exchange_only);
      const Shape shape = c.B == 0 ? Shape{c.T, c.H, c.Dh} : Shape{c.B, c.T, c.H, c.Dh};
      const DType dt = DType::F64;
      // p1, p2 of norm ~ sqrt(Dh)·1.5 so that U spans the nonlinear range of SiLU.
      RelInputs in = random_inputs(shape, dt, rng, 1.5);
      Tensor dy = random_tensor(shape, dt, rng);
      const double lambda = 0.37;
      ops::RelationOptions opt;
      opt.exchange_only = exchange_only;
      opt.tile = c.tile;

      Tensor y_ref;
      ops::relation_reference_forward(in.p1, in.p2, in.v, lambda, y_ref, opt);
      Tensor y = poisoned(shape, dt), stats;
      ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y, stats, opt);
      EXPECT_LE(rel_error(y, y_ref), 1e-10);

      Tensor dp1_ref, dp2_ref, dv_ref;
      const double dl_ref = ops::relation_reference_backward(in.p1, in.p2, in.v, lambda, dy,
                                                             dp1_ref, dp2_ref, dv_ref, opt);
      Tensor dp1 = poisoned(shape, dt), dp2 = poisoned(shape, dt), dv = poisoned(shape, dt);
      const double dl = ops::flash_relation_backward(in.p1, in.p2, in.v, lambda, y, stats, dy, dp1,
                                                     dp2, dv, opt);
      EXPECT_LE(rel_error(dp1, dp1_ref), 1e-10);
      EXPECT_LE(rel_error(dp2, dp2_ref), 1e-10);
      EXPECT_LE(rel_error(dv, dv_ref), 1e-10);
      EXPECT_LE(std::fabs(dl - dl_ref), 1e-10 * std::max(1.0, std::fabs(dl_ref)));
    }
  }
}

TEST(Relation, ReferenceFiniteDifferenceGradients) {
  for (bool exchange_only : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "exchange_only=" << exchange_only);
    Rng rng(7);
    const Shape shape{9, 2, 6};
    RelInputs in = random_inputs(shape, DType::F64, rng, 1.5);
    Tensor w = random_tensor(shape, DType::F64, rng);
    double lambda = 0.6;
    ops::RelationOptions opt;
    opt.exchange_only = exchange_only;
    auto loss = [&] {
      Tensor y;
      ops::relation_reference_forward(in.p1, in.p2, in.v, lambda, y, opt);
      return quiver::testing::dot(y, w);
    };
    Tensor dp1, dp2, dv;
    const double dl = ops::relation_reference_backward(in.p1, in.p2, in.v, lambda, w, dp1, dp2, dv,
                                                       opt);
    EXPECT_LE(quiver::testing::finite_difference_error(loss, in.p1, dp1), 1e-7);
    EXPECT_LE(quiver::testing::finite_difference_error(loss, in.p2, dp2), 1e-7);
    EXPECT_LE(quiver::testing::finite_difference_error(loss, in.v, dv), 1e-7);
    const double eps = 1e-6, saved = lambda;
    lambda = saved + eps;
    const double up = loss();
    lambda = saved - eps;
    const double down = loss();
    lambda = saved;
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(dl, fd, 1e-7 * std::max(1.0, std::fabs(fd)));
    EXPECT_GT(std::fabs(fd), 1e-3);  // λ really matters here
  }
}

TEST(Relation, FlashFiniteDifferenceGradientsBatched) {
  Rng rng(9);
  const Shape shape{2, 11, 2, 4};
  RelInputs in = random_inputs(shape, DType::F64, rng, 1.5);
  Tensor w = random_tensor(shape, DType::F64, rng);
  double lambda = -0.3;
  ops::RelationOptions opt;
  opt.tile = 4;
  opt.tau_s = 1.3;
  auto loss = [&] {
    Tensor y, stats;
    ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y, stats, opt);
    return quiver::testing::dot(y, w);
  };
  Tensor y, stats, dp1, dp2, dv;
  ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y, stats, opt);
  const double dl = ops::flash_relation_backward(in.p1, in.p2, in.v, lambda, y, stats, w, dp1, dp2,
                                                 dv, opt);
  EXPECT_LE(quiver::testing::finite_difference_error(loss, in.p1, dp1), 1e-7);
  EXPECT_LE(quiver::testing::finite_difference_error(loss, in.p2, dp2), 1e-7);
  EXPECT_LE(quiver::testing::finite_difference_error(loss, in.v, dv), 1e-7);
  const double eps = 1e-6, saved = lambda;
  lambda = saved + eps;
  const double up = loss();
  lambda = saved - eps;
  const double down = loss();
  lambda = saved;
  EXPECT_NEAR(dl, (up - down) / (2 * eps), 1e-7 * std::max(1.0, std::fabs(dl)));
}

TEST(Relation, FlowFactorizesIntoSelfAndExchange) {
  Rng rng(13);
  const int64_t T = 12, H = 2, Dh = 8;
  RelInputs in = random_inputs({T, H, Dh}, DType::F64, rng, 1.5);
  const double lambda = 0.5, tau = 2.0;
  Tensor F = ops::relation_reference_flow(in.p1, in.p2, lambda);
  ASSERT_EQ(F.shape(), (Shape{H, T, T}));
  Tensor y, stats;
  ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y, stats);
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_DOUBLE_EQ(F.at({h, 0, 0}), 1.0);
    for (int64_t p = 1; p < T; ++p) {
      SelfExchange se = self_exchange(in.p1, in.p2, h, p, lambda, tau);
      const double f_self = F.at({h, p, p});
      EXPECT_NEAR(f_self, sigmoid(se.self - se.a), 1e-13);  // F_pp = σ(S_p − A_p)
      double hist = 0, row = 0;
      for (int64_t j = 0; j < T; ++j) {
        row += F.at({h, p, j});
        if (j < p) hist += F.at({h, p, j});
        if (j > p) EXPECT_EQ(F.at({h, p, j}), 0.0);
      }
      EXPECT_NEAR(row, 1.0, 1e-13);
      EXPECT_NEAR(hist, sigmoid(se.a - se.self), 1e-13);  // g_p = σ(A_p − S_p)
      EXPECT_NEAR(stats.at({h, p, ops::kRelationGate}), hist, 1e-13);
      EXPECT_NEAR(stats.at({h, p, ops::kRelationSelf}), se.self, 1e-13);
      EXPECT_NEAR(stats.at({h, p, ops::kRelationLogExchange}), se.lse, 1e-12);
    }
  }
}

TEST(Relation, FirstTokenKeepsItsOwnInformation) {
  Rng rng(17);
  const int64_t T = 5, H = 3, Dh = 4;
  RelInputs in = random_inputs({T, H, Dh}, DType::F64, rng);
  for (bool exchange_only : {false, true}) {
    ops::RelationOptions opt;
    opt.exchange_only = exchange_only;
    for (double lambda : {0.0, 0.5, 3.0}) {
      Tensor y, stats, y_ref;
      ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y, stats, opt);
      ops::relation_reference_forward(in.p1, in.p2, in.v, lambda, y_ref, opt);
      for (int64_t h = 0; h < H; ++h) {
        EXPECT_EQ(stats.at({h, 0, ops::kRelationGate}), 0.0);
        EXPECT_TRUE(std::isinf(stats.at({h, 0, ops::kRelationLogExchange})));
        for (int64_t c = 0; c < Dh; ++c) {
          const double expect = exchange_only ? 0.0 : in.v.at({0, h, c});
          EXPECT_EQ(y.at({0, h, c}), expect);
          EXPECT_EQ(y_ref.at({0, h, c}), expect);
        }
      }
    }
  }
}

TEST(Relation, ExchangeOnlyTransportsTheHistoricalPartOfTheFullFlow) {
  Rng rng(19);
  const int64_t T = 10, H = 2, Dh = 6;
  RelInputs in = random_inputs({T, H, Dh}, DType::F64, rng, 1.5);
  const double lambda = 0.8;
  ops::RelationOptions ex;
  ex.exchange_only = true;
  Tensor y_full, y_ex, stats;
  ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y_full, stats);
  ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y_ex, stats, ex);
  // Y_full − Y_ex = F_pp Ĩ_p = (1 − g_p) Ĩ_p: the Self entry is dropped, not renormalized.
  for (int64_t p = 0; p < T; ++p)
    for (int64_t h = 0; h < H; ++h) {
      const double g = stats.at({h, p, ops::kRelationGate});
      for (int64_t c = 0; c < Dh; ++c)
        EXPECT_NEAR(y_full.at({p, h, c}) - y_ex.at({p, h, c}), (1 - g) * in.v.at({p, h, c}),
                    1e-13);
    }
}

TEST(Relation, CacheDecodeReproducesFullForward) {
  Rng rng(23);
  const int64_t B = 2, T = 17, H = 2, Dh = 12;
  RelInputs in = random_inputs({B, T, H, Dh}, DType::F64, rng, 1.5);
  const double lambda = 0.45;
  for (bool exchange_only : {false, true}) {
    ops::RelationOptions opt;
    opt.exchange_only = exchange_only;
    opt.tile = 8;
    Tensor y_full, stats;
    ops::flash_relation_forward(in.p1, in.p2, in.v, lambda, y_full, stats, opt);
    for (int64_t prefill : {0, 6}) {
      SCOPED_TRACE(::testing::Message() << "exchange_only=" << exchange_only
                                        << " prefill=" << prefill);
      ops::RelationCache cache(B, T, H, Dh, DType::F64);
      if (prefill > 0) {
        Tensor p2p = in.p2.slice(1, 0, prefill).clone(), vp = in.v.slice(1, 0, prefill).clone();
        cache.append(p2p, vp);
      }
      Tensor y_row = poisoned({B, H, Dh}, DType::F64);
      for (int64_t t = prefill; t < T; ++t) {
        ops::relation_decode_step(step_rows(in.p1, t), step_rows(in.p2, t), step_rows(in.v, t),
                                  lambda, cache, y_row, opt);
        EXPECT_LE(rel_error(y_row, step_rows(y_full, t)), 1e-13) << "position " << t;
        EXPECT_EQ(cache.length, t + 1);
      }
      EXPECT_THROW(ops::relation_decode_step(step_rows(in.p1, 0), step_rows(in.p2, 0),
                                             step_rows(in.v, 0), lambda, cache, y_row, opt),
                   Error);  // the cache is full
    }
  }
}

TEST(Relation, Float32AgreesWithFloat64) {
  Rng rng(29);
  const Shape shape{150, 2, 48};
  RelInputs in = random_inputs(shape, DType::F64, rng, 1.5);
  Tensor dy = random_tensor(shape, DType::F64, rng);
  const double lambda = 0.5;
  ops::RelationOptions opt;
  opt.tile = 32;
  Tensor y64, dp1_64, dp2_64, dv64;
  ops::relation_reference_forward(in.p1, in.p2, in.v, lambda, y64, opt);
  const double dl64 =
      ops::relation_reference_backward(in.p1, in.p2, in.v, lambda, dy, dp1_64, dp2_64, dv64, opt);
  Tensor p1 = in.p1.to(DType::F32), p2 = in.p2.to(DType::F32), v = in.v.to(DType::F32),
         dy32 = dy.to(DType::F32);
  Tensor y, stats, dp1, dp2, dv;
  ops::flash_relation_forward(p1, p2, v, lambda, y, stats, opt);
  const double dl = ops::flash_relation_backward(p1, p2, v, lambda, y, stats, dy32, dp1, dp2, dv,
                                                 opt);
  // The float32 reference sets the scale of float32 rounding for these inputs; FlashRelation in
  // float32 may be at most a few times further from the float64 answer.
  Tensor yr, dp1r, dp2r, dvr;
  ops::relation_reference_forward(p1, p2, v, lambda, yr, opt);
  const double dlr = ops::relation_reference_backward(p1, p2, v, lambda, dy32, dp1r, dp2r, dvr, opt);
  const double eps = std::numeric_limits<float>::epsilon();
  EXPECT_LE(rel_error(y, y64), 4 * rel_error(yr, y64) + 8 * eps);
  EXPECT_LE(rel_error(dp1, dp1_64), 4 * rel_error(dp1r, dp1_64) + 8 * eps);
  EXPECT_LE(rel_error(dp2, dp2_64), 4 * rel_error(dp2r, dp2_64) + 8 * eps);
  EXPECT_LE(rel_error(dv, dv64), 4 * rel_error(dvr, dv64) + 8 * eps);
  EXPECT_LE(std::fabs(dl - dl64), 4 * std::fabs(dlr - dl64) + 64 * eps * std::fabs(dl64));
  EXPECT_LE(rel_error(y, y64), 1e-5);
}

TEST(Relation, BadShapesNameTheTensor) {
  Rng rng(31);
  Tensor p1 = random_tensor({6, 2, 8}, DType::F64, rng);
  Tensor p2_bad = random_tensor({6, 2, 7}, DType::F64, rng);
  Tensor v_bad = random_tensor({5, 2, 8}, DType::F64, rng);
  Tensor v32 = random_tensor({6, 2, 8}, DType::F32, rng);
  Tensor flat = random_tensor({6, 16}, DType::F64, rng);
  Tensor ok = random_tensor({6, 2, 8}, DType::F64, rng);
  Tensor y, stats;
  expect_error_naming([&] { ops::flash_relation_forward(p1, p2_bad, ok, 0.5, y, stats); }, "p2:");
  expect_error_naming([&] { ops::flash_relation_forward(p1, ok, v_bad, 0.5, y, stats); }, "v:");
  expect_error_naming([&] { ops::relation_reference_forward(p1, ok, v32, 0.5, y); }, "v:");
  expect_error_naming([&] { ops::relation_reference_forward(flat, flat, flat, 0.5, y); }, "p1:");
  Tensor empty_heads = Tensor::empty({6, 0, 8}, DType::F64);
  expect_error_naming(
      [&] { ops::flash_relation_forward(empty_heads, empty_heads, empty_heads, 0.5, y, stats); },
      "p1:");
  ops::RelationOptions zero_tile;
  zero_tile.tile = 0;
  expect_error_naming([&] { ops::flash_relation_forward(p1, ok, ok, 0.5, y, stats, zero_tile); },
                      "tile");
  ops::flash_relation_forward(p1, ok, ok, 0.5, y, stats);
  Tensor stats_bad = Tensor::empty({2, 6, 2}, DType::F64), d1, d2, dv;
  expect_error_naming(
      [&] { ops::flash_relation_backward(p1, ok, ok, 0.5, y, stats_bad, ok, d1, d2, dv); },
      "stats:");
  Tensor dy_bad = random_tensor({6, 2, 9}, DType::F64, rng);
  expect_error_naming(
      [&] { ops::relation_reference_backward(p1, ok, ok, 0.5, dy_bad, d1, d2, dv); }, "dy:");
  ops::RelationCache cache(1, 4, 2, 8, DType::F64);
  Tensor row = random_tensor({1, 2, 8}, DType::F64, rng), row_bad = random_tensor({1, 3, 8},
                                                                                  DType::F64, rng);
  Tensor y_row;
  expect_error_naming([&] { ops::relation_decode_step(row, row_bad, row, 0.5, cache, y_row); },
                      "p2_row:");
}
