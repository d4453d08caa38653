// The wgmma building blocks (src/cuda/wgmma.cuh) against a float64 reference: descriptors, the
// panel layouts and their swizzles, and the fragment layouts, for the operand arrangements the
// kernels use, at every panel layout; and tiles loaded by the tensor memory accelerator
// (src/cuda/tma.cuh), bit for bit and as wgmma operands.
// Inputs are bf16, products exact in fp32, sums in fp32: the tolerance is fp32 summation error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/tma.h"
#include "gpu/gpu_testing.h"
#include "gpu/wgmma_probe.h"
#include "quiver/dtype.h"
#include "quiver/error.h"
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

namespace {

// The elements a TMA probe writes: `m` copied to the device, `count` outputs poisoned (all-ones
// bits), load(device m, device out) run, the outputs read back.
template <class Load>
std::vector<uint16_t> loaded_tile(const Operand& m, size_t count, Load load) {
  uint16_t *dm = nullptr, *dout = nullptr;
  QV_CUDA_CHECK(cudaMalloc(&dm, m.bits.size() * 2));
  QV_CUDA_CHECK(cudaMalloc(&dout, count * 2));
  QV_CUDA_CHECK(cudaMemcpy(dm, m.bits.data(), m.bits.size() * 2, cudaMemcpyHostToDevice));
  QV_CUDA_CHECK(cudaMemset(dout, 0xFF, count * 2));
  load(dm, dout);
  std::vector<uint16_t> got(count);
  QV_CUDA_CHECK(cudaDeviceSynchronize());
  QV_CUDA_CHECK(cudaMemcpy(got.data(), dout, count * 2, cudaMemcpyDeviceToHost));
  cudaFree(dm);
  cudaFree(dout);
  return got;
}

}  // namespace

// A 64-row tile at column offset k of a [100, 2k] matrix, rows 64..127 (28 past the end): the
// loaded panels hold the matrix's bits where Panels<k>::offset says, zeros past the end.
TEST(GpuTma, TilesLandInThePanelLayout) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kRows = 100;
  constexpr int kRow0 = 64;
  for (int k : kProbeWidths) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    Rng rng(110 + k);
    const int64_t cols = 2 * k;
    const Operand m = random_operand(kRows * cols, rng);
    std::vector<uint16_t> expect(64 * k, 0);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < k; ++c)
        if (kRow0 + r < kRows) expect[r * k + c] = m.bits[(kRow0 + r) * cols + k + c];
    EXPECT_EQ(loaded_tile(m, expect.size(), [&](const uint16_t* dm, uint16_t* dout) {
                tma_tile(dm, kRows, cols, kRow0, k, dout, k);
              }),
              expect);
  }
}

// A tile of one head of [B, T, H, Dh] tensors, as the warp-specialized dK/dV pass loads its
// query, dY, key and value tiles: the last rows of the last head of the second batch (28 past
// T), head widths narrower than their tiles (8 → 16, 40 → 48, 72 → 80) and equal to them.
TEST(GpuTma, HeadTilesLandInThePanelLayout) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t B = 2, T = 100, H = 3;
  constexpr int b = 1, h = 2, t0 = 64;
  const std::pair<int, int> widths[] = {{8, 16}, {16, 16}, {24, 32}, {40, 48}, {48, 48},
                                        {64, 64}, {72, 80}, {80, 80}, {96, 96}};
  for (const auto& [dh, k] : widths) {
    SCOPED_TRACE(testing::Message() << "Dh " << dh << ", tile " << k);
    Rng rng(150 + dh);
    const Operand m = random_operand(B * T * H * dh, rng);
    std::vector<uint16_t> expect(64 * k, 0);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < dh; ++c)
        if (t0 + r < T) expect[r * k + c] = m.bits[((b * T + t0 + r) * H + h) * dh + c];
    EXPECT_EQ(loaded_tile(m, expect.size(), [&](const uint16_t* dm, uint16_t* dout) {
                tma_head_tile(dm, B, T, H, dh, b, h, t0, dout, k);
              }),
              expect);
  }
}

// Heads whose rows are not 16-byte aligned (Dh not a multiple of 8), or a base off 16 bytes,
// cannot be TMA boxes: refused by name before the driver is asked. Needs no GPU.
TEST(GpuTma, HeadMapsRefuseWhatTheHardwareCannotLoad) {
  const void* base = reinterpret_cast<const void*>(uintptr_t{4096});
  try {
    cuda::tma_map_heads_bf16(base, 1, 64, 2, 60, 64, 64);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Dh a multiple of 8"), std::string::npos) << e.what();
  }
  try {
    cuda::tma_map_heads_bf16(reinterpret_cast<const void*>(uintptr_t{4100}), 1, 64, 2, 64, 64, 64);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::tma_map_heads_bf16(base, 1, 64, 2, 64, 64, 48), Error);  // no swizzle of 96-byte rows
}

// S = A Bᵀ from two TMA-loaded tiles of [100, k] matrices, rows 36..99 (all inside) and 64..127
// (the last 28 zero-filled): against float64.
TEST(GpuTma, LoadedTilesAreWgmmaOperands) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kRows = 100;
  for (int k : kProbeWidths)
    for (int row0 : {36, 64}) {
      SCOPED_TRACE(testing::Message() << "k " << k << ", row0 " << row0);
      Rng rng(130 + k + row0);
      const Operand a = random_operand(kRows * k, rng), b = random_operand(kRows * k, rng);
      std::vector<double> ref(64 * 64, 0.0);
      for (int i = 0; i < 64; ++i)
        for (int j = 0; j < 64; ++j)
          if (row0 + i < kRows && row0 + j < kRows)
            for (int kk = 0; kk < k; ++kk)
              ref[i * 64 + j] += a.values[(row0 + i) * k + kk] * b.values[(row0 + j) * k + kk];
      DeviceProduct run(a, b);
      tma_k_major(run.a, run.b, kRows, row0, run.c, k);
      EXPECT_LT(relative_error(run.result(), ref), kTol);
    }
}
