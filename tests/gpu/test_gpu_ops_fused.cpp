// The GPU paths that merge launches: strided batched GEMMs (q/k/v and gate/up of the model as
// one cuBLASLt call), GEMM autotuning's handling of an accumulated C, RoPE over stacked head
// tensors and at a device position; and a timing of the head GEMM shapes of alg110m-dense.
//
// Tolerances (relative norm error ‖out − ref‖/‖ref‖ against a float64 reference on the same
// bf16 inputs). A GEMM sums K exact bf16 products in fp32 (error ≤ K·2⁻²⁴ relative to Σ|a||b|,
// far below bf16) and rounds its output once to bf16 (2⁻⁹ relative per element, round to
// nearest); the batched call may fall back to the unfused bias pass, which rounds twice. We
// allow 2·2⁻⁸ (twice a naive bf16 answer). fp32 outputs: the accumulation alone, 2·(K+2)·2⁻²⁴
// times ‖|A||B| + |C|‖/‖ref‖ (as test_gpu_gemm.cpp). RoPE: one rotation of bf16 values with
// fp32 cos/sin (within 2 fp32 ulps of the fp64 ones) and one bf16 rounding: 2⁻⁸.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/ops.h"
#include "gpu/gpu_testing.h"
#include "ops/rope.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kBf16Tol = 2.0 / 256.0;
constexpr double kF32Unit = 1.0 / 16777216.0;

Tensor f64(const Tensor& t) { return t.to(DType::F64); }

bool all_finite(const Tensor& host_f64) {
  const double* p = host_f64.data<double>();
  for (int64_t i = 0; i < host_f64.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

struct BatchedCase {
  int64_t batch, M, N, K;
  bool shared_a;   // stride_a = 0 (one input, several weights: the model's use)
  bool bias;
  DType bias_type;
  DType c_type;
  float beta;
};

// C_j = A_j · B_j (+ bias_j) + beta · C_j, member by member in float64; abs gets the same sum
// of absolute values (the scale of the fp32 accumulation error).
void batched_reference(const BatchedCase& c, const Tensor& a, const Tensor& b, const Tensor& bias,
                       Tensor& ref, Tensor& abs) {
  const double* A = a.data<double>();
  const double* Bm = b.data<double>();
  double* C = ref.data<double>();
  for (int64_t j = 0; j < c.batch; ++j)
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double sum = 0, sum_abs = 0;
        const double* arow = A + (c.shared_a ? 0 : j * c.M * c.K) + m * c.K;
        for (int64_t k = 0; k < c.K; ++k) {
          sum += arow[k] * Bm[j * c.K * c.N + k * c.N + n];
          sum_abs += std::fabs(arow[k] * Bm[j * c.K * c.N + k * c.N + n]);
        }
        if (c.bias) {
          sum += bias.data<double>()[j * c.N + n];
          sum_abs += std::fabs(bias.data<double>()[j * c.N + n]);
        }
        double& out = C[(j * c.M + m) * c.N + n];
        const double old = c.beta != 0.0f ? c.beta * out : 0.0;
        out = sum + old;
        abs.data<double>()[(j * c.M + m) * c.N + n] = sum_abs + std::fabs(old);
      }
}

}  // namespace

TEST(GpuGemmBatched, MatchesMemberByMemberReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(71);
  const std::vector<BatchedCase> cases = {
      {3, 1, 96, 64, true, true, DType::BF16, DType::BF16, 0.0f},     // a decode row: q, k, v
      {3, 70, 64, 64, true, true, DType::BF16, DType::BF16, 0.0f},    // odd rows, fused bias
      {2, 37, 130, 48, true, false, DType::BF16, DType::BF16, 0.0f},  // gate and up, no bias
      {3, 33, 40, 24, false, false, DType::BF16, DType::F32, 1.0f},   // accumulated fp32
      {2, 9, 64, 32, true, true, DType::F32, DType::BF16, 0.0f},      // fp32 bias: per member
      {2, 64, 48, 70, true, false, DType::BF16, DType::BF16, 1.0f},   // accumulated bf16
  };
  for (const BatchedCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " M " << c.M << " N " << c.N
                                      << " K " << c.K << " beta " << c.beta);
    const int64_t a_members = c.shared_a ? 1 : c.batch;
    Tensor a = random_bf16({a_members, c.M, c.K}, rng);
    Tensor b = random_bf16({c.batch, c.K, c.N}, rng);
    Tensor bias = random_bf16({c.batch, c.N}, rng);
    Tensor c0 = random_bf16({c.batch, c.M, c.N}, rng);
    Tensor ref = f64(c0), abs = Tensor::empty(ref.shape(), DType::F64);
    batched_reference(c, f64(a), f64(b), f64(bias), ref, abs);

    Tensor dev_a = to_device(a), dev_b = to_device(b), dev_bias = to_device(bias, c.bias_type);
    Tensor dev_c = c.beta != 0.0f ? to_device(c0, c.c_type) : poisoned({c.batch, c.M, c.N}, c.c_type);
    cuda::gemm_batched(false, false, c.M, c.N, c.K, 1.0f, dev_a.raw(), DType::BF16, c.K,
                       c.shared_a ? 0 : c.M * c.K, dev_b.raw(), DType::BF16, c.N, c.K * c.N, c.beta,
                       dev_c.raw(), c.c_type, c.N, c.M * c.N, c.batch,
                       c.bias ? cuda::Epilogue::Bias : cuda::Epilogue::None,
                       c.bias ? dev_bias.raw() : nullptr, c.bias_type, c.N);
    const Tensor got = to_host_f64(dev_c);
    EXPECT_TRUE(all_finite(got));
    if (c.c_type == DType::BF16) {
      EXPECT_LT(rel_error(got, ref), kBf16Tol);
    } else {
      EXPECT_LT(rel_error(got, ref), 2.0 * (c.K + 2) * kF32Unit * norm(abs) / norm(ref));
    }
    // The plan is cached: a second call gives the same bits (beta = 0) or adds once more.
    if (c.beta == 0.0f) {
      cuda::gemm_batched(false, false, c.M, c.N, c.K, 1.0f, dev_a.raw(), DType::BF16, c.K,
                         c.shared_a ? 0 : c.M * c.K, dev_b.raw(), DType::BF16, c.N, c.K * c.N, 0.0f,
                         dev_c.raw(), c.c_type, c.N, c.M * c.N, c.batch,
                         c.bias ? cuda::Epilogue::Bias : cuda::Epilogue::None,
                         c.bias ? dev_bias.raw() : nullptr, c.bias_type, c.N);
      EXPECT_EQ(rel_error(to_host_f64(dev_c), got), 0.0);
    }
  }
}

TEST(GpuGemmBatched, RejectsOverlappingOutputs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Tensor a = Tensor::zeros({4, 8}, DType::BF16, Device::CUDA);
  Tensor b = Tensor::zeros({2, 8, 8}, DType::BF16, Device::CUDA);
  Tensor c = Tensor::zeros({2, 4, 8}, DType::BF16, Device::CUDA);
  EXPECT_THROW(cuda::gemm_batched(false, false, 4, 8, 8, 1.0f, a.raw(), DType::BF16, 8, 0, b.raw(),
                                  DType::BF16, 8, 64, 0.0f, c.raw(), DType::BF16, 8, 16, 2,
                                  cuda::Epilogue::None, nullptr, DType::BF16, 0),
               Error);
}

// The first call of a new plan times candidates on C; with beta = 1 it must still add A·B once.
TEST(GpuGemmAutotune, FirstAccumulatingCallAddsOnce) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(cuda::gemm_autotune_enabled());
  Rng rng(73);
  const int64_t M = 300, N = 257, K = 96;  // a shape no other test uses: a fresh plan
  Tensor a = random_bf16({M, K}, rng), b = random_bf16({K, N}, rng), c0 = random_bf16({M, N}, rng);
  Tensor ref = f64(c0), abs = abs_of(f64(c0));
  {
    const Tensor a64 = f64(a), b64 = f64(b);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0, sum_abs = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double product = a64.data<double>()[m * K + k] * b64.data<double>()[k * N + n];
          sum += product;
          sum_abs += std::fabs(product);
        }
        ref.data<double>()[m * N + n] += sum;
        abs.data<double>()[m * N + n] += sum_abs;
      }
  }
  Tensor dev_a = to_device(a), dev_b = to_device(b), dev_c = to_device(c0, DType::F32);
  cuda::gemm(false, false, M, N, K, 1.0f, dev_a.raw(), DType::BF16, K, dev_b.raw(), DType::BF16, N, 1.0f,
             dev_c.raw(), DType::F32, N);
  EXPECT_LT(rel_error(to_host_f64(dev_c), ref), 2.0 * (K + 2) * kF32Unit * norm(abs) / norm(ref));
}

// RoPE on q and k stacked as one [2B, T, H, Dh] tensor equals RoPE on each (the model's single
// launch), with rows not a multiple of the kernel's 8-row blocks; and at a device position.
TEST(GpuRope, StackedTensorsAndDevicePosition) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(75);
  const int64_t B = 3, T = 7, H = 5, Dh = 24;
  Tensor q = random_bf16({B, T, H, Dh}, rng), k = random_bf16({B, T, H, Dh}, rng);
  Tensor ref_q = Tensor::empty(q.shape(), DType::F64), ref_k = Tensor::empty(k.shape(), DType::F64);
  ops::rope_forward(f64(q), ref_q, 0, ops::kRopeBase);
  ops::rope_forward(f64(k), ref_k, 0, ops::kRopeBase);
  Tensor both = Tensor::empty({2 * B, T, H, Dh}, DType::BF16, Device::CUDA);
  QV_CUDA_CHECK(cudaMemcpy(both.raw(), to_device(q).raw(), q.nbytes(), cudaMemcpyDeviceToDevice));
  QV_CUDA_CHECK(cudaMemcpy(static_cast<char*>(both.raw()) + q.nbytes(), to_device(k).raw(), k.nbytes(),
                           cudaMemcpyDeviceToDevice));
  cuda::rope_forward(both, both, 0, ops::kRopeBase);
  const Tensor got = to_host_f64(both);
  const int64_t half_elems = q.numel();
  Tensor got_q = got.reshape({-1}).slice(0, 0, half_elems).clone().reshape(q.shape());
  Tensor got_k = got.reshape({-1}).slice(0, half_elems, 2 * half_elems).clone().reshape(k.shape());
  EXPECT_LT(rel_error(got_q, ref_q), kBf16Tol);
  EXPECT_LT(rel_error(got_k, ref_k), kBf16Tol);

  // Decode rows [B, H, Dh] at a far position read from device memory.
  const int32_t position = 1000003;
  Tensor rows = random_bf16({B, H, Dh}, rng);
  Tensor ref_rows = Tensor::empty({B, 1, H, Dh}, DType::F64);
  ops::rope_forward(f64(rows).reshape({B, 1, H, Dh}), ref_rows, position, ops::kRopeBase);
  Tensor pos_dev = Tensor::empty({1}, DType::F32, Device::CUDA);
  QV_CUDA_CHECK(cudaMemcpy(pos_dev.raw(), &position, sizeof(position), cudaMemcpyHostToDevice));
  Tensor dev_rows = to_device(rows), out = poisoned({B, H, Dh}, DType::BF16);
  cuda::rope_forward_at(dev_rows, out, static_cast<const int32_t*>(pos_dev.raw()), ops::kRopeBase);
  EXPECT_LT(rel_error(to_host_f64(out).reshape({B, 1, H, Dh}), ref_rows), kBf16Tol);
}

// Prints the speed of alg110m-dense's head GEMMs (40 × 1536 rows, D = 768, V = 50,257) with N or
// K = V and with the padded 50,304, under the heuristic's first choice and under autotuning.
TEST(GpuGemmTiming, HeadShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 40 * 1536, D = 768, V = 50257, Vp = 50304;
  Tensor h = Tensor::zeros({rows, D}, DType::BF16, Device::CUDA);
  Tensor table = Tensor::zeros({Vp, D}, DType::BF16, Device::CUDA);
  Tensor logits = Tensor::zeros({rows, Vp}, DType::BF16, Device::CUDA);
  Tensor dh = Tensor::zeros({rows, D}, DType::BF16, Device::CUDA);
  Tensor dw = Tensor::zeros({Vp, D}, DType::F32, Device::CUDA);
  cudaEvent_t start, stop;
  QV_CUDA_CHECK(cudaEventCreate(&start));
  QV_CUDA_CHECK(cudaEventCreate(&stop));
  auto time_ms = [&](auto&& launch) {
    launch();
    QV_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < 3; ++i) launch();
    QV_CUDA_CHECK(cudaEventRecord(stop));
    QV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / 3.0;
  };
  for (bool tuned : {false, true}) {
    cuda::set_gemm_autotune(tuned);
    for (int64_t v : {V, Vp}) {
      const double flops = 2.0 * rows * v * D;
      const double fwd = time_ms([&] {
        cuda::gemm(false, true, rows, v, D, 1.0f, h.raw(), DType::BF16, D, table.raw(), DType::BF16, D, 0.0f,
                   logits.raw(), DType::BF16, Vp);
      });
      const double bwd_dh = time_ms([&] {
        cuda::gemm(false, false, rows, D, v, 1.0f, logits.raw(), DType::BF16, Vp, table.raw(), DType::BF16, D,
                   0.0f, dh.raw(), DType::BF16, D);
      });
      const double bwd_dw = time_ms([&] {
        cuda::gemm(true, false, v, D, rows, 1.0f, logits.raw(), DType::BF16, Vp, h.raw(), DType::BF16, D,
                   v == V ? 1.0f : 0.0f, dw.raw(), DType::F32, D);
      });
      std::printf("head GEMMs %s, V = %lld: forward %.2f ms (%.0f TFLOP/s), dh %.2f ms (%.0f), dW%s %.2f ms (%.0f)\n",
                  tuned ? "autotuned" : "heuristic", static_cast<long long>(v), fwd, flops / fwd * 1e-9, bwd_dh,
                  flops / bwd_dh * 1e-9, v == V ? " (beta 1)" : " (beta 0)", bwd_dw, flops / bwd_dw * 1e-9);
    }
  }
  cuda::set_gemm_autotune(true);
  QV_CUDA_CHECK(cudaEventDestroy(start));
  QV_CUDA_CHECK(cudaEventDestroy(stop));
}
