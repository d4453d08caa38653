// Causal attention on the CPU: flash forward/backward against the materialized reference,
// finite differences, KV-cache decoding against the full forward, precision and shape checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "ops/attention.h"
#include "testing.h"

using namespace quiver;
using quiver::testing::poisoned;
using quiver::testing::random_tensor;

namespace {

struct AttnCase {
  int64_t B;  // 0: 3-d inputs [T, H, Dh]
  int64_t T, Hq, Hkv, Dh, tile;
};

Shape heads_shape(int64_t B, int64_t T, int64_t H, int64_t Dh) {
  return B == 0 ? Shape{T, H, Dh} : Shape{B, T, H, Dh};
}

// A slice [T, H, Dh] of row t of a [T, H, Dh] tensor, as a contiguous [H, Dh] copy with a
// leading batch of one: [1, H, Dh].
Tensor row_of(const Tensor& x, int64_t t) {
  return x.slice(0, t, t + 1).clone().reshape({1, x.dim(1), x.dim(2)});
}

}  // namespace

TEST(AttentionFlash, MatchesReferenceForwardAndBackward) {
  const AttnCase cases[] = {
      {0, 37, 4, 2, 16, 8},   // GQA, T not a multiple of the tile
      {2, 50, 3, 3, 24, 16},  // batch, plain MHA
      {0, 70, 4, 1, 8, 64},   // one kv head (MQA), default tile, T > tile
      {0, 9, 2, 2, 5, 1},     // tile of one
      {1, 1, 2, 1, 4, 64},    // a single position
  };
  Rng rng(11);
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " Hq=" << c.Hq
                                      << " Hkv=" << c.Hkv << " Dh=" << c.Dh << " tile=" << c.tile);
    const DType dt = DType::F64;
    Tensor q = random_tensor(heads_shape(c.B, c.T, c.Hq, c.Dh), dt, rng);
    Tensor k = random_tensor(heads_shape(c.B, c.T, c.Hkv, c.Dh), dt, rng);
    Tensor v = random_tensor(heads_shape(c.B, c.T, c.Hkv, c.Dh), dt, rng);
    Tensor dy = random_tensor(q.shape(), dt, rng);
    Tensor y = poisoned(q.shape(), dt), lse;
    ops::attention_forward(q, k, v, y, lse, c.tile);
    Tensor y_ref;
    ops::attention_reference_forward(q, k, v, y_ref);
    EXPECT_LE(rel_error(y, y_ref), 1e-12);
    EXPECT_EQ(lse.shape(), c.B == 0 ? Shape({c.Hq, c.T}) : Shape({c.B, c.Hq, c.T}));

    Tensor dq = poisoned(q.shape(), dt), dk = poisoned(k.shape(), dt), dv = poisoned(v.shape(), dt);
    ops::attention_backward(q, k, v, y, lse, dy, dq, dk, dv, c.tile);
    Tensor dq_ref, dk_ref, dv_ref;
    ops::attention_reference_backward(q, k, v, dy, dq_ref, dk_ref, dv_ref);
    EXPECT_LE(rel_error(dq, dq_ref), 1e-11);
    EXPECT_LE(rel_error(dk, dk_ref), 1e-11);
    EXPECT_LE(rel_error(dv, dv_ref), 1e-11);
  }
}

TEST(AttentionFlash, LogSumExpMatchesDirectSum) {
  Rng rng(5);
  const int64_t T = 11, H = 2, Dh = 6;
  Tensor q = random_tensor({T, H, Dh}, DType::F64, rng);
  Tensor k = random_tensor({T, H, Dh}, DType::F64, rng);
  Tensor v = random_tensor({T, H, Dh}, DType::F64, rng);
  Tensor y, lse;
  ops::attention_forward(q, k, v, y, lse, 4);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t p = 0; p < T; ++p) {
      double sum = 0;
      for (int64_t j = 0; j <= p; ++j) {
        double s = 0;
        for (int64_t c = 0; c < Dh; ++c) s += q.at({p, h, c}) * k.at({j, h, c});
        sum += std::exp(s / std::sqrt(double(Dh)));
      }
      EXPECT_NEAR(lse.at({h, p}), std::log(sum), 1e-12);
    }
}

TEST(Attention, FiniteDifferenceGradients) {
  Rng rng(3);
  const int64_t T = 7, Hq = 4, Hkv = 2, Dh = 5;
  Tensor q = random_tensor({T, Hq, Dh}, DType::F64, rng);
  Tensor k = random_tensor({T, Hkv, Dh}, DType::F64, rng);
  Tensor v = random_tensor({T, Hkv, Dh}, DType::F64, rng);
  Tensor w = random_tensor(q.shape(), DType::F64, rng);
  auto loss = [&] {
    Tensor y, lse;
    ops::attention_forward(q, k, v, y, lse, 3);
    return quiver::testing::dot(y, w);
  };
  Tensor y, lse, dq, dk, dv;
  ops::attention_forward(q, k, v, y, lse, 3);
  ops::attention_backward(q, k, v, y, lse, w, dq, dk, dv, 3);
  EXPECT_LE(quiver::testing::finite_difference_error(loss, q, dq), 1e-7);
  EXPECT_LE(quiver::testing::finite_difference_error(loss, k, dk), 1e-7);
  EXPECT_LE(quiver::testing::finite_difference_error(loss, v, dv), 1e-7);
}

TEST(Attention, KVCacheDecodeReproducesFullForward) {
  Rng rng(21);
  const int64_t B = 2, T = 13, Hq = 4, Hkv = 2, Dh = 8;
  Tensor q = random_tensor({B, T, Hq, Dh}, DType::F64, rng);
  Tensor k = random_tensor({B, T, Hkv, Dh}, DType::F64, rng);
  Tensor v = random_tensor({B, T, Hkv, Dh}, DType::F64, rng);
  Tensor y_full, lse;
  ops::attention_forward(q, k, v, y_full, lse);
  for (int64_t prefill : {0, 5}) {
    SCOPED_TRACE(::testing::Message() << "prefill=" << prefill);
    ops::KVCache cache(B, T, Hkv, Dh, DType::F64);
    if (prefill > 0) {
      Tensor y_pre, lse_pre;
      Tensor qp = q.slice(1, 0, prefill).clone(), kp = k.slice(1, 0, prefill).clone(),
             vp = v.slice(1, 0, prefill).clone();
      ops::attention_forward(qp, kp, vp, y_pre, lse_pre);
      EXPECT_LE(rel_error(y_pre, y_full.slice(1, 0, prefill)), 1e-13);
      cache.append(kp, vp);
    }
    Tensor y_row = poisoned({B, Hq, Dh}, DType::F64);
    for (int64_t t = prefill; t < T; ++t) {
      Tensor k_row = k.slice(1, t, t + 1).clone().reshape({B, Hkv, Dh});
      Tensor v_row = v.slice(1, t, t + 1).clone().reshape({B, Hkv, Dh});
      Tensor q_row = q.slice(1, t, t + 1).clone().reshape({B, Hq, Dh});
      cache.append_row(k_row, v_row);
      ops::attention_decode_step(q_row, cache, y_row);
      Tensor expect = y_full.slice(1, t, t + 1).clone().reshape({B, Hq, Dh});
      EXPECT_LE(rel_error(y_row, expect), 1e-13) << "position " << t;
    }
    EXPECT_EQ(cache.length, T);
  }
}

TEST(Attention, KVCacheAcceptsThreeDimensionalPrefill) {
  Rng rng(22);
  const int64_t T = 6, H = 2, Dh = 4;
  Tensor q = random_tensor({T, H, Dh}, DType::F32, rng);
  Tensor k = random_tensor({T, H, Dh}, DType::F32, rng);
  Tensor v = random_tensor({T, H, Dh}, DType::F32, rng);
  Tensor y_full, lse;
  ops::attention_forward(q, k, v, y_full, lse);
  ops::KVCache cache(1, T, H, Dh, DType::F32);
  cache.append(k, v);
  Tensor y_row;
  ops::attention_decode_step(row_of(q, T - 1), cache, y_row);
  EXPECT_LE(rel_error(y_row, row_of(y_full, T - 1)), 1e-6);
  EXPECT_THROW(cache.append_row(row_of(k, 0), row_of(v, 0)), Error);  // full
}

TEST(Attention, Float32AgreesWithFloat64) {
  Rng rng(8);
  const int64_t T = 200, Hq = 4, Hkv = 2, Dh = 32;
  Tensor q = random_tensor({T, Hq, Dh}, DType::F64, rng);
  Tensor k = random_tensor({T, Hkv, Dh}, DType::F64, rng);
  Tensor v = random_tensor({T, Hkv, Dh}, DType::F64, rng);
  Tensor dy = random_tensor(q.shape(), DType::F64, rng);
  Tensor y64, lse64, dq64, dk64, dv64;
  ops::attention_forward(q, k, v, y64, lse64);
  ops::attention_backward(q, k, v, y64, lse64, dy, dq64, dk64, dv64);
  Tensor q32 = q.to(DType::F32), k32 = k.to(DType::F32), v32 = v.to(DType::F32),
         dy32 = dy.to(DType::F32);
  Tensor y32, lse32, dq32, dk32, dv32;
  ops::attention_forward(q32, k32, v32, y32, lse32);
  ops::attention_backward(q32, k32, v32, y32, lse32, dy32, dq32, dk32, dv32);
  // The float32 reference (a plain materialized softmax) sets the scale of float32 rounding;
  // the flash kernel may be at most a few times further from the float64 answer.
  Tensor yr32, dqr32, dkr32, dvr32;
  ops::attention_reference_forward(q32, k32, v32, yr32);
  ops::attention_reference_backward(q32, k32, v32, dy32, dqr32, dkr32, dvr32);
  const double eps = std::numeric_limits<float>::epsilon();
  EXPECT_LE(rel_error(y32, y64), 4 * rel_error(yr32, y64) + 8 * eps);
  EXPECT_LE(rel_error(dq32, dq64), 4 * rel_error(dqr32, dq64) + 8 * eps);
  EXPECT_LE(rel_error(dk32, dk64), 4 * rel_error(dkr32, dk64) + 8 * eps);
  EXPECT_LE(rel_error(dv32, dv64), 4 * rel_error(dvr32, dv64) + 8 * eps);
  EXPECT_LE(rel_error(y32, y64), 1e-5);
}

TEST(Attention, BadShapesNameTheTensor) {
  Rng rng(1);
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Tensor q = random_tensor({5, 4, 8}, DType::F64, rng);
  Tensor k3 = random_tensor({5, 3, 8}, DType::F64, rng);
  Tensor k = random_tensor({5, 2, 8}, DType::F64, rng);
  Tensor v_bad = random_tensor({5, 2, 7}, DType::F64, rng);
  Tensor v32 = random_tensor({5, 2, 8}, DType::F32, rng);
  Tensor q2d = random_tensor({5, 32}, DType::F64, rng);
  Tensor y, lse;
  expect_error([&] { ops::attention_forward(q, k3, k3, y, lse); }, "k:");
  expect_error([&] { ops::attention_forward(q, k, v_bad, y, lse); }, "v:");
  expect_error([&] { ops::attention_forward(q, k, v32, y, lse); }, "v:");
  expect_error([&] { ops::attention_forward(q2d, k, k, y, lse); }, "q:");
  Tensor y_wrong = Tensor::empty({5, 4, 7}, DType::F64);
  expect_error([&] { ops::attention_forward(q, k, k, y_wrong, lse); }, "y:");
  ops::attention_forward(q, k, k, y, lse);
  Tensor lse_bad = Tensor::empty({4, 6}, DType::F64), dq, dk, dv;
  expect_error([&] { ops::attention_backward(q, k, k, y, lse_bad, y, dq, dk, dv); }, "lse:");
  ops::KVCache cache(1, 4, 2, 8, DType::F64);
  expect_error([&] { ops::attention_decode_step(row_of(q, 0), cache, y); }, "empty");
  expect_error([&] { cache.append(k, k); }, "capacity");
}
