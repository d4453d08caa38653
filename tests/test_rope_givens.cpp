#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <vector>

#include "ops/givens.h"
#include "ops/rope.h"
#include "quiver/parallel.h"
#include "quiver/rng.h"
#include "testing.h"

using namespace quiver;
using quiver::testing::dot;
using quiver::testing::finite_difference_error;
using quiver::testing::random_tensor;

namespace {

// Float32 inputs are exact in float64, so F32 and F64 runs differ only by the F32 kernel's
// own roundings: each output is two products and a sum of operands that carry one rounding
// each (input exact; cos, sin rounded to F32), a few units of 2^-24 ≈ 6e-8 in all, so a
// norm-relative error below 1e-6 leaves an order of magnitude of margin.
constexpr double kF32Tolerance = 1e-6;

Tensor rope(const Tensor& x, int64_t pos0, double base = ops::kRopeBase) {
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  ops::rope_forward(x, y, pos0, base);
  return y;
}

Tensor rope_t(const Tensor& dy, int64_t pos0, double base = ops::kRopeBase) {
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype());
  ops::rope_backward(dy, dx, pos0, base);
  return dx;
}

Tensor givens(const Tensor& I, const Tensor& theta, int64_t layer) {
  Tensor out = quiver::testing::poisoned(I.shape(), I.dtype());
  ops::givens_forward(I, theta, layer, out);
  return out;
}

// Independent RoPE: view (x_i, x_{i+Dh/2}) as a complex number and multiply it by
// e^{j·p·ω_i}, ω_i = exp(−(2i/Dh)·ln base).
Tensor rope_reference(const Tensor& x, int64_t pos0, double base) {
  const int64_t T = x.dim(0), H = x.dim(1), Dh = x.dim(2), half = Dh / 2;
  Tensor y = Tensor::empty(x.shape(), DType::F64);
  double* out = y.data<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        double omega = std::exp(-(2.0 * i / Dh) * std::log(base));
        std::complex<double> z(x.at({t, h, i}), x.at({t, h, i + half}));
        z *= std::polar(1.0, static_cast<double>(pos0 + t) * omega);
        out[(t * H + h) * Dh + i] = z.real();
        out[(t * H + h) * Dh + i + half] = z.imag();
      }
  return y;
}
}  // namespace

TEST(Rope, MatchesComplexRotationFormula) {
  Rng rng(11);
  Tensor x = random_tensor({5, 3, 8}, DType::F64, rng);
  for (double base : {10000.0, 500.0}) {
    for (int64_t pos0 : {int64_t{0}, int64_t{3}, int64_t{1000}}) {
      EXPECT_LT(rel_error(rope(x, pos0, base), rope_reference(x, pos0, base)), 1e-13)
          << "base " << base << " pos0 " << pos0;
    }
  }
  // Position 0 is the identity.
  Tensor one = random_tensor({1, 2, 6}, DType::F64, rng);
  EXPECT_EQ(rel_error(rope(one, 0), one), 0.0);
}

TEST(Rope, BatchedMatchesPerBatch) {
  Rng rng(12);
  Tensor x = random_tensor({3, 4, 2, 6}, DType::F64, rng);
  Tensor y = rope(x, 5);
  for (int64_t b = 0; b < 3; ++b) {
    Tensor xb = x.slice(0, b, b + 1).reshape({4, 2, 6});
    Tensor yb = y.slice(0, b, b + 1).reshape({4, 2, 6});
    EXPECT_LT(rel_error(yb, rope_reference(xb, 5, ops::kRopeBase)), 1e-13) << b;
  }
}

TEST(Rope, PreservesHeadNorms) {
  Rng rng(13);
  Tensor x = random_tensor({6, 3, 10}, DType::F64, rng);
  Tensor y = rope(x, 17);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t h = 0; h < 3; ++h) {
      Tensor xh = x.slice(0, t, t + 1).slice(1, h, h + 1);
      Tensor yh = y.slice(0, t, t + 1).slice(1, h, h + 1);
      EXPECT_NEAR(norm2(yh), norm2(xh), 1e-12 * norm2(xh));
    }
}

TEST(Rope, ScoresDependOnlyOnRelativePosition) {
  Rng rng(14);
  Tensor q = random_tensor({1, 1, 16}, DType::F64, rng);
  Tensor k = random_tensor({1, 1, 16}, DType::F64, rng);
  for (int64_t m : {int64_t{0}, int64_t{7}, int64_t{40}}) {
    for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{40}}) {
      double ref = dot(rope(q, m), rope(k, n));
      for (int64_t shift : {int64_t{1}, int64_t{100}, int64_t{2049}}) {
        double shifted = dot(rope(q, m + shift), rope(k, n + shift));
        EXPECT_NEAR(shifted, ref, 1e-10 * (1 + std::abs(ref))) << m << " " << n << " " << shift;
      }
    }
  }
}

TEST(Rope, BackwardIsTransposeAndMatchesFiniteDifferences) {
  Rng rng(15);
  Tensor x = random_tensor({4, 2, 8}, DType::F64, rng);
  Tensor w = random_tensor({4, 2, 8}, DType::F64, rng);
  const int64_t pos0 = 9;
  // ⟨R x, w⟩ = ⟨x, Rᵀ w⟩
  Tensor grad = rope_t(w, pos0);
  EXPECT_NEAR(dot(rope(x, pos0), w), dot(x, grad), 1e-12 * norm2(x) * norm2(w));
  // Rᵀ R = I
  EXPECT_LT(rel_error(rope_t(rope(x, pos0), pos0), x), 1e-14);
  auto loss = [&] { return dot(rope(x, pos0), w); };
  EXPECT_LT(finite_difference_error(loss, x, grad), 1e-8);
}

TEST(Rope, Pos0OffsetEqualsSlicingLongerSequence) {
  Rng rng(16);
  Tensor x = random_tensor({10, 2, 6}, DType::F64, rng);
  Tensor full = rope(x, 0);
  Tensor tail = rope(x.slice(0, 4, 10).clone(), 4);
  EXPECT_EQ(rel_error(tail, full.slice(0, 4, 10).clone()), 0.0);
  // Decoding one token at position p.
  Tensor one = rope(x.slice(0, 7, 8).clone(), 7);
  EXPECT_EQ(rel_error(one, full.slice(0, 7, 8).clone()), 0.0);
}

TEST(Rope, InPlaceMatchesOutOfPlace) {
  Rng rng(17);
  Tensor x = random_tensor({3, 2, 4, 8}, DType::F32, rng);
  Tensor y = rope(x, 2);
  Tensor z = x.clone();
  ops::rope_forward(z, z, 2, ops::kRopeBase);
  EXPECT_EQ(rel_error(z, y), 0.0);
  ops::rope_backward(z, z, 2, ops::kRopeBase);
  EXPECT_LT(rel_error(z, x), 1e-6);
}

TEST(Rope, F32AgreesWithF64) {
  Rng rng(18);
  Tensor x32 = random_tensor({2, 33, 4, 24}, DType::F32, rng);
  Tensor x64 = x32.to(DType::F64);
  EXPECT_LT(rel_error(rope(x32, 1500), rope(x64, 1500)), kF32Tolerance);
  EXPECT_LT(rel_error(rope_t(x32, 1500), rope_t(x64, 1500)), kF32Tolerance);
}

TEST(Rope, RejectsBadInputs) {
  Tensor odd = Tensor::zeros({2, 2, 5}, DType::F64);
  Tensor odd_out = Tensor::zeros({2, 2, 5}, DType::F64);
  EXPECT_THROW(ops::rope_forward(odd, odd_out, 0), Error);
  Tensor bf = Tensor::zeros({2, 2, 4}, DType::BF16);
  Tensor bf_out = Tensor::zeros({2, 2, 4}, DType::BF16);
  EXPECT_THROW(ops::rope_forward(bf, bf_out, 0), Error);
  Tensor x = Tensor::zeros({2, 2, 4}, DType::F64);
  Tensor wrong_shape = Tensor::zeros({2, 2, 6}, DType::F64);
  Tensor wrong_dtype = Tensor::zeros({2, 2, 4}, DType::F32);
  EXPECT_THROW(ops::rope_forward(x, wrong_shape, 0), Error);
  EXPECT_THROW(ops::rope_forward(x, wrong_dtype, 0), Error);
  EXPECT_THROW(ops::rope_forward(x, x, -1), Error);
  EXPECT_THROW(ops::rope_forward(x, x, 0, 0.0), Error);
  Tensor flat = Tensor::zeros({2, 8}, DType::F64);
  EXPECT_THROW(ops::rope_backward(flat, flat, 0), Error);
}

TEST(Givens, PairsAlternateByLayer) {
  using Pairs = std::vector<std::pair<int64_t, int64_t>>;
  const Pairs even = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const Pairs odd = {{1, 2}, {3, 4}, {5, 6}, {7, 0}};
  EXPECT_EQ(ops::givens_pairs(8, 0), even);
  EXPECT_EQ(ops::givens_pairs(8, 1), odd);
  EXPECT_EQ(ops::givens_pairs(8, 2), even);
  EXPECT_EQ(ops::givens_pairs(8, 5), odd);
  EXPECT_EQ(ops::givens_pairs(2, 1), (Pairs{{1, 0}}));
  EXPECT_TRUE(ops::givens_mixes(8));
  EXPECT_FALSE(ops::givens_mixes(1));
  EXPECT_TRUE(ops::givens_pairs(1, 0).empty());
  EXPECT_THROW(ops::givens_mixes(3), Error);
  EXPECT_THROW(ops::givens_pairs(7, 1), Error);
  EXPECT_THROW(ops::givens_pairs(0, 0), Error);
  EXPECT_THROW(ops::givens_pairs(8, -1), Error);
}

TEST(Givens, RotatesTheDocumentedPairsOfEightHeads) {
  Rng rng(21);
  const int64_t T = 3, H = 8, Dh = 4;
  Tensor I = random_tensor({T, H, Dh}, DType::F64, rng);
  Tensor theta = Tensor::empty({H / 2}, DType::F64);
  for (int64_t k = 0; k < H / 2; ++k) theta.data<double>()[k] = 0.3 + 0.4 * k;
  for (int64_t layer : {0, 1}) {
    Tensor out = givens(I, theta, layer);
    for (int64_t k = 0; k < H / 2; ++k) {
      // SPEC §2.2 pairs, written 1-based and shifted here by hand.
      int64_t a = layer == 0 ? 2 * k : 2 * k + 1;
      int64_t b = layer == 0 ? 2 * k + 1 : (2 * k + 2) % H;
      double c = std::cos(theta.at({k})), s = std::sin(theta.at({k}));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < Dh; ++d) {
          double ia = I.at({t, a, d}), ib = I.at({t, b, d});
          EXPECT_NEAR(out.at({t, a, d}), c * ia - s * ib, 1e-15) << layer << " " << k;
          EXPECT_NEAR(out.at({t, b, d}), s * ia + c * ib, 1e-15) << layer << " " << k;
        }
    }
  }
  // θ = 0 is the identity.
  EXPECT_EQ(rel_error(givens(I, Tensor::zeros({H / 2}, DType::F32), 1), I), 0.0);
}

TEST(Givens, PreservesNormAndBackwardIsTranspose) {
  Rng rng(22);
  Tensor I = random_tensor({2, 5, 6, 3}, DType::F64, rng);
  Tensor theta = random_tensor({3}, DType::F64, rng);
  Tensor g = random_tensor({2, 5, 6, 3}, DType::F64, rng);
  for (int64_t layer : {0, 1}) {
    Tensor out = givens(I, theta, layer);
    EXPECT_NEAR(norm2(out), norm2(I), 1e-13 * norm2(I));
    Tensor dI = quiver::testing::poisoned(I.shape(), DType::F64);
    Tensor dtheta = quiver::testing::poisoned({3}, DType::F64);
    ops::givens_backward(g, I, theta, layer, dI, dtheta);
    EXPECT_NEAR(dot(out, g), dot(I, dI), 1e-12 * norm2(I) * norm2(g));
  }
}

TEST(Givens, GradientsMatchFiniteDifferences) {
  Rng rng(23);
  for (int64_t layer : {0, 1, 2, 3}) {
    SCOPED_TRACE(layer);
    Tensor I = random_tensor({2, 3, 4, 5}, DType::F64, rng);
    Tensor theta = random_tensor({2}, DType::F64, rng);
    Tensor w = random_tensor({2, 3, 4, 5}, DType::F64, rng);
    Tensor dI = quiver::testing::poisoned(I.shape(), DType::F64);
    Tensor dtheta = quiver::testing::poisoned({2}, DType::F64);
    ops::givens_backward(w, I, theta, layer, dI, dtheta);
    auto loss = [&] { return dot(givens(I, theta, layer), w); };
    EXPECT_LT(finite_difference_error(loss, I, dI), 1e-8);
    EXPECT_LT(finite_difference_error(loss, theta, dtheta), 1e-8);
  }
}

TEST(Givens, GradientsAreAssignedAndMayAlias) {
  Rng rng(24);
  Tensor I = random_tensor({4, 4, 3}, DType::F64, rng);
  Tensor theta = random_tensor({2}, DType::F64, rng);
  Tensor g = random_tensor({4, 4, 3}, DType::F64, rng);
  Tensor dI = Tensor::empty(I.shape(), DType::F64);
  Tensor dtheta = Tensor::empty({2}, DType::F64);
  dI.fill(1e6);
  dtheta.fill(1e6);
  ops::givens_backward(g, I, theta, 1, dI, dtheta);
  Tensor again_dI = dI.clone(), again_dtheta = dtheta.clone();
  ops::givens_backward(g, I, theta, 1, again_dI, again_dtheta);
  EXPECT_EQ(rel_error(again_dI, dI), 0.0);
  EXPECT_EQ(rel_error(again_dtheta, dtheta), 0.0);
  // dI over dOut in place, out over I in place.
  Tensor g_inplace = g.clone();
  ops::givens_backward(g_inplace, I, theta, 1, g_inplace, again_dtheta);
  EXPECT_EQ(rel_error(g_inplace, dI), 0.0);
  EXPECT_EQ(rel_error(again_dtheta, dtheta), 0.0);
  Tensor I_inplace = I.clone();
  ops::givens_forward(I_inplace, theta, 1, I_inplace);
  EXPECT_EQ(rel_error(I_inplace, givens(I, theta, 1)), 0.0);
}

TEST(Givens, SingleHeadIsIdentity) {
  Rng rng(25);
  Tensor I = random_tensor({3, 1, 4}, DType::F64, rng);
  Tensor theta = Tensor::empty({0}, DType::F32);
  EXPECT_EQ(rel_error(givens(I, theta, 0), I), 0.0);
  EXPECT_EQ(rel_error(givens(I, theta, 1), I), 0.0);
  Tensor g = random_tensor({3, 1, 4}, DType::F64, rng);
  Tensor dI = quiver::testing::poisoned(I.shape(), DType::F64);
  Tensor dtheta = Tensor::empty({0}, DType::F32);
  ops::givens_backward(g, I, theta, 1, dI, dtheta);
  EXPECT_EQ(rel_error(dI, g), 0.0);
}

TEST(Givens, RejectsBadInputs) {
  Tensor I3 = Tensor::zeros({2, 3, 4}, DType::F64);
  Tensor out3 = Tensor::zeros({2, 3, 4}, DType::F64);
  EXPECT_THROW(ops::givens_forward(I3, Tensor::zeros({1}, DType::F64), 0, out3), Error);
  Tensor I = Tensor::zeros({2, 4, 4}, DType::F64);
  Tensor out = Tensor::zeros({2, 4, 4}, DType::F64);
  EXPECT_THROW(ops::givens_forward(I, Tensor::zeros({3}, DType::F64), 0, out), Error);
  EXPECT_THROW(ops::givens_forward(I, Tensor::zeros({2}, DType::BF16), 0, out), Error);
  EXPECT_THROW(ops::givens_forward(I, Tensor::zeros({2}, DType::F64), -1, out), Error);
  Tensor out32 = Tensor::zeros({2, 4, 4}, DType::F32);
  EXPECT_THROW(ops::givens_forward(I, Tensor::zeros({2}, DType::F64), 0, out32), Error);
  Tensor I32 = Tensor::zeros({2, 4, 4}, DType::F32);
  EXPECT_THROW(ops::givens_forward(I32, Tensor::zeros({2}, DType::F64), 0, out32), Error);
  Tensor dI = Tensor::zeros({2, 4, 4}, DType::F64);
  Tensor dtheta_wrong = Tensor::zeros({2}, DType::F32);
  EXPECT_THROW(ops::givens_backward(out, I, Tensor::zeros({2}, DType::F64), 0, dI, dtheta_wrong),
               Error);
}

TEST(Givens, F32AgreesWithF64) {
  Rng rng(26);
  Tensor I32 = random_tensor({2, 40, 8, 12}, DType::F32, rng);
  Tensor g32 = random_tensor({2, 40, 8, 12}, DType::F32, rng);
  Tensor theta32 = random_tensor({4}, DType::F32, rng);
  Tensor I64 = I32.to(DType::F64), g64 = g32.to(DType::F64), theta64 = theta32.to(DType::F64);
  for (int64_t layer : {0, 1}) {
    EXPECT_LT(rel_error(givens(I32, theta32, layer), givens(I64, theta64, layer)), kF32Tolerance);
    // F32 angles with F64 states are accepted and give the F64 result.
    EXPECT_EQ(rel_error(givens(I64, theta32, layer), givens(I64, theta64, layer)), 0.0);
    Tensor dI32 = Tensor::empty(I32.shape(), DType::F32), dI64 = Tensor::empty(I64.shape(), DType::F64);
    Tensor dt32 = Tensor::empty({4}, DType::F32), dt64 = Tensor::empty({4}, DType::F64);
    ops::givens_backward(g32, I32, theta32, layer, dI32, dt32);
    ops::givens_backward(g64, I64, theta64, layer, dI64, dt64);
    EXPECT_LT(rel_error(dI32, dI64), kF32Tolerance);
    EXPECT_LT(rel_error(dt32, dt64), kF32Tolerance);
  }
}

TEST(Givens, ThetaGradientIndependentOfThreadCount) {
  Rng rng(27);
  Tensor I = random_tensor({300, 4, 8}, DType::F32, rng);
  Tensor g = random_tensor({300, 4, 8}, DType::F32, rng);
  Tensor theta = random_tensor({2}, DType::F32, rng);
  const int saved = num_threads();
  std::vector<Tensor> results;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor dI = Tensor::empty(I.shape(), DType::F32), dtheta = Tensor::empty({2}, DType::F32);
    ops::givens_backward(g, I, theta, 1, dI, dtheta);
    results.push_back(dtheta);
  }
  set_num_threads(saved);
  for (const Tensor& r : results) EXPECT_EQ(rel_error(r, results[0]), 0.0);
}
