// GPU tests of the Givens head mixing (src/cuda/givens.h) against the CPU reference of
// src/ops/givens.h, run in F64 on the same bf16 inputs and the same F32 angles.
//
// Tolerances. Each output element is a two-term rotation computed in fp32 (cos, sin and the
// products within a few 2^-24) and rounded to bf16 once, so within u = 2^-8 of the exact value
// elementwise and in relative norm: kTight = 2u for out and dI. dθ is an fp64 sum of fp32
// products (each within ~2^-22 of exact), so its relative error is ~1e-6: kTheta = 1e-4 of
// max(‖dθ‖, 1). A wrong pairing, sign or angle errs by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>

#include "cuda/givens.h"
#include "gpu/gpu_testing.h"
#include "ops/givens.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kU = 1.0 / 256.0;
constexpr double kTight = 2 * kU;
constexpr double kTheta = 1e-4;

struct Case {
  Shape shape;  // [..., H, Dh]
  int64_t layer;
  bool in_place;  // out aliases I (forward) and dI aliases dOut (backward)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << shape_str(c.shape) << "_layer" << c.layer << (c.in_place ? "_in_place" : "");
}

// H = 8 on even and odd layers ([B, T, H, Dh] and the decode shape [B, H, Dh] read as
// [T, H, Dh]), H = 2 on an odd layer (the pair (1, 0)), H = 1 (the identity), in place and not.
const Case kCases[] = {
    {{2, 37, 8, 48}, 0, false}, {{2, 37, 8, 48}, 1, false}, {{2, 37, 8, 48}, 3, true},
    {{3, 8, 60}, 1, false},     {{2, 5, 2, 16}, 1, false},  {{2, 9, 1, 64}, 0, false},
    {{2, 9, 1, 64}, 1, true},   {{1, 70, 8, 80}, 2, true},
};

class GpuGivens : public ::testing::TestWithParam<Case> {};

TEST_P(GpuGivens, ForwardAndBackwardMatchTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const int64_t H = c.shape[c.shape.size() - 2];
  Rng rng(4000 + c.layer * 17 + H);
  const Tensor I = random_bf16(c.shape, rng, -1.0, 1.0);
  const Tensor dout = random_bf16(c.shape, rng, -1.0, 1.0);
  Tensor theta = Tensor::empty({H / 2}, DType::F32);
  rng.fill_uniform(theta, -3.0, 3.0);
  Tensor dtheta_start = Tensor::empty({H / 2}, DType::F32);
  rng.fill_uniform(dtheta_start, -1.0, 1.0);
  const Tensor I64 = I.to(DType::F64), dout64 = dout.to(DType::F64);

  const Tensor I_dev = to_device(I), theta_dev = to_device(theta);
  Tensor out = c.in_place ? to_device(I) : poisoned(c.shape, DType::BF16);
  cuda::givens_forward(c.in_place ? out : I_dev, theta_dev, c.layer, out);
  Tensor out_ref = Tensor::empty(c.shape, DType::F64);
  ops::givens_forward(I64, theta, c.layer, out_ref);
  EXPECT_LT(error(to_host_f64(out), out_ref), kTight);

  Tensor dI = c.in_place ? to_device(dout) : poisoned(c.shape, DType::BF16);
  const Tensor dout_dev = to_device(dout);
  Tensor dtheta = to_device(dtheta_start);
  cuda::givens_backward(c.in_place ? dI : dout_dev, I_dev, theta_dev, c.layer, dI, dtheta);
  Tensor dI_ref = Tensor::empty(c.shape, DType::F64);
  Tensor dtheta_ref = Tensor::empty({H / 2}, DType::F32);
  ops::givens_backward(dout64, I64, theta, c.layer, dI_ref, dtheta_ref);
  EXPECT_LT(error(to_host_f64(dI), dI_ref), kTight);

  const Tensor dtheta_got = to_host_f64(dtheta);
  Tensor dtheta_delta = Tensor::empty({H / 2}, DType::F64);
  for (int64_t k = 0; k < H / 2; ++k)
    dtheta_delta.data<double>()[k] =
        dtheta_got.data<double>()[k] - static_cast<double>(dtheta_start.data<float>()[k]);
  EXPECT_LT(error(dtheta_delta, dtheta_ref.to(DType::F64)), kTheta);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGivens, ::testing::ValuesIn(kCases));

// The mixing folded into the information projection: the rotated weight (fp32 masters in, one
// bf16 rounding out: kTight) and its backward (dW = base + Gᵀ dW̃ in fp32: within a few 2^-24
// relative, kFp32; dθ like the states' within kTheta). Shapes: W_I [K, H, Dh] on even and odd
// layers, b_I [H, Dh], H = 2 on an odd layer.
TEST(GpuGivensWeights, FoldedRotationAndItsBackwardMatchTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr double kFp32 = 1e-6;
  const std::pair<Shape, int64_t> cases[] = {{{37, 8, 48}, 0}, {{64, 8, 64}, 1}, {{8, 60}, 3}, {{5, 2, 16}, 1}};
  for (const auto& [shape, layer] : cases) {
    const int64_t H = shape[shape.size() - 2];
    Rng rng(5000 + layer * 13 + H);
    auto random_f32 = [&](double lo, double hi) {
      Tensor t = Tensor::empty(shape, DType::F32);
      rng.fill_uniform(t, lo, hi);
      return t;
    };
    const Tensor w = random_f32(-1.0, 1.0), dw_rot = random_f32(-1.0, 1.0), base = random_f32(-1.0, 1.0);
    Tensor theta = Tensor::empty({H / 2}, DType::F32);
    rng.fill_uniform(theta, -3.0, 3.0);
    Tensor dtheta_start = Tensor::empty({H / 2}, DType::F32);
    rng.fill_uniform(dtheta_start, -1.0, 1.0);
    const Tensor w_dev = to_device(w), theta_dev = to_device(theta);
    // The CPU reference takes states [T, H, Dh] or [B, T, H, Dh]: b_I [H, Dh] as one row.
    const Shape ref_shape = shape.size() == 2 ? Shape{1, shape[0], shape[1]} : shape;
    const Tensor w64 = w.to(DType::F64).reshape(ref_shape);

    Tensor out = poisoned(shape, DType::BF16);
    cuda::givens_rotate_weight(w_dev, theta_dev, layer, out);
    Tensor out_ref = Tensor::empty(ref_shape, DType::F64);
    ops::givens_forward(w64, theta, layer, out_ref);
    EXPECT_LT(error(to_host_f64(out).reshape(ref_shape), out_ref), kTight) << shape_str(shape) << " layer " << layer;

    Tensor dw = to_device(dw_rot), dtheta = to_device(dtheta_start);
    cuda::givens_weight_backward(dw, to_device(base), w_dev, theta_dev, layer, dtheta);
    Tensor dw_ref = Tensor::empty(ref_shape, DType::F64);
    Tensor dtheta_ref = Tensor::empty({H / 2}, DType::F32);
    ops::givens_backward(dw_rot.to(DType::F64).reshape(ref_shape), w64, theta, layer, dw_ref, dtheta_ref);
    const Tensor base64 = base.to(DType::F64);
    for (int64_t i = 0; i < dw_ref.numel(); ++i) dw_ref.data<double>()[i] += base64.data<double>()[i];
    EXPECT_LT(error(to_host_f64(dw).reshape(ref_shape), dw_ref), kFp32) << shape_str(shape) << " layer " << layer;
    const Tensor dtheta_got = to_host_f64(dtheta);
    Tensor dtheta_delta = Tensor::empty({H / 2}, DType::F64);
    for (int64_t k = 0; k < H / 2; ++k)
      dtheta_delta.data<double>()[k] =
          dtheta_got.data<double>()[k] - static_cast<double>(dtheta_start.data<float>()[k]);
    EXPECT_LT(error(dtheta_delta, dtheta_ref.to(DType::F64)), kTheta) << shape_str(shape) << " layer " << layer;

    EXPECT_THROW(cuda::givens_weight_backward(dw, dw, w_dev, theta_dev, layer, dtheta), Error);  // base is dw
  }
}

// dθ is summed in a fixed order: two runs agree bit for bit.
TEST(GpuGivensDeterminism, DthetaIsBitwiseReproducible) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(12);
  const Shape shape{4, 300, 8, 64};
  const Tensor I = to_device(random_bf16(shape, rng, -1.0, 1.0));
  const Tensor dout = to_device(random_bf16(shape, rng, -1.0, 1.0));
  Tensor theta_host = Tensor::empty({4}, DType::F32);
  rng.fill_uniform(theta_host, -1.0, 1.0);
  const Tensor theta = to_device(theta_host);
  Tensor dtheta[2], dI[2];
  for (int run = 0; run < 2; ++run) {
    dtheta[run] = Tensor::zeros({4}, DType::F32, Device::CUDA);
    dI[run] = poisoned(shape, DType::BF16);
    cuda::givens_backward(dout, I, theta, 1, dI[run], dtheta[run]);
  }
  const Tensor a = to_host(dtheta[0]), b = to_host(dtheta[1]);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  EXPECT_GT(norm(a), 0.0);
}

// Odd head counts other than 1 and a theta of the wrong size are rejected with named errors.
TEST(GpuGivensChecks, RejectsBadShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Tensor I = poisoned({2, 3, 16}, DType::BF16), out = poisoned({2, 3, 16}, DType::BF16);
  Tensor theta = Tensor::zeros({1}, DType::F32, Device::CUDA);
  EXPECT_THROW(cuda::givens_forward(I, theta, 0, out), Error);
  Tensor I4 = poisoned({2, 4, 16}, DType::BF16), out4 = poisoned({2, 4, 16}, DType::BF16);
  EXPECT_THROW(cuda::givens_forward(I4, theta, 0, out4), Error);
}

}  // namespace
