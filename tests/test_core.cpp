#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "quiver/parallel.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;

namespace {
// Reference bf16 rounding computed independently: pick the nearer of the two
// neighbouring bf16 values, ties to the one with an even last bit.
uint16_t reference_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  uint32_t lo_u = static_cast<uint32_t>(lo) << 16, hi_u = static_cast<uint32_t>(hi) << 16;
  float lo_f, hi_f;
  std::memcpy(&lo_f, &lo_u, 4);
  std::memcpy(&hi_f, &hi_u, 4);
  double dl = std::fabs(static_cast<double>(f) - lo_f), dh = std::fabs(static_cast<double>(hi_f) - f);
  if (std::isinf(hi_f)) dh = std::fabs(static_cast<double>(f) - lo_f) * 2 + 1;  // overflow side
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

TEST(DType, Bf16RoundsToNearestEven) {
  Rng rng(1);
  for (int i = 0; i < 20000; ++i) {
    float f = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-6, 6)));
    ASSERT_EQ(float_to_bf16(f).bits, reference_bf16(f)) << f;
  }
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to the even one (1).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(Tensor, ViewsShareStorageAndConvert) {
  Tensor t = Tensor::empty({3, 4}, DType::F64);
  double* p = t.data<double>();
  std::iota(p, p + 12, 0.0);
  Tensor tr = t.transpose(0, 1);
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.at({2, 1}), 6.0);
  Tensor c = tr.to(DType::F32);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.at({2, 1}), 6.0);
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.at({2, 0}), 9.0);
  EXPECT_EQ(t.reshape({-1}).dim(0), 12);
  EXPECT_THROW(tr.reshape({12}), Error);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(t.reshape({5, -1}), Error);
}

TEST(Tensor, RelErrorAndArena) {
  Tensor a = Tensor::zeros({4}, DType::F64);
  Tensor b = Tensor::zeros({4}, DType::F64);
  b.fill(2.0);
  a.fill(2.0);
  a.data<double>()[0] = 3.0;
  EXPECT_NEAR(rel_error(a, b), 1.0 / 4.0, 1e-15);
  Arena arena(1024);
  Tensor x = arena.tensor({10}, DType::F32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw()) % 64, 0u);
  EXPECT_THROW(arena.tensor({1000}, DType::F32), Error);
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
}

TEST(Tensor, CudaWithoutBackendIsAClearError) {
#ifndef QUIVER_HAVE_CUDA
  EXPECT_THROW(Tensor::empty({2}, DType::F32, Device::CUDA), Error);
#else
  GTEST_SKIP() << "CUDA backend linked";
#endif
}

TEST(Rng, SeededAndDistributed) {
  Rng a(42), b(42), c(43);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(a.next_u64(), c.next_u64());
  Rng r(7);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = r.normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
}

TEST(Parallel, CoversRangeOnceAndPropagatesErrors) {
  std::vector<int> hits(100003, 0);
  parallel_for(static_cast<int64_t>(hits.size()), 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_THROW(parallel_for(10000, 1, [](int64_t, int64_t e) {
                 if (e == 10000) throw Error("boom");
               }),
               Error);
}
