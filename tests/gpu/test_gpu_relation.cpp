// GPU tests of FlashRelation and the Relation Cache decode step (src/cuda/relation.h) against
// the CPU references of src/ops/relation.h, run in F64 on the same bf16 inputs.
//
// Tolerances. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 ≈ 3.9e-3. The inputs are
// bf16 already (exact in F64 and exact as mma operands); products accumulate in fp32 (relative
// error ~Dh·2^-24, far below u). Two bf16 roundings enter each output: the flow weights
// (forward, dv) or dU (dp1, dp2) as mma operands, and the output itself; each is within u
// elementwise (about u/√3 in rms over many elements), so the output is within 2u in relative
// norm. The SiLU's σ is (1 + tanh(U/2)) / 2 with the hardware tanh.approx: |δσ| ≤ 2^-12 (PTX
// ISA: tanh.approx.f32 errs by about 2^-11); we allow kSigmoid = 2^-11, so E = Uσ errs by at
// most e_E = kSigmoid · max|U| (max over the case's scores, computed below). That moves the
// weights by a relative e_E at worst and by far less in rms (the error oscillates with U),
// well inside the 2u of the roundings.
//   - y against the materialized reference, and dp1/dp2/dv against the CPU FlashRelation
//     backward fed the GPU's own y (the same D_p = dY_p·Y_p as the kernel): kTight = 2u.
//   - dp1/dp2/dv against the materialized reference backward (end to end: it uses the exact
//     y, the kernel the bf16 y, which perturbs D_p by ~u·|dY||Y|/sqrt(Dh), small against the
//     dF − D it enters): kLoose = 4u.
//   - decode against the full GPU forward: both are bf16 roundings of one exact value, each
//     within 2u, so within 4u of each other; against the reference: kTight.
//   - stats, elementwise: L_p = LSE_{j<p} E_pj is 1-Lipschitz in the max norm of E, so it errs
//     by at most e_E; g_p = sigmoid(L_p − λ log(p+1) − S_p) by e_E / 4; S_p is exact fp32. On
//     top, fp32 dots, exp2 and log: kStats = 5e-5 · max(|ref|, 1).
//   - dλ is an fp32 sum (over B·H·T rows, in double across rows) of log(p+1)·dR_pp, each term
//     with an fp32 error ~1e-5 of its own size; the terms have random signs, so the error of
//     the sum stays ~1e-5 of its size: kDlambda = 1e-3 relative to max(|dλ|, 1). The kernel's
//     gates (within e_E / 4) enter dR_pp = (1 − g_p) X_p, X_p = dY_p · w_p − D_p, which adds
//     at most (e_E / 4) Σ_p log(p+1) |X_p| (gate_dlambda_bound). Against the materialized
//     reference, the exact effect of the bf16 y on D_p is added to the reference first
//     (rounded_y_dlambda_shift), with the same tolerance.
// A wrong kernel (a missed tile, a wrong mask, the Self or count term, the first-token rule)
// errs by O(1). Errors are ‖got − ref‖ / max(‖ref‖, 1): the floor covers gradients that vanish
// exactly (T = 1: the flow of one token has no score gradient).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <vector>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/relation.h"
#include "cuda/relation_bench.h"
#include "gpu/gpu_testing.h"
#include "ops/relation.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kU = 1.0 / 256.0;
constexpr double kTight = 2 * kU;
constexpr double kLoose = 4 * kU;
constexpr double kStats = 5e-5;
constexpr double kDlambda = 1e-3;
constexpr double kSigmoid = 1.0 / 2048.0;

// The largest elementwise error of the statistics beyond `slack` (0 when within it): entries
// that are −inf in the reference (L_0) must be −inf in got; the others may differ by
// slack[column] + kStats · max(|ref|, 1).
double stats_excess(const Tensor& got, const Tensor& ref, const double (&slack)[3]) {
  EXPECT_EQ(got.shape(), ref.shape());
  const double* g = got.data<double>();
  const double* r = ref.data<double>();
  double excess = 0;
  int64_t infinite_mismatch = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::isinf(r[i])) {
      infinite_mismatch += g[i] != r[i];
      continue;
    }
    const double allowed = slack[i % 3] + kStats * std::max(std::fabs(r[i]), 1.0);
    const double diff = std::fabs(g[i] - r[i]);
    if (!(diff <= allowed)) excess = std::max(excess, std::isnan(diff) ? INFINITY : diff - allowed);
  }
  EXPECT_EQ(infinite_mismatch, 0);
  return excess;
}

// max |U_pj| over the scored pairs j < p of every head (U = p1_p · p2_j / sqrt(Dh)), F64
// [B, T, H, Dh] inputs.
double max_abs_score(const Tensor& p1, const Tensor& p2) {
  const int64_t B = p1.dim(0), T = p1.dim(1), H = p1.dim(2), Dh = p1.dim(3);
  const double *a = p1.data<double>(), *k = p2.data<double>();
  const double scale = 1.0 / std::sqrt(double(Dh));
  double top = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < T; ++p)
        for (int64_t j = 0; j < p; ++j) {
          const double* x = a + ((b * T + p) * H + h) * Dh;
          const double* y = k + ((b * T + j) * H + h) * Dh;
          double dot = 0;
          for (int64_t c = 0; c < Dh; ++c) dot += x[c] * y[c];
          top = std::max(top, std::fabs(dot * scale));
        }
  return top;
}

// Σ over the rows (b, t, h) of F64 [B, T, H, Dh] tensors shaped as `like` of
// term(b, t, h, offset of the row's first element).
template <class Term>
double sum_over_rows(const Tensor& like, Term term) {
  const int64_t B = like.dim(0), T = like.dim(1), H = like.dim(2), Dh = like.dim(3);
  double sum = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) sum += term(b, t, h, ((b * T + t) * H + h) * Dh);
  return sum;
}

// The bound on the change of dλ when every gate errs by at most gate_error:
// gate_error · Σ_{b,h,p} log(p+1) |dY_p · w_p − D_p| with w_p = Ĩ_p (0 under exchange-only
// transport) and D_p = dY_p · y_p.
double gate_dlambda_bound(const Tensor& y, const Tensor& v, const Tensor& dy, bool exchange_only,
                          double gate_error) {
  const int64_t Dh = y.dim(3);
  const double *yy = y.data<double>(), *vv = v.data<double>(), *g = dy.data<double>();
  return gate_error * sum_over_rows(y, [&](int64_t, int64_t t, int64_t, int64_t row) {
           double x = 0;
           for (int64_t c = 0; c < Dh; ++c)
             x += g[row + c] * ((exchange_only ? 0 : vv[row + c]) - yy[row + c]);
           return std::log(double(t + 1)) * std::fabs(x);
         });
}

// A device F32 scalar holding `value`.
Tensor device_scalar(float value) {
  Tensor host = Tensor::empty({1}, DType::F32);
  host.data<float>()[0] = value;
  return to_device(host);
}

float host_scalar(const Tensor& dev) { return to_host(dev).data<float>()[0]; }

Tensor backward_workspace(int64_t B, int64_t T, int64_t H) {
  const int64_t bytes = cuda::flash_relation_backward_workspace_bytes(B, T, H);
  return poisoned({(bytes + 7) / 8}, DType::F64);
}

// The change of dλ when the backward's D_p = dY_p · Y_p uses y_got instead of the exact y_ref:
// −Σ_{b,h,p} log(p+1) (1 − g_p) dY_p · (y_got − y_ref)_p, with g_p from stats [B, H, T, 3].
double rounded_y_dlambda_shift(const Tensor& y_got, const Tensor& y_ref, const Tensor& dy,
                               const Tensor& stats) {
  const int64_t T = y_got.dim(1), H = y_got.dim(2), Dh = y_got.dim(3);
  const double *yg = y_got.data<double>(), *yr = y_ref.data<double>(), *g = dy.data<double>();
  const double* st = stats.data<double>();
  return -sum_over_rows(y_got, [&](int64_t b, int64_t t, int64_t h, int64_t row) {
    double delta = 0;
    for (int64_t c = 0; c < Dh; ++c) delta += g[row + c] * (yg[row + c] - yr[row + c]);
    const double gate = st[((b * H + h) * T + t) * 3 + ops::kRelationGate];
    return std::log(double(t + 1)) * (1 - gate) * delta;
  });
}

struct Case {
  int64_t B, T, H, Dh;
  bool exchange_only;
  double tau_s, lambda;
  double amplitude = 2.0;  // p1, p2 uniform in [-amplitude, amplitude]
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_H" << c.H << "_Dh" << c.Dh
      << (c.exchange_only ? "_exchange_only" : "") << "_tau" << c.tau_s << "_lambda" << c.lambda
      << "_amplitude" << c.amplitude;
}

// Every padded-width instantiation (16, ..., 128, with Dh equal to and below the padded width:
// the presets' 48, 60, 64, 80 and 128; Dh % 8 == 4 takes 8-byte cp.async pieces and 50 the
// element-wise loads), T = 1,
// below, just above and several times the 64-row tile (the dK/dV loop over several query tiles,
// 32-row query tiles at 128), B = 1, 2 and 3, H = 2, 4 and 8, exchange-only on and off,
// τ_S ≠ 2, λ of both signs, and larger scores (|U| up to ~15: SiLU far from 0 on both sides).
const Case kCases[] = {
    {2, 1, 4, 48, false, 2.0, 0.5},   {2, 1, 4, 64, true, 2.0, 0.5},
    {2, 63, 8, 48, false, 2.0, 0.5},  {2, 65, 4, 60, true, 2.0, 0.7},
    {2, 130, 4, 64, false, 1.3, 0.5}, {2, 130, 8, 80, true, 2.0, -0.4},
    {2, 97, 4, 128, false, 2.0, 0.5}, {1, 200, 2, 128, true, 0.7, 0.3},
    {2, 65, 4, 8, false, 2.0, 1.0},   {1, 129, 2, 32, false, 2.0, 0.5},
    {2, 70, 4, 96, true, 2.0, 0.5},   {1, 77, 2, 100, false, 2.0, 0.5},
    {2, 64, 4, 64, false, 2.0, 0.5},   {3, 300, 4, 48, false, 2.0, 0.5},
    {2, 257, 4, 64, true, 2.0, 0.5},  {2, 191, 4, 80, false, 2.0, 0.5},
    {1, 129, 2, 60, false, 2.0, 0.5, 3.0}, {2, 150, 2, 128, false, 2.0, -0.3, 3.0},
    {2, 100, 4, 80, true, 1.0, 0.5, 3.0}, {2, 90, 4, 50, false, 2.0, 0.5},
};

class GpuRelation : public ::testing::TestWithParam<Case> {};

// Forward: y against the materialized F64 reference, stats against the CPU FlashRelation's.
// Backward: dp1, dp2, dv and dλ against the CPU FlashRelation backward fed the GPU's y
// (kTight) and against the materialized reference (kLoose).
void check_forward_backward(const Case& c) {
  Rng rng(2000 + c.T * 7 + c.Dh + (c.exchange_only ? 1 : 0));
  const Shape shape{c.B, c.T, c.H, c.Dh}, stats_shape{c.B, c.H, c.T, 3};
  const Tensor p1 = random_bf16(shape, rng, -c.amplitude, c.amplitude);
  const Tensor p2 = random_bf16(shape, rng, -c.amplitude, c.amplitude);
  const Tensor v = random_bf16(shape, rng, -1.0, 1.0);
  const Tensor dy = random_bf16(shape, rng, -1.0, 1.0);
  const Tensor p1_64 = p1.to(DType::F64), p2_64 = p2.to(DType::F64), v64 = v.to(DType::F64),
               dy64 = dy.to(DType::F64);
  // λ as the kernel sees it (an F32), so that the reference uses the same value.
  const double lambda = static_cast<float>(c.lambda);
  ops::RelationOptions ref_options;
  ref_options.tau_s = static_cast<float>(c.tau_s);
  ref_options.exchange_only = c.exchange_only;
  cuda::RelationKernelOptions options;
  options.tau_s = static_cast<float>(c.tau_s);
  options.exchange_only = c.exchange_only;

  const Tensor p1_dev = to_device(p1), p2_dev = to_device(p2), v_dev = to_device(v);
  const Tensor lambda_dev = device_scalar(static_cast<float>(lambda));
  Tensor y_dev = poisoned(shape, DType::BF16);
  Tensor stats_dev = poisoned(stats_shape, DType::F32);
  cuda::flash_relation_forward(p1_dev, p2_dev, v_dev, lambda_dev.data<float>(), y_dev, stats_dev,
                               options);
  const Tensor y_got = to_host_f64(y_dev), stats_got = to_host_f64(stats_dev);

  Tensor y_ref, y_flash, stats_ref;
  ops::relation_reference_forward(p1_64, p2_64, v64, lambda, y_ref, ref_options);
  ops::flash_relation_forward(p1_64, p2_64, v64, lambda, y_flash, stats_ref, ref_options);
  EXPECT_LT(error(y_got, y_ref), kTight);
  const double score_error = kSigmoid * max_abs_score(p1_64, p2_64);  // e_E
  const double stats_slack[3] = {score_error, 0.0, score_error / 4};
  EXPECT_EQ(stats_excess(stats_got, stats_ref, stats_slack), 0.0) << "e_E = " << score_error;

  const Tensor dy_dev = to_device(dy);
  Tensor dp1 = poisoned(shape, DType::BF16), dp2 = poisoned(shape, DType::BF16),
         dv = poisoned(shape, DType::BF16);
  const float dlambda_start = 0.25f;  // the call accumulates into it
  Tensor dlambda_dev = device_scalar(dlambda_start);
  Tensor workspace = backward_workspace(c.B, c.T, c.H);
  cuda::flash_relation_backward(p1_dev, p2_dev, v_dev, lambda_dev.data<float>(), y_dev, stats_dev,
                                dy_dev, dp1, dp2, dv, dlambda_dev.data<float>(), options,
                                workspace);
  const Tensor dp1_got = to_host_f64(dp1), dp2_got = to_host_f64(dp2), dv_got = to_host_f64(dv);
  const double dlambda_got = static_cast<double>(host_scalar(dlambda_dev)) - dlambda_start;

  Tensor dp1_flash, dp2_flash, dv_flash;
  const double dlambda_flash =
      ops::flash_relation_backward(p1_64, p2_64, v64, lambda, y_got, stats_ref, dy64, dp1_flash,
                                   dp2_flash, dv_flash, ref_options);
  EXPECT_LT(error(dp1_got, dp1_flash), kTight);
  EXPECT_LT(error(dp2_got, dp2_flash), kTight);
  EXPECT_LT(error(dv_got, dv_flash), kTight);
  const double dlambda_tol = kDlambda * std::max(std::fabs(dlambda_flash), 1.0) +
                            gate_dlambda_bound(y_got, v64, dy64, c.exchange_only, score_error / 4);
  EXPECT_LE(std::fabs(dlambda_got - dlambda_flash), dlambda_tol)
      << "got " << dlambda_got << ", CPU FlashRelation " << dlambda_flash;

  Tensor dp1_ref, dp2_ref, dv_ref;
  const double dlambda_ref = ops::relation_reference_backward(
      p1_64, p2_64, v64, lambda, dy64, dp1_ref, dp2_ref, dv_ref, ref_options);
  EXPECT_LT(error(dp1_got, dp1_ref), kLoose);
  EXPECT_LT(error(dp2_got, dp2_ref), kLoose);
  EXPECT_LT(error(dv_got, dv_ref), kLoose);
  // End to end, dλ = Σ_p log(p+1) (1 − g_p) (dF_pp − D_p) also sees the bf16 rounding of y
  // through D_p = dY_p · Y_p. dλ is a sum with cancellations, so that shift is not small against
  // dλ itself; it is known exactly, though: −Σ_p log(p+1) (1 − g_p) dY_p · (Y_gpu − Y_exact).
  EXPECT_LE(
      std::fabs(dlambda_got - dlambda_ref - rounded_y_dlambda_shift(y_got, y_ref, dy64, stats_ref)),
      dlambda_tol)
      << "got " << dlambda_got << ", reference " << dlambda_ref;
  if (c.T > 1) EXPECT_NE(dlambda_got, 0.0);
}

// The kernels load their tiles by TMA at head widths that are multiples of 8, by cp.async in
// 8-byte pieces at the other multiples of 4 (the cases of width 60 and 100), element by element
// at width 50.
TEST_P(GpuRelation, ForwardAndBackwardMatchTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_forward_backward(GetParam());
}

// The one-pass dQ (cuda::flash_dq_atomics: the warp-specialized dK/dV pass adds dQ's shares by
// bulk reductions) within the same bounds; head widths that are not a multiple of 8 or are
// above 96 keep the two passes.
TEST_P(GpuRelation, OnePassDqMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const gpu_testing::OnePassDq one_pass;
  check_forward_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuRelation, ::testing::ValuesIn(kCases));

// The backward sums in a fixed order without atomics: two runs agree bit for bit (dλ included).
// Also covers 3-d inputs ([T, H, Dh], stats [H, T, 3]) and a null dλ.
void check_reproducible(int64_t Dh) {
  Rng rng(91);
  const int64_t T = 150, H = 4;
  const Shape shape{T, H, Dh};
  const Tensor p1 = to_device(random_bf16(shape, rng, -2.0, 2.0));
  const Tensor p2 = to_device(random_bf16(shape, rng, -2.0, 2.0));
  const Tensor v = to_device(random_bf16(shape, rng, -1.0, 1.0));
  const Tensor dy = to_device(random_bf16(shape, rng, -1.0, 1.0));
  const Tensor lambda = device_scalar(0.5f);
  const cuda::RelationKernelOptions options;
  Tensor y = poisoned(shape, DType::BF16), stats = poisoned({H, T, 3}, DType::F32);
  cuda::flash_relation_forward(p1, p2, v, lambda.data<float>(), y, stats, options);
  Tensor workspace = backward_workspace(1, T, H);
  Tensor dp1[3], dp2[3], dv[3], dlambda[2];
  for (int run = 0; run < 3; ++run) {
    dp1[run] = poisoned(shape, DType::BF16);
    dp2[run] = poisoned(shape, DType::BF16);
    dv[run] = poisoned(shape, DType::BF16);
    float* dl = nullptr;
    if (run < 2) {
      dlambda[run] = device_scalar(0.0f);
      dl = dlambda[run].data<float>();
    }
    cuda::flash_relation_backward(p1, p2, v, lambda.data<float>(), y, stats, dy, dp1[run], dp2[run],
                                  dv[run], dl, options, workspace);
  }
  for (Tensor* g : {dp1, dp2, dv}) {
    const Tensor a = to_host_f64(g[0]);
    EXPECT_GT(norm(a), 0.0);
    for (int run = 1; run < 3; ++run) {
      const Tensor b = to_host_f64(g[run]);
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    }
  }
  const float l0 = host_scalar(dlambda[0]), l1 = host_scalar(dlambda[1]);
  EXPECT_EQ(std::memcmp(&l0, &l1, sizeof(float)), 0);
  EXPECT_NE(l0, 0.0f);
}

TEST(GpuRelationDeterminism, BackwardIsBitwiseReproducible) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_reproducible(64);  // dK/dV by one warpgroup per 64 keys
  check_reproducible(80);  // dK/dV warp-specialized
}

struct DecodeCase {
  int64_t B, T, H, Dh;
  bool exchange_only;
  double tau_s;
  bool graph;  // replay one captured graph at every position
};

void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_H" << c.H << "_Dh" << c.Dh
      << (c.exchange_only ? "_exchange_only" : "") << "_tau" << c.tau_s
      << (c.graph ? "_graph" : "");
}

const DecodeCase kDecodeCases[] = {
    {2, 70, 4, 64, false, 2.0, false}, {2, 70, 4, 64, false, 2.0, true},
    {2, 40, 8, 48, true, 2.0, true},   {1, 66, 2, 80, false, 1.5, false},
    {2, 33, 4, 128, true, 2.0, false}, {2, 20, 4, 60, false, 2.0, true},
};

class GpuRelationDecode : public ::testing::TestWithParam<DecodeCase> {};

// Decoding token by token from an empty cache reproduces the full forward at every position:
// each y_row against the GPU forward's y (4u) and the reference (kTight); the cache holds
// exactly the rows written.
TEST_P(GpuRelationDecode, TokenByTokenMatchesTheFullForward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const DecodeCase c = GetParam();
  Rng rng(3000 + c.T + c.Dh);
  const Shape shape{c.B, c.T, c.H, c.Dh}, row_shape{c.B, c.H, c.Dh};
  const int64_t capacity = c.T + 3;
  const Tensor p1 = random_bf16(shape, rng, -2.0, 2.0);
  const Tensor p2 = random_bf16(shape, rng, -2.0, 2.0);
  const Tensor v = random_bf16(shape, rng, -1.0, 1.0);
  const float lambda = 0.6f;
  cuda::RelationKernelOptions options;
  options.tau_s = static_cast<float>(c.tau_s);
  options.exchange_only = c.exchange_only;
  ops::RelationOptions ref_options;
  ref_options.tau_s = options.tau_s;
  ref_options.exchange_only = c.exchange_only;
  const Tensor lambda_dev = device_scalar(lambda);

  Tensor y_full = poisoned(shape, DType::BF16), stats = poisoned({c.B, c.H, c.T, 3}, DType::F32);
  const Tensor p1_dev = to_device(p1), p2_dev = to_device(p2), v_dev = to_device(v);
  cuda::flash_relation_forward(p1_dev, p2_dev, v_dev, lambda_dev.data<float>(), y_full, stats,
                               options);
  const Tensor y_full_host = to_host_f64(y_full);
  Tensor y_ref;
  ops::relation_reference_forward(p1.to(DType::F64), p2.to(DType::F64), v.to(DType::F64),
                                  static_cast<double>(lambda), y_ref, ref_options);

  Tensor cache_p2 = poisoned({c.B, capacity, c.H, c.Dh}, DType::BF16);
  Tensor cache_v = poisoned({c.B, capacity, c.H, c.Dh}, DType::BF16);
  Tensor p1_row = poisoned(row_shape, DType::BF16), p2_row = poisoned(row_shape, DType::BF16),
         v_row = poisoned(row_shape, DType::BF16), y_row = poisoned(row_shape, DType::BF16);
  Tensor pos_dev = Tensor::empty({1}, DType::F32, Device::CUDA);  // 4 bytes: the int32 position
  int32_t* d_pos = static_cast<int32_t*>(pos_dev.raw());

  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (c.graph) {
    QV_CUDA_CHECK(cudaStreamCreate(&stream));
    QV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::relation_decode_step(p1_row, p2_row, v_row, lambda_dev.data<float>(), cache_p2, cache_v,
                               d_pos, y_row, options, stream);
    QV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    QV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }

  Tensor y_dec = Tensor::empty(shape, DType::F64);
  for (int64_t t = 0; t < c.T; ++t) {
    p1_row.copy_from(p1.slice(1, t, t + 1).clone().reshape(row_shape));
    p2_row.copy_from(p2.slice(1, t, t + 1).clone().reshape(row_shape));
    v_row.copy_from(v.slice(1, t, t + 1).clone().reshape(row_shape));
    const int32_t pos = static_cast<int32_t>(t);
    QV_CUDA_CHECK(cudaMemcpy(d_pos, &pos, sizeof(pos), cudaMemcpyHostToDevice));
    poison(y_row);
    if (c.graph) {
      QV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      QV_CUDA_CHECK(cudaStreamSynchronize(stream));
    } else {
      cuda::relation_decode_step(p1_row, p2_row, v_row, lambda_dev.data<float>(), cache_p2, cache_v,
                                 d_pos, y_row, options);
    }
    const Tensor y_t = to_host_f64(y_row);
    for (int64_t b = 0; b < c.B; ++b)
      std::memcpy(y_dec.data<double>() + (b * c.T + t) * c.H * c.Dh,
                  y_t.data<double>() + b * c.H * c.Dh, sizeof(double) * c.H * c.Dh);
  }
  if (c.graph) {
    QV_CUDA_CHECK(cudaGraphExecDestroy(exec));
    QV_CUDA_CHECK(cudaGraphDestroy(graph));
    QV_CUDA_CHECK(cudaStreamDestroy(stream));
  }

  EXPECT_LT(error(y_dec, y_full_host), kLoose);
  EXPECT_LT(error(y_dec, y_ref), kTight);
  // Per position as well, so a wrong step cannot hide in the norm over all of them.
  for (int64_t t = 0; t < c.T; ++t) {
    const Tensor got = y_dec.slice(1, t, t + 1).clone(), ref = y_ref.slice(1, t, t + 1).clone();
    EXPECT_LT(error(got, ref), kTight) << "position " << t;
  }
  const Tensor cp2 = to_host(cache_p2).slice(1, 0, c.T).clone();
  const Tensor cv = to_host(cache_v).slice(1, 0, c.T).clone();
  EXPECT_EQ(std::memcmp(cp2.raw(), p2.raw(), p2.nbytes()), 0);
  EXPECT_EQ(std::memcmp(cv.raw(), v.raw(), v.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuRelationDecode, ::testing::ValuesIn(kDecodeCases));

// The op-level benchmark (`quiver bench relation --device cuda`) end to end on a small shape
// (T not a multiple of the tile): every variant timed and passing its own float64 check.
TEST(GpuRelationBench, EveryVariantTimedAndChecked) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const bool dq_mode = cuda::flash_dq_atomics();
  cuda::RelationBenchOptions options;
  options.shapes = {{"small", 2, 200, 2, 48}};
  options.runs = 3;
  options.repeat = 1;
  const std::vector<cuda::RelationBenchRow> rows = cuda::bench_relation_cuda(options);
  ASSERT_EQ(rows.size(), 4u);  // {FlashRelation, attention} x {two-pass, one-pass}
  for (const cuda::RelationBenchRow& r : rows) {
    SCOPED_TRACE(r.mixer + " " + r.dq);
    EXPECT_TRUE(r.correct) << "rel. error " << r.rel_error;
    EXPECT_GE(r.rel_error, 0.0);
    EXPECT_GT(r.forward_ms, 0.0);
    EXPECT_GT(r.backward_ms, 0.0);
    EXPECT_DOUBLE_EQ(r.total_ms, r.forward_ms + r.backward_ms);
  }
  EXPECT_EQ(cuda::flash_dq_atomics(), dq_mode);  // the bench restores the dQ mode
}

}  // namespace
