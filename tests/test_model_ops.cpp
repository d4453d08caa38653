// The CPU ops a decoder LM is built from: embedding, LayerNorm/RMSNorm, SwiGLU/GELU,
// softmax cross-entropy and the dense linear layer. Forward passes are compared with
// float64 formulas written out here; gradients with central finite differences of the
// scalar loss Σ out ⊙ W (W random); accumulators by calling backward twice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "quiver/parallel.h"
#include "quiver/rng.h"
#include "testing.h"

using namespace quiver;
using quiver::testing::dot;
using quiver::testing::finite_difference_error;
using quiver::testing::poisoned;
using quiver::testing::random_tensor;

namespace {

// Central differences with step 1e-6 on float64 losses of size O(10): truncation ~1e-12,
// cancellation ~1e-16 · 10 / 1e-6 = 1e-9, so 1e-6 relative leaves ample margin while a
// wrong term (relative error O(1e-2) or more) fails.
constexpr double kGradTolerance = 1e-6;
// F32 runs on F32-exact inputs differ from F64 only by F32 roundings (2^-24 ≈ 6e-8) through
// reductions over ≤ 64 terms and the cancellation in the norm backward (g − mean g − …);
// 1e-5 norm-relative is a few hundred ulps of margin and far below any formula error.
constexpr double kF32Tolerance = 1e-5;

// Runs fn and returns the quiver::Error message, or fails the test if nothing was thrown.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected quiver::Error";
  return "";
}

void expect_error_mentions(const std::function<void()>& fn, std::initializer_list<const char*> words) {
  const std::string message = error_of(fn);
  for (const char* word : words)
    EXPECT_NE(message.find(word), std::string::npos) << "message \"" << message << "\" lacks \"" << word << "\"";
}

Tensor f64(const Tensor& t) { return t.to(DType::F64); }

// Adds c · b to a (both F64, same shape): for building expected accumulator values.
Tensor add_scaled(const Tensor& a, const Tensor& b, double c) {
  Tensor out = a.to(DType::F64);
  Tensor bb = b.to(DType::F64);
  for (int64_t i = 0; i < out.numel(); ++i) out.data<double>()[i] += c * bb.data<double>()[i];
  return out;
}

// ---------------------------------------------------------------------------------------
// Embedding

TEST(ModelOps, EmbeddingForwardGathersRows) {
  Rng rng(1);
  const int64_t V = 7, D = 5;
  Tensor table = random_tensor({V, D}, DType::F64, rng);
  std::vector<int32_t> tokens = {3, 0, 6, 3, 3, 1};
  Tensor out = poisoned({2, 3, D}, DType::F64);
  ops::embedding_forward(tokens.data(), 6, table, out);
  Tensor flat = out.reshape({6, D});
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(flat.at({i, d}), table.at({tokens[i], d}));

  Tensor out32 = poisoned({6, D}, DType::F32);
  ops::embedding_forward(tokens.data(), 6, table.to(DType::F32), out32);
  EXPECT_LT(rel_error(out32, flat), 1e-7);
}

TEST(ModelOps, EmbeddingRejectsBadIdsAndShapes) {
  Rng rng(2);
  Tensor table = random_tensor({7, 4}, DType::F32, rng);
  Tensor out = Tensor::empty({3, 4}, DType::F32);
  std::vector<int32_t> high = {1, 7, 2}, negative = {1, 2, -1};
  expect_error_mentions([&] { ops::embedding_forward(high.data(), 3, table, out); },
                        {"token id 7", "position 1", "[0, 7)"});
  expect_error_mentions([&] { ops::embedding_forward(negative.data(), 3, table, out); },
                        {"token id -1", "position 2"});
  Tensor dtable = Tensor::zeros({7, 4}, DType::F32);
  expect_error_mentions([&] { ops::embedding_backward_accumulate(high.data(), 3, out, dtable); },
                        {"token id 7", "position 1"});
  std::vector<int32_t> good = {1, 2, 3};
  Tensor wide = Tensor::empty({3, 5}, DType::F32);
  expect_error_mentions([&] { ops::embedding_forward(good.data(), 3, table, wide); }, {"out", "[3, 5]"});
  Tensor as_f64 = Tensor::empty({3, 4}, DType::F64);
  expect_error_mentions([&] { ops::embedding_forward(good.data(), 3, table, as_f64); }, {"out", "F64"});
  Tensor flat_table = random_tensor({28}, DType::F32, rng);
  expect_error_mentions([&] { ops::embedding_forward(good.data(), 3, flat_table, out); }, {"table"});
}

TEST(ModelOps, EmbeddingBackwardMatchesFiniteDifferencesAndAccumulates) {
  Rng rng(3);
  const int64_t V = 6, D = 4, N = 9;
  std::vector<int32_t> tokens = {2, 5, 2, 0, 2, 5, 1, 1, 2};  // token 3 and 4 unused
  Tensor table = random_tensor({V, D}, DType::F64, rng);
  Tensor probe = random_tensor({N, D}, DType::F64, rng);  // dL/dout
  Tensor out = Tensor::empty({N, D}, DType::F64);
  auto loss = [&] {
    ops::embedding_forward(tokens.data(), N, table, out);
    return dot(out, probe);
  };
  Tensor start = random_tensor({V, D}, DType::F64, rng);
  Tensor dtable = start.clone();
  ops::embedding_backward_accumulate(tokens.data(), N, probe, dtable);
  Tensor grad = add_scaled(dtable, start, -1.0);
  EXPECT_LT(finite_difference_error(loss, table, grad), kGradTolerance);
  ops::embedding_backward_accumulate(tokens.data(), N, probe, dtable);
  EXPECT_LT(rel_error(dtable, add_scaled(start, grad, 2.0)), 1e-14);
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dtable.at({3, d}), start.at({3, d}));

  // F32 agrees with F64 and is bitwise independent of the thread count.
  Tensor probe32 = probe.to(DType::F32);
  Tensor sums[2];
  const int saved_threads = num_threads();
  for (int run = 0; run < 2; ++run) {
    set_num_threads(run == 0 ? 1 : 3);
    sums[run] = Tensor::zeros({V, D}, DType::F32);
    ops::embedding_backward_accumulate(tokens.data(), N, probe32, sums[run]);
  }
  set_num_threads(saved_threads);
  EXPECT_LT(rel_error(sums[0], grad), kF32Tolerance);
  EXPECT_EQ(std::memcmp(sums[0].raw(), sums[1].raw(), sums[0].nbytes()), 0);
}

// ---------------------------------------------------------------------------------------
// LayerNorm and RMSNorm

// Float64 references written from the definitions (two-pass mean and biased variance).
Tensor layernorm_reference(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t D = x.dim(-1), N = x.numel() / D;
  Tensor xf = f64(x).reshape({N, D}), wf = f64(w), bf = f64(b);
  Tensor y = Tensor::empty({N, D}, DType::F64);
  for (int64_t r = 0; r < N; ++r) {
    double mean = 0, var = 0;
    for (int64_t d = 0; d < D; ++d) mean += xf.at({r, d}) / D;
    for (int64_t d = 0; d < D; ++d) var += (xf.at({r, d}) - mean) * (xf.at({r, d}) - mean) / D;
    for (int64_t d = 0; d < D; ++d)
      y.data<double>()[r * D + d] = (xf.at({r, d}) - mean) / std::sqrt(var + eps) * wf.at({d}) + bf.at({d});
  }
  return y.reshape(x.shape());
}

Tensor rmsnorm_reference(const Tensor& x, const Tensor& w, double eps) {
  const int64_t D = x.dim(-1), N = x.numel() / D;
  Tensor xf = f64(x).reshape({N, D}), wf = f64(w);
  Tensor y = Tensor::empty({N, D}, DType::F64);
  for (int64_t r = 0; r < N; ++r) {
    double ms = 0;
    for (int64_t d = 0; d < D; ++d) ms += xf.at({r, d}) * xf.at({r, d}) / D;
    for (int64_t d = 0; d < D; ++d)
      y.data<double>()[r * D + d] = xf.at({r, d}) / std::sqrt(ms + eps) * wf.at({d});
  }
  return y.reshape(x.shape());
}

struct NormCase {
  Tensor x, weight, bias;
};

NormCase norm_case(DType dtype, Rng& rng, const Shape& shape) {
  const int64_t D = shape.back();
  NormCase c;
  c.x = random_tensor(shape, DType::F64, rng, 2.0);
  // A shifted row exercises the mean subtraction (LayerNorm) and large magnitudes.
  for (int64_t d = 0; d < D; ++d) c.x.data<double>()[d] += 50.0;
  c.weight = random_tensor({D}, DType::F64, rng);
  c.bias = random_tensor({D}, DType::F64, rng);
  c.x = c.x.to(dtype);
  c.weight = c.weight.to(dtype);
  c.bias = c.bias.to(dtype);
  return c;
}

TEST(ModelOps, LayerNormForwardMatchesReference) {
  Rng rng(4);
  const double eps = 1e-5;
  NormCase c = norm_case(DType::F64, rng, {2, 3, 19});
  Tensor y = poisoned({2, 3, 19}, DType::F64), mean = poisoned({2, 3}, DType::F64),
         rstd = poisoned({6}, DType::F64);
  ops::layernorm_forward(c.x, c.weight, c.bias, eps, y, mean, rstd);
  EXPECT_LT(rel_error(y, layernorm_reference(c.x, c.weight, c.bias, eps)), 1e-13);

  Tensor y32 = poisoned({2, 3, 19}, DType::F32), mean32 = poisoned({6}, DType::F32),
         rstd32 = poisoned({6}, DType::F32);
  ops::layernorm_forward(c.x.to(DType::F32), c.weight.to(DType::F32), c.bias.to(DType::F32), eps, y32,
                         mean32, rstd32);
  // c.x is F64 here; its F32 rounding changes the reference by ~1e-8 relative.
  EXPECT_LT(rel_error(y32, layernorm_reference(c.x.to(DType::F32), c.weight.to(DType::F32),
                                               c.bias.to(DType::F32), eps)),
            kF32Tolerance);
  EXPECT_LT(rel_error(rstd32, rstd), kF32Tolerance);
}

TEST(ModelOps, LayerNormGradientsMatchFiniteDifferencesAndAccumulate) {
  Rng rng(5);
  const double eps = 1e-5;
  const Shape shape = {3, 11};
  NormCase c = norm_case(DType::F64, rng, shape);
  Tensor probe = random_tensor(shape, DType::F64, rng);
  Tensor y = Tensor::empty(shape, DType::F64), mean = Tensor::empty({3}, DType::F64),
         rstd = Tensor::empty({3}, DType::F64);
  auto loss = [&] {
    ops::layernorm_forward(c.x, c.weight, c.bias, eps, y, mean, rstd);
    return dot(y, probe);
  };
  loss();
  Tensor dx = poisoned(shape, DType::F64);
  Tensor dw_start = random_tensor({11}, DType::F64, rng), db_start = random_tensor({11}, DType::F64, rng);
  Tensor dw = dw_start.clone(), db = db_start.clone();
  ops::layernorm_backward(probe, c.x, c.weight, mean, rstd, dx, dw, db);
  Tensor dx_once = dx.clone(), gw = add_scaled(dw, dw_start, -1), gb = add_scaled(db, db_start, -1);
  EXPECT_LT(finite_difference_error(loss, c.x, dx_once), kGradTolerance);
  EXPECT_LT(finite_difference_error(loss, c.weight, gw), kGradTolerance);
  EXPECT_LT(finite_difference_error(loss, c.bias, gb), kGradTolerance);

  loss();
  ops::layernorm_backward(probe, c.x, c.weight, mean, rstd, dx, dw, db);
  EXPECT_LT(rel_error(dx, dx_once), 1e-15);  // assigned, not accumulated
  EXPECT_LT(rel_error(dw, add_scaled(dw_start, gw, 2)), 1e-14);
  EXPECT_LT(rel_error(db, add_scaled(db_start, gb, 2)), 1e-14);

  // F32 backward on the same (F32-exact) data.
  NormCase c32{c.x.to(DType::F32), c.weight.to(DType::F32), c.bias.to(DType::F32)};
  NormCase c64{f64(c32.x), f64(c32.weight), f64(c32.bias)};
  Tensor y32 = Tensor::empty(shape, DType::F32), mean32 = Tensor::empty({3}, DType::F32),
         rstd32 = Tensor::empty({3}, DType::F32);
  ops::layernorm_forward(c32.x, c32.weight, c32.bias, eps, y32, mean32, rstd32);
  Tensor dx32 = poisoned(shape, DType::F32), dw32 = Tensor::zeros({11}, DType::F32),
         db32 = Tensor::zeros({11}, DType::F32);
  Tensor probe32 = probe.to(DType::F32);
  ops::layernorm_backward(probe32, c32.x, c32.weight, mean32, rstd32, dx32, dw32, db32);
  ops::layernorm_forward(c64.x, c64.weight, c64.bias, eps, y, mean, rstd);
  Tensor dx64 = Tensor::empty(shape, DType::F64), dw64 = Tensor::zeros({11}, DType::F64),
         db64 = Tensor::zeros({11}, DType::F64);
  ops::layernorm_backward(f64(probe32), c64.x, c64.weight, mean, rstd, dx64, dw64, db64);
  EXPECT_LT(rel_error(dx32, dx64), kF32Tolerance);
  EXPECT_LT(rel_error(dw32, dw64), kF32Tolerance);
  EXPECT_LT(rel_error(db32, db64), kF32Tolerance);
}

TEST(ModelOps, RmsNormForwardMatchesReference) {
  Rng rng(6);
  const double eps = 1e-6;
  NormCase c = norm_case(DType::F64, rng, {5, 17});
  Tensor y = poisoned({5, 17}, DType::F64), rstd = poisoned({5}, DType::F64);
  ops::rmsnorm_forward(c.x, c.weight, eps, y, rstd);
  EXPECT_LT(rel_error(y, rmsnorm_reference(c.x, c.weight, eps)), 1e-13);
  Tensor y32 = poisoned({5, 17}, DType::F32), rstd32 = poisoned({5}, DType::F32);
  ops::rmsnorm_forward(c.x.to(DType::F32), c.weight.to(DType::F32), eps, y32, rstd32);
  EXPECT_LT(rel_error(y32, rmsnorm_reference(c.x.to(DType::F32), c.weight.to(DType::F32), eps)),
            kF32Tolerance);
}

TEST(ModelOps, RmsNormGradientsMatchFiniteDifferencesAndAccumulate) {
  Rng rng(7);
  const double eps = 1e-6;
  const Shape shape = {2, 2, 13};
  NormCase c = norm_case(DType::F64, rng, shape);
  Tensor probe = random_tensor(shape, DType::F64, rng);
  Tensor y = Tensor::empty(shape, DType::F64), rstd = Tensor::empty({2, 2}, DType::F64);
  auto loss = [&] {
    ops::rmsnorm_forward(c.x, c.weight, eps, y, rstd);
    return dot(y, probe);
  };
  loss();
  Tensor dx = poisoned(shape, DType::F64);
  Tensor dw_start = random_tensor({13}, DType::F64, rng);
  Tensor dw = dw_start.clone();
  ops::rmsnorm_backward(probe, c.x, c.weight, rstd, dx, dw);
  Tensor dx_once = dx.clone(), gw = add_scaled(dw, dw_start, -1);
  EXPECT_LT(finite_difference_error(loss, c.x, dx_once), kGradTolerance);
  EXPECT_LT(finite_difference_error(loss, c.weight, gw), kGradTolerance);
  loss();
  ops::rmsnorm_backward(probe, c.x, c.weight, rstd, dx, dw);
  EXPECT_LT(rel_error(dx, dx_once), 1e-15);
  EXPECT_LT(rel_error(dw, add_scaled(dw_start, gw, 2)), 1e-14);

  Tensor x32 = c.x.to(DType::F32), w32 = c.weight.to(DType::F32), probe32 = probe.to(DType::F32);
  Tensor y32 = Tensor::empty(shape, DType::F32), rstd32 = Tensor::empty({4}, DType::F32);
  ops::rmsnorm_forward(x32, w32, eps, y32, rstd32);
  Tensor dx32 = poisoned(shape, DType::F32), dw32 = Tensor::zeros({13}, DType::F32);
  ops::rmsnorm_backward(probe32, x32, w32, rstd32, dx32, dw32);
  Tensor x64 = f64(x32), w64 = f64(w32);
  ops::rmsnorm_forward(x64, w64, eps, y, rstd);
  Tensor dx64 = Tensor::empty(shape, DType::F64), dw64 = Tensor::zeros({13}, DType::F64);
  ops::rmsnorm_backward(f64(probe32), x64, w64, rstd, dx64, dw64);
  EXPECT_LT(rel_error(dx32, dx64), kF32Tolerance);
  EXPECT_LT(rel_error(dw32, dw64), kF32Tolerance);
}

TEST(ModelOps, NormsRejectBadShapesNamingTheTensor) {
  Rng rng(8);
  Tensor x = random_tensor({4, 8}, DType::F32, rng);
  Tensor w = random_tensor({8}, DType::F32, rng), b = random_tensor({8}, DType::F32, rng);
  Tensor y = Tensor::empty({4, 8}, DType::F32), mean = Tensor::empty({4}, DType::F32),
         rstd = Tensor::empty({4}, DType::F32);
  Tensor short_w = random_tensor({7}, DType::F32, rng);
  expect_error_mentions([&] { ops::layernorm_forward(x, short_w, b, 1e-5, y, mean, rstd); },
                        {"layernorm_forward", "weight", "[8]", "[7]"});
  expect_error_mentions([&] { ops::layernorm_forward(x, w, short_w, 1e-5, y, mean, rstd); }, {"bias"});
  Tensor short_rstd = Tensor::empty({3}, DType::F32);
  expect_error_mentions([&] { ops::rmsnorm_forward(x, w, 1e-5, y, short_rstd); }, {"rstd", "4"});
  Tensor y64 = Tensor::empty({4, 8}, DType::F64);
  expect_error_mentions([&] { ops::rmsnorm_forward(x, w, 1e-5, y64, rstd); }, {"y", "F64"});
  Tensor dx = Tensor::empty({4, 9}, DType::F32), dw = Tensor::zeros({8}, DType::F32);
  expect_error_mentions([&] { ops::rmsnorm_backward(y, x, w, rstd, dx, dw); }, {"rmsnorm_backward", "dx"});
  Tensor x_t = x.transpose(0, 1);
  expect_error_mentions([&] { ops::rmsnorm_forward(x_t, short_w.slice(0, 0, 4), 1e-5, y, rstd); },
                        {"x", "contiguous"});
}

// ---------------------------------------------------------------------------------------
// Activations

TEST(ModelOps, SwiGluMatchesFormulaAndFiniteDifferences) {
  Rng rng(9);
  const Shape shape = {3, 2, 7};
  Tensor gate = random_tensor(shape, DType::F64, rng, 3.0), up = random_tensor(shape, DType::F64, rng);
  gate.data<double>()[0] = -800.0;  // exp overflow side of the sigmoid
  gate.data<double>()[1] = 800.0;
  Tensor out = poisoned(shape, DType::F64);
  ops::swiglu_forward(gate, up, out);
  Tensor ref = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double g = gate.data<double>()[i];
    ref.data<double>()[i] = g / (1.0 + std::exp(-g)) * up.data<double>()[i];
  }
  EXPECT_LT(rel_error(out, ref), 1e-15);

  gate.data<double>()[0] = -1.5;
  gate.data<double>()[1] = 2.5;
  Tensor probe = random_tensor(shape, DType::F64, rng);
  auto loss = [&] {
    ops::swiglu_forward(gate, up, out);
    return dot(out, probe);
  };
  Tensor dgate = poisoned(shape, DType::F64), dup = poisoned(shape, DType::F64);
  ops::swiglu_backward(probe, gate, up, dgate, dup);
  EXPECT_LT(finite_difference_error(loss, gate, dgate), kGradTolerance);
  EXPECT_LT(finite_difference_error(loss, up, dup), kGradTolerance);

  Tensor gate32 = gate.to(DType::F32), up32 = up.to(DType::F32), probe32 = probe.to(DType::F32);
  Tensor out32 = poisoned(shape, DType::F32), dgate32 = poisoned(shape, DType::F32),
         dup32 = poisoned(shape, DType::F32);
  ops::swiglu_forward(gate32, up32, out32);
  ops::swiglu_backward(probe32, gate32, up32, dgate32, dup32);
  Tensor out64 = Tensor::empty(shape, DType::F64), dgate64 = Tensor::empty(shape, DType::F64),
         dup64 = Tensor::empty(shape, DType::F64);
  ops::swiglu_forward(f64(gate32), f64(up32), out64);
  ops::swiglu_backward(f64(probe32), f64(gate32), f64(up32), dgate64, dup64);
  EXPECT_LT(rel_error(out32, out64), kF32Tolerance);
  EXPECT_LT(rel_error(dgate32, dgate64), kF32Tolerance);
  EXPECT_LT(rel_error(dup32, dup64), kF32Tolerance);

  Tensor wrong = Tensor::empty({3, 2, 6}, DType::F64);
  expect_error_mentions([&] { ops::swiglu_forward(gate, wrong, out); }, {"swiglu_forward", "up", "[3, 2, 6]"});
  expect_error_mentions([&] { ops::swiglu_backward(probe, gate, up, dgate, wrong); }, {"dup"});
}

TEST(ModelOps, GeluTanhMatchesFormulaAndFiniteDifferences) {
  Rng rng(10);
  const Shape shape = {4, 9};
  Tensor x = random_tensor(shape, DType::F64, rng, 2.0);
  Tensor y = poisoned(shape, DType::F64);
  ops::gelu_forward(x, y);
  Tensor ref = Tensor::empty(shape, DType::F64), exact = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<double>()[i];
    const double u = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    ref.data<double>()[i] = 0.5 * v * (1.0 + std::tanh(u));
    exact.data<double>()[i] = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
  }
  EXPECT_LT(rel_error(y, ref), 1e-14);
  // The approximation stays within its known ~1e-3 of the erf GELU, not some other curve.
  EXPECT_LT(rel_error(y, exact), 1e-3);

  Tensor probe = random_tensor(shape, DType::F64, rng);
  auto loss = [&] {
    ops::gelu_forward(x, y);
    return dot(y, probe);
  };
  Tensor dx = poisoned(shape, DType::F64);
  ops::gelu_backward(probe, x, dx);
  EXPECT_LT(finite_difference_error(loss, x, dx), kGradTolerance);

  Tensor x32 = x.to(DType::F32), probe32 = probe.to(DType::F32);
  Tensor y32 = poisoned(shape, DType::F32), dx32 = poisoned(shape, DType::F32);
  ops::gelu_forward(x32, y32);
  ops::gelu_backward(probe32, x32, dx32);
  Tensor y64 = Tensor::empty(shape, DType::F64), dx64 = Tensor::empty(shape, DType::F64);
  ops::gelu_forward(f64(x32), y64);
  ops::gelu_backward(f64(probe32), f64(x32), dx64);
  EXPECT_LT(rel_error(y32, y64), kF32Tolerance);
  EXPECT_LT(rel_error(dx32, dx64), kF32Tolerance);

  // Saturated inputs: slope 1 far right, 0 far left, never NaN (x³ overflows in F32).
  Tensor far = Tensor::empty({2}, DType::F32), dfar = Tensor::empty({2}, DType::F32);
  far.data<float>()[0] = 1e20f;
  far.data<float>()[1] = -1e20f;
  Tensor ones = Tensor::empty({2}, DType::F32);
  ones.fill(1.0);
  ops::gelu_backward(ones, far, dfar);
  EXPECT_EQ(dfar.data<float>()[0], 1.0f);
  EXPECT_EQ(dfar.data<float>()[1], 0.0f);

  Tensor wrong = Tensor::empty(shape, DType::F32);
  expect_error_mentions([&] { ops::gelu_backward(probe, x, wrong); }, {"gelu_backward", "dx", "F32"});
}

// ---------------------------------------------------------------------------------------
// Cross-entropy

// −log softmax(row)[target] from the definition, in long double without a max shift
// (fine for the moderate logits it is used with), averaged over non-ignored rows.
double cross_entropy_reference(const Tensor& logits, const std::vector<int32_t>& targets) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  Tensor lf = f64(logits).reshape({N, V});
  long double total = 0;
  int64_t counted = 0;
  for (int64_t r = 0; r < N; ++r) {
    if (targets[r] < 0) continue;
    long double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(static_cast<long double>(lf.at({r, j})));
    total += -std::log(std::exp(static_cast<long double>(lf.at({r, targets[r]}))) / z);
    ++counted;
  }
  return static_cast<double>(total / counted);
}

TEST(ModelOps, CrossEntropyLossAndGradientMatchReferenceAndFiniteDifferences) {
  Rng rng(11);
  const int64_t B = 2, T = 3, V = 10;
  Tensor logits = random_tensor({B, T, V}, DType::F64, rng, 3.0);
  std::vector<int32_t> targets = {4, -1, 9, 0, -100, 4};
  const double loss = ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, nullptr);
  EXPECT_NEAR(loss, cross_entropy_reference(logits, targets), 1e-14 * std::abs(loss));

  Tensor dlogits = poisoned({B, T, V}, DType::F64);
  const double same = ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, &dlogits);
  EXPECT_EQ(same, loss);
  auto loss_fn = [&] { return ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, nullptr); };
  EXPECT_LT(finite_difference_error(loss_fn, logits, dlogits, 1e-6, 1000), kGradTolerance);
  Tensor flat = dlogits.reshape({B * T, V});
  for (int64_t j = 0; j < V; ++j) {
    EXPECT_EQ(flat.at({1, j}), 0.0);  // ignored rows get zero gradient
    EXPECT_EQ(flat.at({4, j}), 0.0);
  }

  // scale multiplies the gradient, not the loss.
  Tensor scaled = poisoned({B, T, V}, DType::F64);
  EXPECT_EQ(ops::cross_entropy_forward_backward(logits, targets.data(), 0.25f, &scaled), loss);
  Tensor quarter = add_scaled(Tensor::zeros({B, T, V}, DType::F64), dlogits, 0.25);
  EXPECT_LT(rel_error(scaled, quarter), 1e-15);

  Tensor logits32 = logits.to(DType::F32), d32 = poisoned({B, T, V}, DType::F32);
  Tensor d64 = Tensor::empty({B, T, V}, DType::F64);
  const double loss32 = ops::cross_entropy_forward_backward(logits32, targets.data(), 1.0f, &d32);
  const double loss64 = ops::cross_entropy_forward_backward(f64(logits32), targets.data(), 1.0f, &d64);
  EXPECT_NEAR(loss32, loss64, 1e-6 * loss64);
  EXPECT_LT(rel_error(d32, d64), kF32Tolerance);
}

TEST(ModelOps, CrossEntropyIgnoresNegativeTargets) {
  Rng rng(12);
  const int64_t N = 5, V = 6;
  Tensor logits = random_tensor({N, V}, DType::F64, rng);
  std::vector<int32_t> targets = {1, -1, 3, -1, 5};
  const double loss = ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, nullptr);
  // Mean over the three counted rows only.
  double manual = 0;
  for (int64_t r : {0, 2, 4}) {
    std::vector<int32_t> single(N, -1);
    single[r] = targets[r];
    manual += ops::cross_entropy_forward_backward(logits, single.data(), 1.0f, nullptr);
  }
  EXPECT_NEAR(loss, manual / 3, 1e-14);
  // Changing an ignored row does not change the loss.
  for (int64_t j = 0; j < V; ++j) logits.data<double>()[1 * V + j] = 1e3 * (j + 1);
  EXPECT_EQ(ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, nullptr), loss);
  // Every row ignored: zero loss and zero gradient, not NaN.
  std::vector<int32_t> none(N, -1);
  Tensor d = poisoned({N, V}, DType::F64);
  EXPECT_EQ(ops::cross_entropy_forward_backward(logits, none.data(), 1.0f, &d), 0.0);
  EXPECT_EQ(norm2(d), 0.0);
}

TEST(ModelOps, CrossEntropyStaysFiniteForHugeLogits) {
  const int64_t V = 4;
  Tensor logits = Tensor::empty({2, V}, DType::F32);
  const float values[2][V] = {{3e38f, -3e38f, 1e30f, 3e38f}, {1e4f, 1e4f - 2.0f, -1e4f, 1e4f - 1.0f}};
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < V; ++j) logits.data<float>()[r * V + j] = values[r][j];
  std::vector<int32_t> targets = {0, 1};
  Tensor d = poisoned({2, V}, DType::F32);
  const double loss = ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, &d);
  ASSERT_TRUE(std::isfinite(loss));
  // Row 0: two tied maxima, loss log 2. Row 1: shifted logits (0, −2, −2e4, −1), target −2.
  const double row1 = std::log(1 + std::exp(-2.0) + std::exp(-1.0)) + 2.0;
  EXPECT_NEAR(loss, (std::log(2.0) + row1) / 2, 1e-6);
  for (int64_t i = 0; i < d.numel(); ++i) EXPECT_TRUE(std::isfinite(d.data<float>()[i]));
  EXPECT_NEAR(d.at({0, 0}), (0.5 - 1.0) / 2, 1e-7);
  EXPECT_NEAR(d.at({0, 3}), 0.5 / 2, 1e-7);
}

TEST(ModelOps, CrossEntropyRejectsBadTargetsAndShapes) {
  Rng rng(13);
  Tensor logits = random_tensor({3, 5}, DType::F32, rng);
  std::vector<int32_t> targets = {0, 4, 5};
  expect_error_mentions([&] { ops::cross_entropy_forward_backward(logits, targets.data(), 1.0f, nullptr); },
                        {"target 5", "row 2", "[0, 5)"});
  std::vector<int32_t> good = {0, 1, 2};
  Tensor wrong = Tensor::empty({3, 6}, DType::F32);
  expect_error_mentions([&] { ops::cross_entropy_forward_backward(logits, good.data(), 1.0f, &wrong); },
                        {"dlogits", "[3, 6]"});
  Tensor wrong_dtype = Tensor::empty({3, 5}, DType::F64);
  expect_error_mentions(
      [&] { ops::cross_entropy_forward_backward(logits, good.data(), 1.0f, &wrong_dtype); },
      {"dlogits", "F64"});
}

// ---------------------------------------------------------------------------------------
// Linear

Tensor linear_reference(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t K = w.dim(0), M = w.dim(1), N = x.numel() / K;
  Tensor xf = f64(x).reshape({N, K}), wf = f64(w);
  Shape out_shape = x.shape();
  out_shape.back() = M;
  Tensor y = Tensor::empty({N, M}, DType::F64);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < M; ++c) {
      double s = b.defined() ? b.at({c}) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += xf.at({r, k}) * wf.at({k, c});
      y.data<double>()[r * M + c] = s;
    }
  return y.reshape(out_shape);
}

TEST(ModelOps, LinearForwardMatchesReference) {
  Rng rng(14);
  const int64_t B = 2, T = 5, K = 7, M = 9;
  Tensor x = random_tensor({B, T, K}, DType::F64, rng), w = random_tensor({K, M}, DType::F64, rng),
         b = random_tensor({M}, DType::F64, rng);
  Tensor y = poisoned({B, T, M}, DType::F64);
  ops::linear_forward(x, w, b, y);
  EXPECT_LT(rel_error(y, linear_reference(x, w, b)), 1e-14);
  Tensor y_nobias = poisoned({B, T, M}, DType::F64);
  ops::linear_forward(x, w, Tensor(), y_nobias);
  EXPECT_LT(rel_error(y_nobias, linear_reference(x, w, Tensor())), 1e-14);

  Tensor x32 = x.to(DType::F32), w32 = w.to(DType::F32), b32 = b.to(DType::F32);
  Tensor y32 = poisoned({B, T, M}, DType::F32);
  ops::linear_forward(x32, w32, b32, y32);
  EXPECT_LT(rel_error(y32, linear_reference(x32, w32, b32)), kF32Tolerance);
}

TEST(ModelOps, LinearGradientsMatchFiniteDifferencesAndAccumulate) {
  Rng rng(15);
  const int64_t N = 6, K = 5, M = 4;
  Tensor x = random_tensor({2, 3, K}, DType::F64, rng), w = random_tensor({K, M}, DType::F64, rng),
         b = random_tensor({M}, DType::F64, rng);
  Tensor probe = random_tensor({2, 3, M}, DType::F64, rng);
  Tensor y = Tensor::empty({2, 3, M}, DType::F64);
  auto loss = [&] {
    ops::linear_forward(x, w, b, y);
    return dot(y, probe);
  };
  Tensor dx = poisoned({2, 3, K}, DType::F64);
  Tensor dw_start = random_tensor({K, M}, DType::F64, rng), db_start = random_tensor({M}, DType::F64, rng);
  Tensor dw = dw_start.clone(), db = db_start.clone();
  ops::linear_backward(probe, x, w, &dx, dw, &db);
  Tensor dx_once = dx.clone(), gw = add_scaled(dw, dw_start, -1), gb = add_scaled(db, db_start, -1);
  EXPECT_LT(finite_difference_error(loss, x, dx_once), kGradTolerance);
  EXPECT_LT(finite_difference_error(loss, w, gw), kGradTolerance);
  EXPECT_LT(finite_difference_error(loss, b, gb), kGradTolerance);

  ops::linear_backward(probe, x, w, &dx, dw, &db);
  EXPECT_LT(rel_error(dx, dx_once), 1e-15);
  EXPECT_LT(rel_error(dw, add_scaled(dw_start, gw, 2)), 1e-14);
  EXPECT_LT(rel_error(db, add_scaled(db_start, gb, 2)), 1e-14);

  // Optional outputs skipped: dw still accumulates.
  ops::linear_backward(probe, x, w, nullptr, dw, nullptr);
  EXPECT_LT(rel_error(dw, add_scaled(dw_start, gw, 3)), 1e-14);
  EXPECT_LT(rel_error(db, add_scaled(db_start, gb, 2)), 1e-14);

  Tensor x32 = x.to(DType::F32), w32 = w.to(DType::F32), probe32 = probe.to(DType::F32);
  Tensor dx32 = poisoned({2, 3, K}, DType::F32), dw32 = Tensor::zeros({K, M}, DType::F32),
         db32 = Tensor::zeros({M}, DType::F32);
  ops::linear_backward(probe32, x32, w32, &dx32, dw32, &db32);
  Tensor dx64 = Tensor::empty({2, 3, K}, DType::F64), dw64 = Tensor::zeros({K, M}, DType::F64),
         db64 = Tensor::zeros({M}, DType::F64);
  ops::linear_backward(f64(probe32), f64(x32), f64(w32), &dx64, dw64, &db64);
  EXPECT_LT(rel_error(dx32, dx64), kF32Tolerance);
  EXPECT_LT(rel_error(dw32, dw64), kF32Tolerance);
  EXPECT_LT(rel_error(db32, db64), kF32Tolerance);
  (void)N;
}

TEST(ModelOps, LinearRejectsBadShapesNamingTheTensor) {
  Rng rng(16);
  Tensor x = random_tensor({4, 6}, DType::F32, rng), w = random_tensor({6, 3}, DType::F32, rng);
  Tensor y = Tensor::empty({4, 3}, DType::F32);
  Tensor w_bad = random_tensor({5, 3}, DType::F32, rng);
  expect_error_mentions([&] { ops::linear_forward(x, w_bad, Tensor(), y); },
                        {"linear_forward", "x", "K = 5", "[4, 6]"});
  Tensor b_bad = random_tensor({4}, DType::F32, rng);
  expect_error_mentions([&] { ops::linear_forward(x, w, b_bad, y); }, {"b", "[3]", "[4]"});
  Tensor y_bad = Tensor::empty({4, 4}, DType::F32);
  expect_error_mentions([&] { ops::linear_forward(x, w, Tensor(), y_bad); }, {"y", "[4, 3]"});
  Tensor dw = Tensor::zeros({3, 6}, DType::F32);
  expect_error_mentions([&] { ops::linear_backward(y, x, w, nullptr, dw, nullptr); },
                        {"linear_backward", "dw", "[6, 3]"});
  Tensor w64 = random_tensor({6, 3}, DType::F64, rng);
  expect_error_mentions([&] { ops::linear_forward(x, w64, Tensor(), y); }, {"w", "F64"});
}

}  // namespace
