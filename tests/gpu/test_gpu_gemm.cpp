// GPU GEMM (cuBLASLt) and dense linear layer against F64 CPU references on the same
// bf16-rounded inputs.
//
// Tolerances (relative norm error ‖out − ref‖/‖ref‖ over the written window):
// - Accumulation: fp32 sums of K exact products (bf16·bf16 is exact in fp32) plus the beta·C and
//   bias terms, in any order (tensor-core trees, split-K): |err| ≤ γ_{K+2}·(|α||op(A)||op(B)| +
//   |β||C| + |bias|) elementwise with γ_n ≈ n·2^-24. We allow 2·(K+2)·2^-24 (truncating adders
//   have twice the unit) times ‖that absolute-value product‖/‖ref‖, computed per case.
// - Output rounding: 2^-8 per element for bf16 (2^-24 for fp32); we allow two units, which
//   covers the unfused bias path (C rounded, then C + bias rounded again) and is the "twice a
//   naive bf16 answer" rule.
// - GELU: its slope is at most 1.13, so accumulation errors grow by that factor; cuBLASLt's
//   GELU may use a hardware tanh (relative error ~2^-11) or the erf form (at most ~3e-4 away
//   from the tanh form); we allow three bf16 units for all of it, whatever C's type.
// fp32 operands must use true fp32 products: TF32 rounds inputs to 2^-11 and lands about six
// times above our bound.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/blas.h"
#include "cuda/backend.h"
#include "cuda/gemm.h"
#include "gpu/gpu_testing.h"
#include "ops/activation.h"
#include "ops/linear.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kBf16Unit = 1.0 / 256.0;       // 2^-8
constexpr double kF32Unit = 1.0 / 16777216.0;   // 2^-24
constexpr double kGeluSlope = 1.13;             // max |GELU'(x)|

double accumulation_bound(int64_t terms, double abs_norm, double ref_norm) {
  return 2.0 * static_cast<double>(terms + 2) * kF32Unit * abs_norm / ref_norm;
}

double rounding_bound(DType out) { return 2.0 * (out == DType::BF16 ? kBf16Unit : kF32Unit); }

// Random F64 values exactly representable in `dtype`.
Tensor random_values(Rng& rng, const Shape& shape, DType dtype, double stddev,
                     bool positive = false) {
  Tensor t = Tensor::empty(shape, dtype);
  if (positive)
    rng.fill_uniform(t, 0.0, 1.0);
  else
    rng.fill_normal(t, 0.0, stddev);
  return t.to(DType::F64);
}

void device_sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// ‖t‖ over the rows × cols window of an F64 [rows, ld] matrix.
double window_norm(const Tensor& t, int64_t rows, int64_t cols) {
  const double* p = t.data<double>();
  const int64_t ld = t.dim(1);
  double s = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s += p[r * ld + c] * p[r * ld + c];
  return std::sqrt(s);
}

double window_rel_error(const Tensor& out, const Tensor& ref, int64_t rows, int64_t cols) {
  const double* o = out.data<double>();
  const double* r = ref.data<double>();
  const int64_t ld = ref.dim(1);
  double num = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const double d = o[i * ld + c] - r[i * ld + c];
      num += d * d;
    }
  return std::sqrt(num) / window_norm(ref, rows, cols);
}

// Elements of columns [cols, ld) must be byte-identical before and after (the GEMM writes only
// its window).
bool padding_unchanged(const Tensor& before, const Tensor& after, int64_t rows, int64_t cols) {
  const size_t es = dtype_size(before.dtype());
  const int64_t ld = before.dim(1);
  const auto* b = static_cast<const unsigned char*>(before.raw());
  const auto* a = static_cast<const unsigned char*>(after.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ld; ++c) {
      const size_t at = static_cast<size_t>(r * ld + c) * es;
      if (std::memcmp(a + at, b + at, es) != 0) return false;
    }
  return true;
}

struct GemmCase {
  bool trans_a = false, trans_b = false;
  int64_t M = 37, N = 129, K = 71;
  DType operands = DType::BF16, out = DType::BF16;
  float alpha = 0.75f, beta = 0.0f;
  cuda::Epilogue epilogue = cuda::Epilogue::None;
  DType bias_type = DType::F32;
  double stddev_b = 1.0;
  bool positive = false;  // uniform [0, 1) operands (long K: keeps the bound tight)

  std::string name() const {
    return "ta=" + std::to_string(trans_a) + " tb=" + std::to_string(trans_b) +
           " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
           " AB " + dtype_name(operands) + " C " + dtype_name(out) +
           " beta=" + std::to_string(beta) + " epilogue=" + std::to_string(int(epilogue)) +
           " bias " + dtype_name(bias_type);
  }
};

// Runs one GEMM on the GPU with padded leading dimensions and checks the window against the F64
// reference and the padding for writes.
void check_gemm(const GemmCase& g, Rng& rng) {
  SCOPED_TRACE(g.name());
  const int64_t a_rows = g.trans_a ? g.K : g.M, a_width = g.trans_a ? g.M : g.K;
  const int64_t b_rows = g.trans_b ? g.N : g.K, b_width = g.trans_b ? g.K : g.N;
  const int64_t lda = a_width + 3, ldb = b_width + 5, ldc = g.N + 7;
  const bool with_bias = g.epilogue == cuda::Epilogue::Bias || g.epilogue == cuda::Epilogue::BiasGelu;
  const bool with_gelu = g.epilogue == cuda::Epilogue::Gelu || g.epilogue == cuda::Epilogue::BiasGelu;

  Tensor a = random_values(rng, {a_rows, lda}, g.operands, 1.0, g.positive);
  Tensor b = random_values(rng, {b_rows, ldb}, g.operands, g.stddev_b, g.positive);
  Tensor c0 = g.beta != 0.0f ? random_values(rng, {g.M, ldc}, g.out, 1.0)
                             : Tensor::zeros({g.M, ldc}, DType::F64);
  Tensor bias = random_values(rng, {g.N}, g.bias_type, 0.5);

  Tensor a_dev = to_device(a, g.operands), b_dev = to_device(b, g.operands);
  Tensor c_dev = to_device(c0, g.out);
  if (g.beta == 0.0f) poison(c_dev);
  Tensor bias_dev = to_device(bias, g.bias_type);
  const Tensor before = to_host(c_dev);

  if (g.epilogue == cuda::Epilogue::None)
    cuda::gemm(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, a_dev.raw(), g.operands, lda,
               b_dev.raw(), g.operands, ldb, g.beta, c_dev.raw(), g.out, ldc);
  else
    cuda::gemm_epilogue(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, a_dev.raw(), g.operands,
                        lda, b_dev.raw(), g.operands, ldb, g.beta, c_dev.raw(), g.out, ldc,
                        g.epilogue, with_bias ? bias_dev.raw() : nullptr, g.bias_type);
  device_sync();
  const Tensor after = to_host(c_dev);

  // Reference: pre = α op(A) op(B) + β C + bias, and the same with absolute values.
  Tensor pre = c0.clone();
  blas::gemm(g.trans_a, g.trans_b, g.M, g.N, g.K, double(g.alpha), a.data<double>(), lda,
             b.data<double>(), ldb, double(g.beta), pre.data<double>(), ldc);
  Tensor abs_pre = abs_of(c0);
  blas::gemm(g.trans_a, g.trans_b, g.M, g.N, g.K, std::fabs(double(g.alpha)),
             abs_of(a).data<double>(), lda, abs_of(b).data<double>(), ldb,
             std::fabs(double(g.beta)), abs_pre.data<double>(), ldc);
  if (with_bias)
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t n = 0; n < g.N; ++n) {
        pre.data<double>()[m * ldc + n] += bias.data<double>()[n];
        abs_pre.data<double>()[m * ldc + n] += std::fabs(bias.data<double>()[n]);
      }
  Tensor ref = pre;
  if (with_gelu) {
    ref = Tensor::empty(pre.shape(), DType::F64);
    ops::gelu_forward(pre, ref);
  }

  const double acc = accumulation_bound(g.K, window_norm(abs_pre, g.M, g.N),
                                        window_norm(ref, g.M, g.N));
  const double tol = with_gelu ? kGeluSlope * acc + 3.0 * kBf16Unit : acc + rounding_bound(g.out);
  const double err = window_rel_error(after.to(DType::F64), ref, g.M, g.N);
  EXPECT_LT(err, tol);
  EXPECT_TRUE(padding_unchanged(before, after, g.M, g.N)) << "wrote outside the M×N window";
}

}  // namespace

TEST(GpuGemm, Bf16OperandsAllTransposesBothOutputTypesBothBetas) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(11);
  struct Size { int64_t M, N, K; };
  for (Size s : {Size{37, 129, 71}, Size{1, 53, 130}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (DType out : {DType::BF16, DType::F32})
          for (float beta : {0.0f, 1.0f}) {
            GemmCase g;
            g.trans_a = ta;
            g.trans_b = tb;
            g.M = s.M;
            g.N = s.N;
            g.K = s.K;
            g.out = out;
            g.beta = beta;
            check_gemm(g, rng);
          }
}

TEST(GpuGemm, Fp32OperandsUseFullFp32ProductsNotTf32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(12);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        GemmCase g;
        g.trans_a = ta;
        g.trans_b = tb;
        g.operands = DType::F32;
        g.out = DType::F32;
        g.beta = beta;
        check_gemm(g, rng);
      }
}

// Small M, N with a long K: the heuristic tends to split K and reduce in the workspace.
TEST(GpuGemm, LongInnerDimension) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(13);
  for (DType out : {DType::F32, DType::BF16})
    for (bool ta : {false, true}) {
      GemmCase g;
      g.trans_a = ta;
      g.M = 16;
      g.N = 24;
      g.K = 8191;
      g.out = out;
      g.beta = 1.0f;
      g.alpha = 1.0f;
      g.positive = true;
      check_gemm(g, rng);
    }
}

TEST(GpuGemm, BiasAndGeluEpiloguesFusedAndUnfused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(14);
  using cuda::Epilogue;
  for (DType operands : {DType::BF16, DType::F32})
    for (DType out : {DType::BF16, DType::F32}) {
      if (operands == DType::F32 && out == DType::BF16) continue;  // unsupported by cuBLASLt
      for (Epilogue e : {Epilogue::Bias, Epilogue::Gelu, Epilogue::BiasGelu})
        for (DType bias_type : {DType::BF16, DType::F32}) {
          // bias_type == out: fused epilogue; otherwise the second-pass kernel.
          if (e == Epilogue::Gelu && bias_type != out) continue;
          for (float beta : {0.0f, 1.0f}) {
            GemmCase g;
            g.trans_b = true;
            g.operands = operands;
            g.out = out;
            g.epilogue = e;
            g.bias_type = bias_type;
            g.beta = beta;
            g.alpha = 1.0f;
            g.stddev_b = 1.0 / std::sqrt(71.0);  // pre-activations O(1), where GELU bends
            check_gemm(g, rng);
          }
        }
    }
}

TEST(GpuGemm, EmptyInnerDimensionScalesCAndAppliesTheEpilogue) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(15);
  const int64_t M = 5, N = 9, ldc = 11;
  // beta = 0 on a poisoned C: the window becomes exactly zero.
  Tensor c = Tensor::empty({M, ldc}, DType::BF16, Device::CUDA);
  poison(c);
  cuda::gemm(false, false, M, N, 0, 1.0f, nullptr, DType::BF16, 1, nullptr, DType::BF16, N, 0.0f,
             c.raw(), DType::BF16, ldc);
  device_sync();
  Tensor out = to_host(c).to(DType::F64);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < ldc; ++n) {
      const double v = out.data<double>()[m * ldc + n];
      if (n < N)
        EXPECT_EQ(v, 0.0) << m << "," << n;
      else
        EXPECT_TRUE(std::isnan(v)) << "padding written at " << m << "," << n;
    }
  // beta = 0.5 with an fp32 bias and GELU on an fp32 C: C = gelu(0.5 C + bias).
  Tensor c0 = random_values(rng, {M, ldc}, DType::F32, 1.0);
  Tensor bias = random_values(rng, {N}, DType::F32, 1.0);
  Tensor c_dev = to_device(c0, DType::F32), bias_dev = to_device(bias, DType::F32);
  cuda::gemm_epilogue(false, false, M, N, 0, 1.0f, nullptr, DType::BF16, 1, nullptr, DType::BF16,
                      N, 0.5f, c_dev.raw(), DType::F32, ldc, cuda::Epilogue::BiasGelu,
                      bias_dev.raw(), DType::F32);
  device_sync();
  Tensor pre = c0.clone();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      pre.data<double>()[m * ldc + n] = 0.5 * c0.data<double>()[m * ldc + n] + bias.data<double>()[n];
  Tensor ref = Tensor::empty(pre.shape(), DType::F64);
  ops::gelu_forward(pre, ref);
  // fp32 arithmetic with tanhf: a few fp32 units.
  EXPECT_LT(window_rel_error(to_host(c_dev).to(DType::F64), ref, M, N), 1e-6);
  // M = 0 and N = 0 are no-ops that touch nothing.
  EXPECT_NO_THROW(cuda::gemm(false, false, 0, N, 7, 1.0f, nullptr, DType::BF16, 7, nullptr,
                             DType::BF16, N, 0.0f, nullptr, DType::BF16, N));
}

TEST(GpuGemm, RepeatedShapeReusesItsCachedPlan) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(16);
  const int64_t M = 23, N = 41, K = 19;
  Tensor a = to_device(random_values(rng, {M, K}, DType::BF16, 1.0), DType::BF16);
  Tensor b = to_device(random_values(rng, {K, N}, DType::BF16, 1.0), DType::BF16);
  Tensor c1 = Tensor::empty({M, N}, DType::F32, Device::CUDA);
  Tensor c2 = Tensor::empty({M, N}, DType::F32, Device::CUDA);
  // Same pointers each time: pointer alignment is part of the plan's key.
  const size_t before = cuda::gemm_plan_cache_size();
  cuda::gemm(false, false, M, N, K, 1.0f, a.raw(), DType::BF16, K, b.raw(), DType::BF16, N, 0.0f,
             c1.raw(), DType::F32, N);
  EXPECT_EQ(cuda::gemm_plan_cache_size(), before + 1);
  device_sync();
  const Tensor first = to_host(c1);
  poison(c1);
  cuda::gemm(false, false, M, N, K, 1.0f, a.raw(), DType::BF16, K, b.raw(), DType::BF16, N, 0.0f,
             c1.raw(), DType::F32, N);
  EXPECT_EQ(cuda::gemm_plan_cache_size(), before + 1);
  device_sync();
  // The same plan gives the same bits.
  const Tensor second = to_host(c1);
  EXPECT_EQ(std::memcmp(first.raw(), second.raw(), first.nbytes()), 0);
  c2.copy_from(c1);
  // Another transpose is another plan.
  Tensor c3 = Tensor::empty({M, K}, DType::F32, Device::CUDA);
  cuda::gemm(false, true, M, K, N, 1.0f, c1.raw(), DType::F32, N, c2.raw(), DType::F32, N, 0.0f,
             c3.raw(), DType::F32, K);
  device_sync();
  EXPECT_EQ(cuda::gemm_plan_cache_size(), before + 2);
}

TEST(GpuGemm, RejectsUnsupportedArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Tensor buf = Tensor::zeros({64, 64}, DType::F32, Device::CUDA);
  void* p = buf.raw();
  // Mixed operand types.
  EXPECT_THROW(cuda::gemm(false, false, 4, 4, 4, 1.0f, p, DType::BF16, 4, p, DType::F32, 4, 0.0f,
                          p, DType::F32, 4),
               Error);
  // fp32 operands with a bf16 output.
  EXPECT_THROW(cuda::gemm(false, false, 4, 4, 4, 1.0f, p, DType::F32, 4, p, DType::F32, 4, 0.0f,
                          p, DType::BF16, 4),
               Error);
  // Leading dimensions narrower than the stored rows.
  EXPECT_THROW(cuda::gemm(false, false, 4, 6, 5, 1.0f, p, DType::F32, 4, p, DType::F32, 6, 0.0f,
                          p, DType::F32, 6),
               Error);
  EXPECT_THROW(cuda::gemm(true, false, 6, 4, 5, 1.0f, p, DType::F32, 5, p, DType::F32, 4, 0.0f,
                          p, DType::F32, 4),
               Error);
  EXPECT_THROW(cuda::gemm(false, true, 4, 6, 5, 1.0f, p, DType::F32, 5, p, DType::F32, 4, 0.0f,
                          p, DType::F32, 6),
               Error);
  EXPECT_THROW(cuda::gemm(false, false, 4, 6, 5, 1.0f, p, DType::F32, 5, p, DType::F32, 6, 0.0f,
                          p, DType::F32, 5),
               Error);
  // A bias epilogue without a bias.
  EXPECT_THROW(cuda::gemm_epilogue(false, false, 4, 4, 4, 1.0f, p, DType::F32, 4, p, DType::F32, 4,
                                   0.0f, p, DType::F32, 4, cuda::Epilogue::Bias, nullptr,
                                   DType::F32),
               Error);
}

TEST(GpuLinear, ForwardMatchesCpuForEveryBiasKind) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(21);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int64_t K = 71, N_out = 129;
  for (Shape x_shape : {Shape{3, 13, K}, Shape{1, K}})
    for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {  // none, bf16 (fused), fp32 (unfused)
      SCOPED_TRACE("x " + shape_str(x_shape) + " bias kind " + std::to_string(bias_kind));
      const DType bias_type = bias_kind == 2 ? DType::F32 : DType::BF16;
      Tensor x = random_values(rng, x_shape, DType::BF16, 1.0);
      Tensor w = random_values(rng, {K, N_out}, DType::BF16, 1.0);
      Tensor b = bias_kind ? random_values(rng, {N_out}, bias_type, 1.0) : Tensor();
      Shape y_shape = x_shape;
      y_shape.back() = N_out;

      Tensor x_dev = to_device(x, DType::BF16), w_dev = to_device(w, DType::BF16);
      Tensor b_dev = bias_kind ? to_device(b, bias_type) : Tensor();
      Tensor y_dev = Tensor::empty(y_shape, DType::BF16, Device::CUDA);
      poison(y_dev);
      cuda::linear_forward(x_dev, w_dev, b_dev, y_dev, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

      Tensor ref = Tensor::empty(y_shape, DType::F64), abs_ref = Tensor::empty(y_shape, DType::F64);
      ops::linear_forward(x, w, b, ref);
      ops::linear_forward(abs_of(x), abs_of(w), bias_kind ? abs_of(b) : Tensor(), abs_ref);
      const double tol = accumulation_bound(K, norm2(abs_ref), norm2(ref)) + rounding_bound(DType::BF16);
      EXPECT_LT(rel_error(to_host(y_dev).to(DType::F64), ref), tol);
    }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(GpuLinear, BackwardMatchesCpuAndAccumulates) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(22);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int64_t K = 71, N_out = 129;
  const Shape x_shape{3, 13, K}, y_shape{3, 13, N_out};
  const int64_t rows = 39;
  Tensor x = random_values(rng, x_shape, DType::BF16, 1.0);
  Tensor w = random_values(rng, {K, N_out}, DType::BF16, 1.0);
  Tensor dy = random_values(rng, y_shape, DType::BF16, 1.0);
  Tensor dw0 = random_values(rng, {K, N_out}, DType::F32, 1.0);
  Tensor db0 = random_values(rng, {N_out}, DType::F32, 1.0);

  Tensor x_dev = to_device(x, DType::BF16), w_dev = to_device(w, DType::BF16);
  Tensor dy_dev = to_device(dy, DType::BF16);
  Tensor dx_dev = Tensor::empty(x_shape, DType::BF16, Device::CUDA);
  Tensor dw_dev = to_device(dw0, DType::F32), db_dev = to_device(db0, DType::F32);
  poison(dx_dev);
  // Twice: dx is assigned (same answer), dw and db accumulate (two contributions).
  for (int i = 0; i < 2; ++i)
    cuda::linear_backward(dy_dev, x_dev, w_dev, &dx_dev, dw_dev, &db_dev, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  Tensor dx = Tensor::empty(x_shape, DType::F64), dw = dw0.clone(), db = db0.clone();
  Tensor abs_dx = Tensor::empty(x_shape, DType::F64), abs_dw = abs_of(dw0), abs_db = abs_of(db0);
  for (int i = 0; i < 2; ++i) {
    ops::linear_backward(dy, x, w, &dx, dw, &db);
    ops::linear_backward(abs_of(dy), abs_of(x), abs_of(w), &abs_dx, abs_dw, &abs_db);
  }
  // dx: one bf16 GEMM over N_out. dw, db: two fp32 accumulations over the rows each.
  const double tol_dx = accumulation_bound(N_out, norm2(abs_dx), norm2(dx)) + rounding_bound(DType::BF16);
  const double tol_dw = 2.0 * accumulation_bound(rows, norm2(abs_dw), norm2(dw)) + rounding_bound(DType::F32);
  const double tol_db = 2.0 * accumulation_bound(rows, norm2(abs_db), norm2(db)) + rounding_bound(DType::F32);
  EXPECT_LT(rel_error(to_host(dx_dev).to(DType::F64), dx), tol_dx);
  EXPECT_LT(rel_error(to_host(dw_dev).to(DType::F64), dw), tol_dw);
  EXPECT_LT(rel_error(to_host(db_dev).to(DType::F64), db), tol_db);

  // Without dx and db: only dw changes, by one contribution.
  Tensor dw_only_dev = to_device(dw0, DType::F32);
  cuda::linear_backward(dy_dev, x_dev, w_dev, nullptr, dw_only_dev, nullptr, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Tensor dw_only = dw0.clone(), abs_dw_only = abs_of(dw0);
  ops::linear_backward(dy, x, w, nullptr, dw_only, nullptr);
  ops::linear_backward(abs_of(dy), abs_of(x), abs_of(w), nullptr, abs_dw_only, nullptr);
  EXPECT_LT(rel_error(to_host(dw_only_dev).to(DType::F64), dw_only),
            accumulation_bound(rows, norm2(abs_dw_only), norm2(dw_only)) + rounding_bound(DType::F32));
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(GpuLinear, RejectsWrongShapesAndTypes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Tensor x = Tensor::zeros({4, 8}, DType::BF16, Device::CUDA);
  Tensor w = Tensor::zeros({8, 6}, DType::BF16, Device::CUDA);
  Tensor y = Tensor::zeros({4, 6}, DType::BF16, Device::CUDA);
  Tensor y_bad = Tensor::zeros({4, 5}, DType::BF16, Device::CUDA);
  Tensor y_f32 = Tensor::zeros({4, 6}, DType::F32, Device::CUDA);
  Tensor w_bad = Tensor::zeros({7, 6}, DType::BF16, Device::CUDA);
  Tensor x_cpu = Tensor::zeros({4, 8}, DType::BF16);
  EXPECT_THROW(cuda::linear_forward(x, w, Tensor(), y_bad), Error);
  EXPECT_THROW(cuda::linear_forward(x, w, Tensor(), y_f32), Error);
  EXPECT_THROW(cuda::linear_forward(x, w_bad, Tensor(), y), Error);
  EXPECT_THROW(cuda::linear_forward(x_cpu, w, Tensor(), y), Error);
  Tensor dw_bf16 = Tensor::zeros({8, 6}, DType::BF16, Device::CUDA);
  EXPECT_THROW(cuda::linear_backward(y, x, w, nullptr, dw_bf16, nullptr), Error);
}
