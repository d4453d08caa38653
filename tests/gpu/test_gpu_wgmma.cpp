// The wgmma building blocks (src/cuda/wgmma.cuh) against a float64 reference: descriptors, the
// panel layouts and their swizzles, and the fragment layouts, for the operand arrangements the
// kernels use, at every panel layout.
// Inputs are bf16, products exact in fp32, sums in fp32: the tolerance is fp32 summation error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/check.h"
#include "gpu/gpu_testing.h"
#include "gpu/wgmma_probe.h"
#include "quiver/dtype.h"
#include "quiver/rng.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kTol = 1e-5;

struct Operand {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};

Operand random_operand(int64_t n, Rng& rng) {
  Tensor t = random_bf16({n}, rng);
  Operand o{std::vector<uint16_t>(n), std::vector<double>(n)};
  const bf16* p = t.data<bf16>();
  for (int64_t i = 0; i < n; ++i) {
    o.bits[i] = p[i].bits;
    o.values[i] = static_cast<double>(bf16_to_float(p[i]));
  }
  return o;
}

// Device buffers of the operands, the product back on the host.
struct DeviceProduct {
  uint16_t* a = nullptr;
  uint16_t* b = nullptr;
  float* c = nullptr;
  int n;  // columns of c [64, n]
  DeviceProduct(const Operand& x, const Operand& y, int n_cols = 64) : n(n_cols) {
    QV_CUDA_CHECK(cudaMalloc(&a, x.bits.size() * 2));
    QV_CUDA_CHECK(cudaMalloc(&b, y.bits.size() * 2));
    QV_CUDA_CHECK(cudaMalloc(&c, 64 * n * sizeof(float)));
    QV_CUDA_CHECK(cudaMemcpy(a, x.bits.data(), x.bits.size() * 2, cudaMemcpyHostToDevice));
    QV_CUDA_CHECK(cudaMemcpy(b, y.bits.data(), y.bits.size() * 2, cudaMemcpyHostToDevice));
    QV_CUDA_CHECK(cudaMemset(c, 0xFF, 64 * n * sizeof(float)));  // NaN where nothing is written
  }
  ~DeviceProduct() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  std::vector<float> result() const {
    std::vector<float> h(64 * n);
    QV_CUDA_CHECK(cudaDeviceSynchronize());
    QV_CUDA_CHECK(cudaMemcpy(h.data(), c, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

// ‖got − ref‖ / ‖ref‖ (NaN stays NaN).
double relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double diff = 0, base = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    base += ref[i] * ref[i];
  }
  return std::sqrt(diff / base);
}

}  // namespace

TEST(GpuWgmma, KMajorOperandsInSharedMemory) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int k : kProbeWidths) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    Rng rng(70 + k);
    const Operand a = random_operand(64 * k, rng), b = random_operand(64 * k, rng);
    std::vector<double> ref(64 * 64, 0.0);  // a · bᵀ
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j)
        for (int kk = 0; kk < k; ++kk) ref[i * 64 + j] += a.values[i * k + kk] * b.values[j * k + kk];
    DeviceProduct run(a, b);
    wgmma_k_major(run.a, run.b, run.c, k);
    EXPECT_LT(relative_error(run.result(), ref), kTol);
  }
}

TEST(GpuWgmma, RegisterAAndMnMajorB) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int n : kProbeWidths) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    Rng rng(80 + n);
    const Operand a = random_operand(64 * 64, rng), b = random_operand(64 * n, rng);
    std::vector<double> ref(64 * n, 0.0);  // a · b
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < n; ++j)
        for (int kk = 0; kk < 64; ++kk) ref[i * n + j] += a.values[i * 64 + kk] * b.values[kk * n + j];
    DeviceProduct run(a, b, n);
    wgmma_registers_mn_major(run.a, run.b, run.c, n);
    EXPECT_LT(relative_error(run.result(), ref), kTol);
  }
}

TEST(GpuWgmma, MnMajorOperandsInSharedMemory) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int n : kProbeWidths) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    Rng rng(90 + n);
    const Operand a = random_operand(64 * 64, rng), b = random_operand(64 * n, rng);
    std::vector<double> ref(64 * n, 0.0);  // aᵀ · b
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < n; ++j)
        for (int kk = 0; kk < 64; ++kk) ref[i * n + j] += a.values[kk * 64 + i] * b.values[kk * n + j];
    DeviceProduct run(a, b, n);
    wgmma_mn_major(run.a, run.b, run.c, n);
    EXPECT_LT(relative_error(run.result(), ref), kTol);
  }
}
