// GPU tests of the flash attention (src/cuda/attention.h) against the CPU references of
// src/ops/attention.h, run in F64 on the same bf16 inputs.
//
// Tolerances. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 ≈ 3.9e-3. The inputs are
// bf16 already (exact in F64), the kernels compute in fp32 (relative error ~Dh·2^-24 ≈ 1e-5
// at worst, far below u) and round each output to bf16 once, which is within u of the fp32
// value elementwise, so within u in relative norm:
//   - y, and dq/dk/dv against the CPU flash backward given the GPU's own y and the exact
//     lse (the same D_p = dy_p·y_p as the kernel): kTight = 2u.
//   - dq/dk/dv against the materialized reference (end to end: it uses the exact y, the
//     kernel the bf16 y, which perturbs D_p by ~u·|dy||y|/sqrt(Dh), small against the
//     dP − D it enters): kLoose = 4u.
//   - lse is fp32 (no bf16 rounding): fp32 dots and exp/log, ~1e-6 relative: kLse = 2e-5.
// A wrong kernel (a missed tile, a wrong mask, head or scale) errs by O(1). Errors are
// ‖got − ref‖ / max(‖ref‖, 1): the floor covers gradients that vanish exactly (T = 1: the
// softmax over one key has no score gradient, so dq = dk = 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <vector>

#include "cuda/attention.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "gpu/gpu_testing.h"
#include "ops/attention.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kU = 1.0 / 256.0;
constexpr double kTight = 2 * kU;
constexpr double kLoose = 4 * kU;
constexpr double kLse = 2e-5;

// Random bf16 values (host); their F64 copy is exact, so the reference sees the kernel's inputs.
Tensor random_bf16(const Shape& shape, Rng& rng, double lo, double hi) {
  Tensor t = Tensor::empty(shape, DType::F32);
  rng.fill_uniform(t, lo, hi);
  return t.to(DType::BF16);
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
  const double* g = got.data<double>();
  const double* r = ref.data<double>();
  double diff = 0;
  for (int64_t i = 0; i < got.numel(); ++i) diff += (g[i] - r[i]) * (g[i] - r[i]);
  return std::sqrt(diff) / std::max(norm(ref), 1.0);
}

struct Case {
  int64_t B, T, Hq, Hkv, Dh;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_Hq" << c.Hq << "_Hkv" << c.Hkv << "_Dh" << c.Dh;
}

// The cases cover every padded-width instantiation (16, 32, ..., 128, with Dh both equal to
// and below the padded width), T = 1, T below, just above and several times the 64-row tile,
// MHA and GQA groups of 2 and 4, B = 1 and 2.
const Case kCases[] = {
    {2, 1, 4, 4, 64},    {2, 63, 8, 2, 48},  {2, 65, 4, 4, 24},  {2, 200, 8, 2, 128},
    {1, 130, 2, 1, 60},  {2, 97, 4, 2, 80},  {1, 129, 2, 2, 96}, {2, 70, 3, 3, 32},
    {1, 77, 4, 1, 100},  {2, 40, 2, 2, 8},   {1, 64, 2, 1, 128},
};

class GpuAttention : public ::testing::TestWithParam<Case> {};

// Forward: y against the materialized F64 reference, lse against the CPU flash forward's.
// Backward: dq, dk, dv against the CPU flash backward fed the GPU's y (kTight) and against the
// materialized reference (kLoose).
TEST_P(GpuAttention, ForwardAndBackwardMatchTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  Rng rng(1000 + c.T * 7 + c.Dh);
  const Shape q_shape{c.B, c.T, c.Hq, c.Dh}, kv_shape{c.B, c.T, c.Hkv, c.Dh};
  const Tensor q = random_bf16(q_shape, rng, -2.0, 2.0);
  const Tensor k = random_bf16(kv_shape, rng, -2.0, 2.0);
  const Tensor v = random_bf16(kv_shape, rng, -1.0, 1.0);
  const Tensor dy = random_bf16(q_shape, rng, -1.0, 1.0);
  const Tensor q64 = q.to(DType::F64), k64 = k.to(DType::F64), v64 = v.to(DType::F64),
               dy64 = dy.to(DType::F64);

  const Tensor q_dev = to_device(q), k_dev = to_device(k), v_dev = to_device(v);
  Tensor y_dev = poisoned(q_shape, DType::BF16);
  Tensor lse_dev = poisoned({c.B, c.Hq, c.T}, DType::F32);
  cuda::attention_forward(q_dev, k_dev, v_dev, y_dev, lse_dev);
  const Tensor y_got = to_host_f64(y_dev), lse_got = to_host_f64(lse_dev);

  Tensor y_ref, y_flash, lse_ref;
  ops::attention_reference_forward(q64, k64, v64, y_ref);
  ops::attention_forward(q64, k64, v64, y_flash, lse_ref);
  EXPECT_LT(error(y_got, y_ref), kTight);
  EXPECT_LT(error(lse_got, lse_ref), kLse);

  const Tensor dy_dev = to_device(dy);
  Tensor gq = poisoned(q_shape, DType::BF16), gk = poisoned(kv_shape, DType::BF16),
         gv = poisoned(kv_shape, DType::BF16);
  cuda::attention_backward(q_dev, k_dev, v_dev, y_dev, lse_dev, dy_dev, gq, gk, gv);
  const Tensor gq_got = to_host_f64(gq), gk_got = to_host_f64(gk), gv_got = to_host_f64(gv);

  Tensor dq_flash, dk_flash, dv_flash;
  ops::attention_backward(q64, k64, v64, y_got, lse_ref, dy64, dq_flash, dk_flash, dv_flash);
  EXPECT_LT(error(gq_got, dq_flash), kTight);
  EXPECT_LT(error(gk_got, dk_flash), kTight);
  EXPECT_LT(error(gv_got, dv_flash), kTight);

  Tensor dq_ref, dk_ref, dv_ref;
  ops::attention_reference_backward(q64, k64, v64, dy64, dq_ref, dk_ref, dv_ref);
  EXPECT_LT(error(gq_got, dq_ref), kLoose);
  EXPECT_LT(error(gk_got, dk_ref), kLoose);
  EXPECT_LT(error(gv_got, dv_ref), kLoose);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention, ::testing::ValuesIn(kCases));

// The backward sums dk/dv over query tiles and heads in a fixed order and computes dq without
// atomics: two runs agree bit for bit. Also covers 3-d inputs ([T, H, Dh], lse [Hq, T]) and
// outputs allocated by the call.
TEST(GpuAttentionDeterminism, BackwardIsBitwiseReproducible) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(77);
  const int64_t T = 150, Hq = 4, Hkv = 2, Dh = 64;
  const Tensor q = to_device(random_bf16({T, Hq, Dh}, rng, -2.0, 2.0));
  const Tensor k = to_device(random_bf16({T, Hkv, Dh}, rng, -2.0, 2.0));
  const Tensor v = to_device(random_bf16({T, Hkv, Dh}, rng, -1.0, 1.0));
  const Tensor dy = to_device(random_bf16({T, Hq, Dh}, rng, -1.0, 1.0));
  Tensor y, lse;
  cuda::attention_forward(q, k, v, y, lse);
  EXPECT_EQ(lse.shape(), (Shape{Hq, T}));
  Tensor dq[2], dk[2], dv[2];
  for (int run = 0; run < 2; ++run)
    cuda::attention_backward(q, k, v, y, lse, dy, dq[run], dk[run], dv[run]);
  for (Tensor* g : {dq, dk, dv}) {
    const Tensor a = to_host_f64(g[0]), b = to_host_f64(g[1]);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    EXPECT_GT(norm(a), 0.0);
  }
}

}  // namespace
