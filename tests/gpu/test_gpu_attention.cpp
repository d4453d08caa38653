// GPU tests of the flash attention (src/cuda/attention.h) against the CPU references of
// src/ops/attention.h, run in F64 on the same bf16 inputs.
//
// Tolerances. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 ≈ 3.9e-3. The inputs are
// bf16 already (exact in F64 and exact as mma operands); products accumulate in fp32 (relative
// error ~Dh·2^-24, far below u). Two bf16 roundings enter each output: the probabilities P
// (forward, dV) or dS (dK, dQ) as mma operands, and the output itself; each is within u
// elementwise (about u/√3 in rms over many elements), so the output is within 2u in relative
// norm:
//   - y, and dq/dk/dv against the CPU flash backward given the GPU's own y and the exact
//     lse (the same D_p = dy_p·y_p as the kernel): kTight = 2u.
//   - dq/dk/dv against the materialized reference (end to end: it uses the exact y, the
//     kernel the bf16 y, which perturbs D_p by ~u·|dy||y|/sqrt(Dh), small against the
//     dP − D it enters): kLoose = 4u.
//   - lse is fp32 (no bf16 rounding): fp32 dots and exp2/log2, ~1e-6 relative: kLse = 2e-5.
//   - the decode step keeps P in fp32 and rounds y once: within u of the exact y, and within
//     kTight of the forward's y (each is within about u of the exact value in rms).
// A wrong kernel (a missed tile, a wrong mask, head or scale) errs by O(1). Errors are
// ‖got − ref‖ / max(‖ref‖, 1): the floor covers gradients that vanish exactly (T = 1: the
// softmax over one key has no score gradient, so dq = dk = 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

struct Case {
  int64_t B, T, Hq, Hkv, Dh;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_Hq" << c.Hq << "_Hkv" << c.Hkv << "_Dh" << c.Dh;
}

// The cases cover every padded-width instantiation (16, 32, ..., 128, with Dh both equal to
// and below the padded width; 60 and 100 take 8-byte cp.async pieces, 50 element loads), T = 1, T below, just
// above and several times the 64-row tile, MHA and GQA groups of 2 and 4, B = 1 and 2; the
// widths above 64 reload their A fragments per tile, those above 96 run the dK/dV loop with
// 32-row query tiles.
const Case kCases[] = {
    {2, 1, 4, 4, 64},    {2, 63, 8, 2, 48},  {2, 65, 4, 4, 24},  {2, 200, 8, 2, 128},
    {1, 130, 2, 1, 60},  {2, 97, 4, 2, 80},  {1, 129, 2, 2, 96}, {2, 70, 3, 3, 32},
    {1, 77, 4, 1, 100},  {2, 40, 2, 2, 8},   {1, 64, 2, 1, 128}, {1, 300, 4, 2, 24},
    {1, 161, 2, 1, 112}, {2, 257, 2, 2, 80}, {1, 190, 4, 4, 16}, {2, 90, 4, 2, 50},
};

class GpuAttention : public ::testing::TestWithParam<Case> {};

// Forward: y against the materialized F64 reference, lse against the CPU flash forward's.
// Backward: dq, dk, dv against the CPU flash backward fed the GPU's y (kTight) and against the
// materialized reference (kLoose).
void check_forward_backward(const Case& c) {
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

// The kernels load their tiles by TMA at head widths that are multiples of 8, by cp.async in
// 8-byte pieces at the other multiples of 4 (the cases of width 60 and 100), element by element
// at width 50.
TEST_P(GpuAttention, ForwardAndBackwardMatchTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_forward_backward(GetParam());
}

// The one-pass dQ (cuda::flash_dq_atomics: the warp-specialized dK/dV pass adds dQ's shares by
// bulk reductions) within the same bounds; head widths that are not a multiple of 8 or are
// above 96 keep the two passes.
TEST_P(GpuAttention, OnePassDqMatchesTheCpuReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const gpu_testing::OnePassDq one_pass;
  check_forward_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention, ::testing::ValuesIn(kCases));

// The backward sums dk/dv over query tiles and heads in a fixed order and computes dq without
// atomics: two runs agree bit for bit. Also covers 3-d inputs ([T, H, Dh], lse [Hq, T]) and
// outputs allocated by the call.
void check_reproducible(int64_t Dh) {
  Rng rng(77);
  const int64_t T = 150, Hq = 4, Hkv = 2;
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

TEST(GpuAttentionDeterminism, BackwardIsBitwiseReproducible) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_reproducible(64);  // dK/dV by one warpgroup per 64 keys
  check_reproducible(80);  // dK/dV warp-specialized
}

// Rows [b, t, :, :] of a host [B, T, H, Dh] bf16 tensor for every b, as a [B, H, Dh] tensor.
Tensor time_row(const Tensor& x, int64_t t) {
  const int64_t B = x.dim(0), T = x.dim(1), width = x.dim(2) * x.dim(3);
  Tensor row = Tensor::empty({B, x.dim(2), x.dim(3)}, DType::BF16);
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(row.data<bf16>() + b * width, x.data<bf16>() + (b * T + t) * width,
                width * sizeof(bf16));
  return row;
}

class GpuAttentionDecode : public ::testing::TestWithParam<Case> {};

// Steps token by token from an empty (poisoned) cache; each y_row must match the forward's y at
// that position and the materialized reference, the cache rows 0..T-1 must hold k and v
// exactly, and the rows past T must stay untouched. T = 600 at Dh = 24 takes the teams of
// the block through more than one round of positions.
TEST_P(GpuAttentionDecode, StepsMatchTheForward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  Rng rng(500 + c.T * 3 + c.Dh);
  const int64_t capacity = c.T + 5;
  const Shape q_shape{c.B, c.T, c.Hq, c.Dh}, kv_shape{c.B, c.T, c.Hkv, c.Dh};
  const Tensor q = random_bf16(q_shape, rng, -2.0, 2.0);
  const Tensor k = random_bf16(kv_shape, rng, -2.0, 2.0);
  const Tensor v = random_bf16(kv_shape, rng, -1.0, 1.0);

  Tensor y_fwd, lse_fwd;
  cuda::attention_forward(to_device(q), to_device(k), to_device(v), y_fwd, lse_fwd);
  Tensor y_ref;
  ops::attention_reference_forward(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), y_ref);

  Tensor cache_k = poisoned({c.B, capacity, c.Hkv, c.Dh}, DType::BF16);
  Tensor cache_v = poisoned({c.B, capacity, c.Hkv, c.Dh}, DType::BF16);
  int32_t* d_pos = nullptr;
  QV_CUDA_CHECK(cudaMalloc(&d_pos, sizeof(int32_t)));
  Tensor y_steps = Tensor::empty(q_shape, DType::BF16);
  const int64_t width = c.Hq * c.Dh;
  for (int64_t t = 0; t < c.T; ++t) {
    const int32_t pos = static_cast<int32_t>(t);
    QV_CUDA_CHECK(cudaMemcpy(d_pos, &pos, sizeof(pos), cudaMemcpyHostToDevice));
    Tensor y_row = poisoned({c.B, c.Hq, c.Dh}, DType::BF16);
    cuda::attention_decode_step(to_device(time_row(q, t)), to_device(time_row(k, t)),
                                to_device(time_row(v, t)), cache_k, cache_v, d_pos, y_row);
    const Tensor y_host = to_host(y_row);
    for (int64_t b = 0; b < c.B; ++b)
      std::memcpy(y_steps.data<bf16>() + (b * c.T + t) * width, y_host.data<bf16>() + b * width,
                  width * sizeof(bf16));
  }
  QV_CUDA_CHECK(cudaFree(d_pos));

  const Tensor y_got = y_steps.to(DType::F64);
  EXPECT_LT(error(y_got, to_host_f64(y_fwd)), kTight);
  EXPECT_LT(error(y_got, y_ref), kTight);

  const int64_t row = c.Hkv * c.Dh;
  for (const auto& [cache, src] : {std::pair{&cache_k, &k}, std::pair{&cache_v, &v}}) {
    const Tensor got = to_host(*cache);
    for (int64_t b = 0; b < c.B; ++b) {
      EXPECT_EQ(std::memcmp(got.data<bf16>() + b * capacity * row,
                            src->data<bf16>() + b * c.T * row, c.T * row * sizeof(bf16)),
                0);
      const bf16* rest = got.data<bf16>() + (b * capacity + c.T) * row;
      for (int64_t i = 0; i < (capacity - c.T) * row; ++i) ASSERT_EQ(rest[i].bits, 0xFFFF);
    }
  }
}

// Team widths 1, 2, 4, 8 and 16 lanes (Dh 8, 16, 24, 64, 128), Dh % 8 != 0 (20, 100), MHA and
// GQA.
const Case kDecodeCases[] = {
    {2, 70, 4, 2, 24}, {1, 600, 4, 4, 24}, {2, 40, 8, 2, 64}, {1, 33, 2, 1, 128},
    {2, 30, 3, 1, 20}, {1, 20, 2, 2, 8},   {1, 45, 4, 2, 16}, {1, 25, 2, 1, 100},
};
INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttentionDecode, ::testing::ValuesIn(kDecodeCases));

// Median of `trials` timings (ms) of `work` on `stream`, after two warm-up runs.
template <class Work>
double median_ms(int trials, Work work, cudaStream_t stream = nullptr) {
  cudaEvent_t start, stop;
  QV_CUDA_CHECK(cudaEventCreate(&start));
  QV_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) work();
  std::vector<double> ms;
  for (int i = 0; i < trials; ++i) {
    QV_CUDA_CHECK(cudaEventRecord(start, stream));
    work();
    QV_CUDA_CHECK(cudaEventRecord(stop, stream));
    QV_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  QV_CUDA_CHECK(cudaEventDestroy(start));
  QV_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Times forward + backward and the forward alone (cudaEvents, median of 10) at the Relation
// paper's scales, alg110m's and head widths 96 and 128, and the decode step of alg110m-dense at batch 1 (a CUDA graph
// of 100 steps, so launch gaps do not count). Prints; asserts only that the results are finite.
TEST(GpuAttentionTiming, ForwardBackwardAtModelScales) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case shapes[] = {
      {64, 1024, 8, 8, 48}, {32, 2048, 8, 8, 64}, {8, 4096, 8, 8, 80}, {40, 1536, 32, 32, 24},
      {16, 2048, 8, 8, 96}, {16, 2048, 8, 8, 128}};
  std::printf("%-26s %10s %14s %12s %14s\n", "shape (B, T, H, Dh)", "fwd ms", "fwd tok/s",
              "fwd+bwd ms", "fwd+bwd tok/s");
  Rng rng(4242);
  for (const Case& c : shapes) {
    const Shape shape{c.B, c.T, c.Hq, c.Dh};
    const Tensor x = to_device(random_bf16(shape, rng, -1.0, 1.0));
    Tensor y, lse, dq, dk, dv;
    const double fwd = median_ms(10, [&] { cuda::attention_forward(x, x, x, y, lse); });
    const double both = median_ms(10, [&] {
      cuda::attention_forward(x, x, x, y, lse);
      cuda::attention_backward(x, x, x, y, lse, x, dq, dk, dv);
    });
    const double tokens = static_cast<double>(c.B * c.T);
    std::printf("(%3lld, %4lld, %2lld, %3lld)        %10.3f %14.3e %12.3f %14.3e\n",
                static_cast<long long>(c.B), static_cast<long long>(c.T),
                static_cast<long long>(c.Hq), static_cast<long long>(c.Dh), fwd,
                tokens / (fwd * 1e-3), both, tokens / (both * 1e-3));
    EXPECT_TRUE(std::isfinite(fwd) && std::isfinite(both));
    const Tensor lse_host = to_host_f64(lse);
    EXPECT_TRUE(std::isfinite(norm(lse_host)));
    EXPECT_TRUE(std::isfinite(norm(to_host_f64(dq))));
  }

  const int64_t Hq = 32, Dh = 24, capacity = 2048;
  const Tensor q_row = to_device(random_bf16({1, Hq, Dh}, rng, -1.0, 1.0));
  const Tensor kv_row = to_device(random_bf16({1, Hq, Dh}, rng, -1.0, 1.0));
  Tensor cache_k = to_device(random_bf16({1, capacity, Hq, Dh}, rng, -1.0, 1.0));
  Tensor cache_v = to_device(random_bf16({1, capacity, Hq, Dh}, rng, -1.0, 1.0));
  Tensor y_row = Tensor::empty({1, Hq, Dh}, DType::BF16, Device::CUDA);
  int32_t* d_pos = nullptr;
  QV_CUDA_CHECK(cudaMalloc(&d_pos, sizeof(int32_t)));
  cudaStream_t stream;
  QV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kSteps = 100;
  for (const int32_t pos : {127, 511, 2047}) {
    QV_CUDA_CHECK(cudaMemcpy(d_pos, &pos, sizeof(pos), cudaMemcpyHostToDevice));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    QV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kSteps; ++i)
      cuda::attention_decode_step(q_row, kv_row, kv_row, cache_k, cache_v, d_pos, y_row, stream);
    QV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    QV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms =
        median_ms(10, [&] { QV_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, stream);
    std::printf("decode B=1 H=32 Dh=24 pos=%4d: %.2f us per step (graph of %d)\n", pos,
                ms * 1e3 / kSteps, kSteps);
    EXPECT_TRUE(std::isfinite(norm(to_host_f64(y_row))));
    QV_CUDA_CHECK(cudaGraphExecDestroy(exec));
    QV_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  QV_CUDA_CHECK(cudaStreamDestroy(stream));
  QV_CUDA_CHECK(cudaFree(d_pos));
}

}  // namespace
