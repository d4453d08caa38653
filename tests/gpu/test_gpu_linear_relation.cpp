// GPU tests of the Linear Relation (src/cuda/linear_relation.h) against the CPU references of
// src/ops/linear_relation.h, run in F64 on the same inputs (p1, p2, v, dy bf16, g and dg fp32,
// all exact in F64).
//
// Tolerances. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 ≈ 3.9e-3. The kernels
// compute in fp32 and round each bf16 output once (within u of the fp32 value elementwise, so
// within u in relative norm). Their fp32 error is far smaller: the decays come from fp32
// running sums G of at most 64 values, so a factor e^{G_i − G_j} is off by about
// (i − j)·2^-24·|G| relative, under 1e-4 even at g = −5 where such factors are tiny anyway;
// dot products over Dh <= 128 and the scan over chunks add ~1e-6. Hence:
//   - y, dv (one rounding of an fp32 value): kTight = 2u;
//   - dp1, dp2 (the normalization backward removes the radial part, a cancellation in fp32
//     before the one rounding): kGrad = 4u;
//   - dg and the states are fp32 outputs (no bf16 rounding): kF32 = 1e-3, four times under u
//     (a bf16-sized slip shows) and ten times over the fp32 error above.
// A wrong kernel (a missed chunk, a wrong decay, mask, head or lane) errs by O(1). Errors are
// ‖got − ref‖ / max(‖ref‖, 1): the floor covers gradients that vanish exactly (T = 1: nothing
// is read from the empty state, so dp1 = dp2 = dg = 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/linear_relation.h"
#include "gpu/gpu_testing.h"
#include "ops/linear_relation.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kU = 1.0 / 256.0;
constexpr double kTight = 2 * kU;
constexpr double kGrad = 4 * kU;
constexpr double kF32 = 1e-3;
constexpr float kTau = 2.0f;

Tensor random_uniform(const Shape& shape, Rng& rng, double lo, double hi, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::F32);
  rng.fill_uniform(t, lo, hi);
  return dtype == DType::F32 ? t : t.to(dtype);
}

double norm(const Tensor& t) {
  const Tensor d = t.to(DType::F64);
  const double* p = d.data<double>();
  double s = 0;
  for (int64_t i = 0; i < d.numel(); ++i) s += p[i] * p[i];
  return std::sqrt(s);
}

// ‖got − ref‖ / max(‖ref‖, 1), both F64 of one shape; NaN (an unwritten output) stays NaN.
double error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  const Tensor g64 = got.to(DType::F64), r64 = ref.to(DType::F64);
  const double* g = g64.data<double>();
  const double* r = r64.data<double>();
  double diff = 0;
  for (int64_t i = 0; i < g64.numel(); ++i) diff += (g[i] - r[i]) * (g[i] - r[i]);
  return std::sqrt(diff) / std::max(norm(r64), 1.0);
}

Tensor minus(const Tensor& a, const Tensor& b) {
  Tensor d = a.to(DType::F64);
  const Tensor b64 = b.to(DType::F64);
  double* p = d.data<double>();
  const double* q = b64.data<double>();
  for (int64_t i = 0; i < d.numel(); ++i) p[i] -= q[i];
  return d;
}

Tensor plus(const Tensor& a, const Tensor& b) {
  Tensor d = a.to(DType::F64);
  const Tensor b64 = b.to(DType::F64);
  double* p = d.data<double>();
  const double* q = b64.data<double>();
  for (int64_t i = 0; i < d.numel(); ++i) p[i] += q[i];
  return d;
}

// Host inputs of one problem: p1, p2, v, dy bf16; g fp32 in [g_lo, 0].
struct Problem {
  Tensor p1, p2, v, g, dy;
  Problem(const Shape& shape, Rng& rng, double g_lo)
      : p1(random_uniform(shape, rng, -2.0, 2.0, DType::BF16)),
        p2(random_uniform(shape, rng, -2.0, 2.0, DType::BF16)),
        v(random_uniform(shape, rng, -1.0, 1.0, DType::BF16)),
        g(random_uniform(shape, rng, g_lo, 0.0, DType::F32)),
        dy(random_uniform(shape, rng, -1.0, 1.0, DType::BF16)) {}
};

struct DeviceProblem {
  Tensor p1, p2, v, g, dy;
  explicit DeviceProblem(const Problem& p)
      : p1(to_device(p.p1)), p2(to_device(p.p2)), v(to_device(p.v)), g(to_device(p.g)),
        dy(to_device(p.dy)) {}
};

Tensor workspace_for(int64_t B, int64_t T, int64_t H, int64_t Dh) {
  const int64_t bytes = cuda::linear_relation_workspace_bytes(B, T, H, Dh);
  const int64_t floats = std::max<int64_t>((bytes + 3) / 4, 1);
  Tensor ws = Tensor::empty({floats}, DType::F32, Device::CUDA);
  poison(ws);
  return ws;
}

// Forward (y, final state) and backward against the F64 recurrence for one shape.
void check_against_reference(const Shape& shape, double g_lo, uint64_t seed) {
  Rng rng(seed);
  const Problem pr(shape, rng, g_lo);
  const int lead = static_cast<int>(shape.size()) - 3;
  const int64_t B = lead ? shape[0] : 1, T = shape[lead], H = shape[lead + 1],
                Dh = shape[lead + 2];
  const Tensor p1 = pr.p1.to(DType::F64), p2 = pr.p2.to(DType::F64), v = pr.v.to(DType::F64),
               g = pr.g.to(DType::F64), dy = pr.dy.to(DType::F64);

  Tensor y_ref = Tensor::empty(shape, DType::F64);
  ops::linear_relation_recurrent_forward(p1, p2, v, g, y_ref, kTau);
  Tensor y_prefill = Tensor::empty(shape, DType::F64);
  const Tensor state_ref =
      ops::linear_relation_prefill(p1, p2, v, g, y_prefill, DType::F64, 64, kTau);
  Tensor dp1_ref = Tensor::empty(shape, DType::F64), dp2_ref = Tensor::empty(shape, DType::F64),
         dv_ref = Tensor::empty(shape, DType::F64), dg_ref = Tensor::empty(shape, DType::F64);
  ops::linear_relation_recurrent_backward(p1, p2, v, g, dy, dp1_ref, dp2_ref, dv_ref, dg_ref,
                                          kTau);

  const DeviceProblem dev(pr);
  Tensor ws = workspace_for(B, T, H, Dh);
  Tensor y = poisoned(shape, DType::BF16);
  Tensor state = poisoned({B, H, Dh, Dh}, DType::F32);
  cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.g, y, kTau, ws, &state);
  EXPECT_LT(error(to_host_f64(y), y_ref), kTight) << "y";
  EXPECT_LT(error(to_host_f64(state), state_ref), kF32) << "final_state";

  Tensor dp1 = poisoned(shape, DType::BF16), dp2 = poisoned(shape, DType::BF16),
         dv = poisoned(shape, DType::BF16), dg = poisoned(shape, DType::F32);
  poison(ws);
  cuda::linear_relation_backward(dev.p1, dev.p2, dev.v, dev.g, dev.dy, dp1, dp2, dv, dg, kTau, ws);
  EXPECT_LT(error(to_host_f64(dp1), dp1_ref), kGrad) << "dp1";
  EXPECT_LT(error(to_host_f64(dp2), dp2_ref), kGrad) << "dp2";
  EXPECT_LT(error(to_host_f64(dv), dv_ref), kTight) << "dv";
  EXPECT_LT(error(to_host_f64(dg), dg_ref), kF32) << "dg";
}

// Head widths of the presets and the widest, lengths around the 64-token chunk; gates mild
// (g in [−0.05, 0]: memory across many chunks) and strong (g in [−5, 0]).
using Case = std::tuple<int64_t, int64_t, bool>;  // Dh, T, strong gate
const int64_t kHeadWidths[] = {48, 60, 64, 80, 128};
const int64_t kLengths[] = {1, 63, 65, 200};

class GpuLinearRelation : public ::testing::TestWithParam<Case> {};

TEST_P(GpuLinearRelation, ForwardAndBackwardMatchTheRecurrence) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto [Dh, T, strong] = GetParam();
  check_against_reference({2, T, 4, Dh}, strong ? -5.0 : -0.05,
                          static_cast<uint64_t>(1000 + 10 * Dh + T + (strong ? 7 : 0)));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const int64_t Dh = std::get<0>(info.param), T = std::get<1>(info.param);
  return "Dh" + std::to_string(Dh) + "_T" + std::to_string(T) +
         (std::get<2>(info.param) ? "_strong" : "_mild");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLinearRelation,
                         ::testing::Combine(::testing::ValuesIn(kHeadWidths),
                                            ::testing::ValuesIn(kLengths), ::testing::Bool()),
                         case_name);

// The padded widths the presets do not reach (16, 32, 96, 112, with Dh below and at the pad),
// three and more chunks with a partial last one, and a 3-d [T, H, Dh] input (B = 1).
TEST(GpuLinearRelationWidths, EveryPaddedWidthMatchesTheRecurrence) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Shape shapes[] = {{2, 130, 3, 8},  {1, 200, 2, 16}, {2, 129, 2, 32},
                          {1, 150, 2, 96}, {2, 70, 2, 100}, {1, 190, 2, 112}};
  uint64_t seed = 50;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(shape_str(s));
    check_against_reference(s, -1.0, seed++);
  }
  SCOPED_TRACE("3-d");
  check_against_reference({140, 3, 60}, -0.5, seed);
}

// No atomics: two backward passes agree bit for bit.
TEST(GpuLinearRelationDeterminism, BackwardIsBitwiseReproducible) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(9);
  const Shape shape{2, 300, 4, 60};
  const Problem pr(shape, rng, -1.0);
  const DeviceProblem dev(pr);
  Tensor ws = workspace_for(2, 300, 4, 60);
  Tensor first[4], second[4];
  for (Tensor* out : {first, second}) {
    out[0] = poisoned(shape, DType::BF16);
    out[1] = poisoned(shape, DType::BF16);
    out[2] = poisoned(shape, DType::BF16);
    out[3] = poisoned(shape, DType::F32);
    cuda::linear_relation_backward(dev.p1, dev.p2, dev.v, dev.g, dev.dy, out[0], out[1], out[2],
                                   out[3], kTau, ws);
  }
  for (int i = 0; i < 4; ++i) {
    const Tensor a = to_host(first[i]), b = to_host(second[i]);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "output " << i;
  }
}

// Row t of a host [B, T, H, Dh] tensor as a device [B, H, Dh] tensor.
Tensor device_row(const Tensor& host, int64_t t) {
  const Tensor row = host.slice(1, t, t + 1).clone();
  return to_device(row.reshape({host.dim(0), host.dim(2), host.dim(3)}));
}

// Decoding token by token from a zero state equals the full forward (and the recurrence);
// a prefill's final state, decoded onward, equals the full forward too.
TEST(GpuLinearRelationDecode, StepsAndPrefillContinueTheFullForward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t Dh : {60, 128}) {
    SCOPED_TRACE(Dh);
    const int64_t B = 2, T = 150, H = 4, T0 = 100;  // the prefill ends inside a chunk
    const Shape shape{B, T, H, Dh};
    Rng rng(300 + Dh);
    const Problem pr(shape, rng, -0.3);
    const DeviceProblem dev(pr);

    Tensor y_ref = Tensor::empty(shape, DType::F64);
    ops::linear_relation_recurrent_forward(pr.p1.to(DType::F64), pr.p2.to(DType::F64),
                                           pr.v.to(DType::F64), pr.g.to(DType::F64), y_ref, kTau);
    Tensor ws = workspace_for(B, T, H, Dh);
    Tensor y_full = poisoned(shape, DType::BF16);
    Tensor state_full = poisoned({B, H, Dh, Dh}, DType::F32);
    cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.g, y_full, kTau, ws, &state_full);
    const Tensor y_full_host = to_host_f64(y_full);
    ASSERT_LT(error(y_full_host, y_ref), kTight);

    // Token by token from C_{−1} = 0.
    Tensor state = Tensor::zeros({B, H, Dh, Dh}, DType::F32, Device::CUDA);
    Tensor y_steps = Tensor::empty(shape, DType::F64);
    Tensor y_row = poisoned({B, H, Dh}, DType::BF16);
    for (int64_t t = 0; t < T; ++t) {
      poison(y_row);
      cuda::linear_relation_decode_step(device_row(pr.p1, t), device_row(pr.p2, t),
                                        device_row(pr.v, t), device_row(pr.g, t), state, y_row,
                                        kTau);
      const Tensor row = to_host_f64(y_row);
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(y_steps.data<double>() + (b * T + t) * H * Dh,
                    row.data<double>() + b * H * Dh, sizeof(double) * H * Dh);
    }
    EXPECT_LT(error(y_steps, y_full_host), kTight) << "decode vs full forward";
    EXPECT_LT(error(y_steps, y_ref), kTight) << "decode vs recurrence";
    EXPECT_LT(error(to_host_f64(state), to_host_f64(state_full)), kF32) << "decoded state";

    // Prefill of the first T0 tokens, then decoding the rest.
    const Shape head_shape{B, T0, H, Dh};
    Tensor head[4];
    const Tensor* sources[4] = {&pr.p1, &pr.p2, &pr.v, &pr.g};
    for (int i = 0; i < 4; ++i) head[i] = to_device(sources[i]->slice(1, 0, T0).clone());
    Tensor y_head = poisoned(head_shape, DType::BF16);
    Tensor prefill_state = poisoned({B, H, Dh, Dh}, DType::F32);
    cuda::linear_relation_forward(head[0], head[1], head[2], head[3], y_head, kTau, ws,
                                  &prefill_state);
    EXPECT_LT(error(to_host_f64(y_head), y_full_host.slice(1, 0, T0).clone()), kTight);
    Tensor y_tail = Tensor::empty({B, T - T0, H, Dh}, DType::F64);
    for (int64_t t = T0; t < T; ++t) {
      poison(y_row);
      cuda::linear_relation_decode_step(device_row(pr.p1, t), device_row(pr.p2, t),
                                        device_row(pr.v, t), device_row(pr.g, t), prefill_state,
                                        y_row, kTau);
      const Tensor row = to_host_f64(y_row);
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(y_tail.data<double>() + (b * (T - T0) + (t - T0)) * H * Dh,
                    row.data<double>() + b * H * Dh, sizeof(double) * H * Dh);
    }
    EXPECT_LT(error(y_tail, y_full_host.slice(1, T0, T).clone()), kTight) << "prefill + decode";
    EXPECT_LT(error(to_host_f64(prefill_state), to_host_f64(state_full)), kF32)
        << "state after prefill + decode";
  }
}

TEST(GpuLinearRelationChecks, BadArgumentsThrowNamingTheTensor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(4);
  const Shape shape{1, 10, 2, 16};
  const DeviceProblem dev(Problem(shape, rng, -1.0));
  Tensor ws = workspace_for(1, 10, 2, 16);
  Tensor small = Tensor::empty({8}, DType::F32, Device::CUDA);
  Tensor y = Tensor::empty(shape, DType::BF16, Device::CUDA);
  Tensor y_f32 = Tensor::empty(shape, DType::F32, Device::CUDA);
  Tensor bad_state = Tensor::empty({1, 2, 16, 15}, DType::F32, Device::CUDA);
  EXPECT_THROW(cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.g, y_f32, kTau, ws,
                                             nullptr),
               Error);
  EXPECT_THROW(cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.g, y, kTau, small,
                                             nullptr),
               Error);
  EXPECT_THROW(cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.g, y, kTau, ws,
                                             &bad_state),
               Error);
  EXPECT_THROW(cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.dy, y, kTau, ws, nullptr),
               Error);  // g must be F32
  EXPECT_THROW(cuda::linear_relation_forward(dev.p1, dev.p2, dev.v, dev.g, y, -1.0f, ws, nullptr),
               Error);
  const Tensor wide = Tensor::empty({1, 4, 1, 136}, DType::BF16, Device::CUDA);
  Tensor wide_y = Tensor::empty({1, 4, 1, 136}, DType::BF16, Device::CUDA);
  EXPECT_THROW(cuda::linear_relation_forward(wide, wide, wide, wide, wide_y, kTau, ws, nullptr),
               Error);
}

// Retention gate: N = 74 rows, D = 96, H = 4, Dh = 60.
// r_down is one bf16 rounding of an fp32 product: 2u. g sees r from the bf16 r_down (u/√3 of
// r's scale, typically) through a Lipschitz softplus: 4u. The backward chains up to three bf16
// roundings (r recomputed in bf16, dz in bf16, d(r_down) in bf16) before the fp32 GEMMs:
// ddt_bias and da_log (fp32 sums of dz from the bf16 r): 4u; dw_up (bf16 r_down and dz): 6u;
// dw_down and dx (also d(r_down), and dx's own rounding): 8u. A wrong product, transpose or
// head index errs by O(1); an assignment instead of an accumulation errs by the start value.
TEST(GpuRetentionGate, ForwardAndBackwardMatchTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // N = 1000: the chunked reduction of the gate's sums (several row chunks per head).
  for (const int64_t N : {int64_t{74}, int64_t{1000}}) {
    SCOPED_TRACE("N = " + std::to_string(N));
    const int64_t D = 96, H = 4, Dh = 60, HD = H * Dh;
    Rng rng(21);
    const Tensor x = random_uniform({N, D}, rng, -1.0, 1.0, DType::BF16);
    const Tensor w_down = random_uniform({D, Dh}, rng, -0.2, 0.2, DType::BF16);
    const Tensor w_up = random_uniform({Dh, HD}, rng, -0.3, 0.3, DType::BF16);
    const Tensor a_log = random_uniform({H}, rng, -1.0, 0.5, DType::F32);
    const Tensor dt_bias = random_uniform({HD}, rng, -1.0, 1.0, DType::F32);
    const Tensor dg = random_uniform({N, HD}, rng, -1.0, 1.0, DType::F32);

    const Tensor x64 = x.to(DType::F64), wd64 = w_down.to(DType::F64), wu64 = w_up.to(DType::F64),
                 al64 = a_log.to(DType::F64), b64 = dt_bias.to(DType::F64);
    Tensor g_ref = Tensor::empty({N, H, Dh}, DType::F64);
    ops::retention_gate_forward(x64, wd64, wu64, al64, b64, g_ref);
    Tensor rd_ref = Tensor::zeros({N, Dh}, DType::F64);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < Dh; ++k) {
        double s = 0;
        for (int64_t i = 0; i < D; ++i)
          s += x64.data<double>()[n * D + i] * wd64.data<double>()[i * Dh + k];
        rd_ref.data<double>()[n * Dh + k] = s;
      }

    const Tensor x_d = to_device(x), wd_d = to_device(w_down), wu_d = to_device(w_up),
                 al_d = to_device(a_log), b_d = to_device(dt_bias), dg_d = to_device(dg);
    Tensor r_down = poisoned({N, Dh}, DType::BF16), g = poisoned({N, HD}, DType::F32);
    cuda::retention_gate_forward(x_d, wd_d, wu_d, al_d, b_d, r_down, g);
    EXPECT_LT(error(to_host_f64(r_down), rd_ref), 2 * kU) << "r_down";
    EXPECT_LT(error(to_host_f64(g), g_ref.reshape({N, HD})), 4 * kU) << "g";

    Tensor dx_ref = Tensor::empty({N, D}, DType::F64), dwd_ref = Tensor::empty({D, Dh}, DType::F64),
           dwu_ref = Tensor::empty({Dh, HD}, DType::F64), dal_ref = Tensor::empty({H}, DType::F64),
           db_ref = Tensor::empty({HD}, DType::F64);
    ops::retention_gate_backward(x64, wd64, wu64, al64, b64, dg.to(DType::F64).reshape({N, H, Dh}),
                                 dx_ref, dwd_ref, dwu_ref, dal_ref, db_ref);

    // Accumulators start from non-zero values.
    const Tensor dx0 = random_uniform({N, D}, rng, -0.5, 0.5, DType::BF16);
    const Tensor dwd0 = random_uniform({D, Dh}, rng, -1.0, 1.0, DType::F32);
    const Tensor dwu0 = random_uniform({Dh, HD}, rng, -1.0, 1.0, DType::F32);
    const Tensor dal0 = random_uniform({H}, rng, -1.0, 1.0, DType::F32);
    const Tensor db0 = random_uniform({HD}, rng, -1.0, 1.0, DType::F32);
    Tensor dx = to_device(dx0), dwd = to_device(dwd0), dwu = to_device(dwu0), dal = to_device(dal0),
           db = to_device(db0);
    Tensor scratch_dr = poisoned({N, HD}, DType::BF16), scratch_down = poisoned({N, Dh}, DType::BF16);
    cuda::retention_gate_backward(x_d, wd_d, wu_d, al_d, b_d, r_down, dg_d, dx, dwd, dwu, dal, db,
                                  scratch_dr, scratch_down);
    EXPECT_LT(error(to_host_f64(dx), plus(dx0, dx_ref)), 8 * kU) << "dx";
    EXPECT_LT(error(minus(to_host(dwd), dwd0), dwd_ref), 8 * kU) << "dw_down";
    EXPECT_LT(error(minus(to_host(dwu), dwu0), dwu_ref), 6 * kU) << "dw_up";
    EXPECT_LT(error(minus(to_host(dal), dal0), dal_ref), 4 * kU) << "da_log";
    EXPECT_LT(error(minus(to_host(db), db0), db_ref), 4 * kU) << "ddt_bias";
    // Sanity of the floor: the references are far from vanishing.
    EXPECT_GT(norm(dal_ref), 1.0);
    EXPECT_GT(norm(db_ref), 1.0);
  }
}

bool all_finite(const Tensor& dev) {
  const Tensor h = to_host_f64(dev);
  const double* p = h.data<double>();
  for (int64_t i = 0; i < h.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

// Forward + backward time at the hybrid30m width (H = 8, Dh = 60), B = 1. Prints the numbers;
// asserts only that the outputs are finite.
TEST(GpuLinearRelationTiming, HybridWidthForwardBackward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t H = 8, Dh = 60, T_max = 65536;
  const Shape max_shape{1, T_max, H, Dh};
  size_t free_before = 0, total = 0;
  QV_CUDA_CHECK(cudaDeviceSynchronize());
  QV_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  Rng rng(5);
  const DeviceProblem dev(Problem(max_shape, rng, -0.5));
  Tensor y = Tensor::empty(max_shape, DType::BF16, Device::CUDA),
         dp1 = Tensor::empty(max_shape, DType::BF16, Device::CUDA),
         dp2 = Tensor::empty(max_shape, DType::BF16, Device::CUDA),
         dv = Tensor::empty(max_shape, DType::BF16, Device::CUDA),
         dg = Tensor::empty(max_shape, DType::F32, Device::CUDA);
  Tensor ws = workspace_for(1, T_max, H, Dh);
  QV_CUDA_CHECK(cudaDeviceSynchronize());
  size_t free_after = 0;
  QV_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  std::printf("[timing] linear relation H=%lld Dh=%lld B=1: device memory for T=%lld "
              "(inputs, outputs, workspace) %.1f MiB\n",
              static_cast<long long>(H), static_cast<long long>(Dh),
              static_cast<long long>(T_max),
              static_cast<double>(free_before - free_after) / (1 << 20));

  cudaEvent_t e0, e1, e2;
  QV_CUDA_CHECK(cudaEventCreate(&e0));
  QV_CUDA_CHECK(cudaEventCreate(&e1));
  QV_CUDA_CHECK(cudaEventCreate(&e2));
  for (const int64_t T : {1024, 4096, 16384, 65536}) {
    const Shape shape{1, T, H, Dh};
    auto view = [&](const Tensor& t) {
      return Tensor::wrap(t.raw(), shape, t.dtype(), Device::CUDA);
    };
    const Tensor p1 = view(dev.p1), p2 = view(dev.p2), v = view(dev.v), g = view(dev.g),
                 dy = view(dev.dy);
    Tensor yv = view(y), dp1v = view(dp1), dp2v = view(dp2), dvv = view(dv), dgv = view(dg);
    auto forward = [&] { cuda::linear_relation_forward(p1, p2, v, g, yv, kTau, ws, nullptr); };
    auto backward = [&] {
      cuda::linear_relation_backward(p1, p2, v, g, dy, dp1v, dp2v, dvv, dgv, kTau, ws);
    };
    forward();
    backward();
    const int iters = T <= 4096 ? 20 : 5;
    QV_CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) forward();
    QV_CUDA_CHECK(cudaEventRecord(e1));
    for (int i = 0; i < iters; ++i) backward();
    QV_CUDA_CHECK(cudaEventRecord(e2));
    QV_CUDA_CHECK(cudaEventSynchronize(e2));
    float fwd_ms = 0, bwd_ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&fwd_ms, e0, e1));
    QV_CUDA_CHECK(cudaEventElapsedTime(&bwd_ms, e1, e2));
    fwd_ms /= iters;
    bwd_ms /= iters;
    const double ws_mib =
        static_cast<double>(cuda::linear_relation_workspace_bytes(1, T, H, Dh)) / (1 << 20);
    std::printf("[timing] T=%6lld  forward %8.3f ms  backward %8.3f ms  total %8.3f ms  "
                "%10.0f tok/s (fwd+bwd)  workspace %.1f MiB\n",
                static_cast<long long>(T), fwd_ms, bwd_ms, fwd_ms + bwd_ms,
                static_cast<double>(T) / ((fwd_ms + bwd_ms) * 1e-3), ws_mib);
    EXPECT_TRUE(all_finite(yv)) << T;
    EXPECT_TRUE(all_finite(dgv)) << T;
    EXPECT_TRUE(all_finite(dp1v)) << T;
  }
  QV_CUDA_CHECK(cudaEventDestroy(e0));
  QV_CUDA_CHECK(cudaEventDestroy(e1));
  QV_CUDA_CHECK(cudaEventDestroy(e2));
}

}  // namespace
