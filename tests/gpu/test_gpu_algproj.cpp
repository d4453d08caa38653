// GPU algebraic projection (cuda::AlgProj) against the independent formula of SPEC §1.3
// (ops::algproj_reference_forward/backward), in F64 on the same bf16-rounded inputs.
//
// Tolerances (relative norm error ‖out − ref‖/‖ref‖):
// - Accumulation: every product of bf16 values is exact in fp32; each output element is an
//   fp32 sum of at most `inner` such products (inner = K for y, N for dX, M for dW) plus one
//   addition per rectangle and per scatter-add (≤ q + 2 more), in any order. So
//   |err| ≤ γ_{inner+q+2} (|X|·|W ⊙ Mask|) elementwise, γ_n ≈ n·2^-24; we allow twice that
//   (truncating adders) times ‖|X|·|W⊙Mask|‖/‖ref‖, where the absolute-value product is the
//   reference evaluated on |X|, |W|, |dY|.
// - Output rounding: bf16 outputs are rounded once (unit roundoff 2^-8); we allow two units.
//   dW is fp32: two units of 2^-24.
// A missing, doubled or misplaced block, a wrong row, or an unwritten (NaN-poisoned) element
// gives an error of order 1 (or NaN), far above these bounds.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "algebra/law.h"
#include "cuda/algproj.h"
#include "cuda/algproj_fused_launch.h"
#include "cuda/algproj_launch.h"
#include "cuda/calibration.h"
#include "cuda/backend.h"
#include "cuda/ops.h"
#include "gpu/gpu_testing.h"
#include "ops/algproj.h"
#include "ops/algproj_tiles.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kBf16Unit = 1.0 / 256.0;      // 2^-8
constexpr double kF32Unit = 1.0 / 16777216.0;  // 2^-24

void register_gpu() { cuda::register_backend(); }

// fn must throw a quiver::Error whose message contains `needle`.
template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Random F64 values exactly representable in bf16.
Tensor random_bf16_values(Rng& rng, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::BF16);
  rng.fill_normal(t, 0.0, 1.0);
  return t.to(DType::F64);
}

bool all_finite(const Tensor& f64) {
  const double* p = f64.data<double>();
  for (int64_t i = 0; i < f64.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

double bound(int64_t terms, int q, const Tensor& abs_ref, const Tensor& ref, double out_unit) {
  const double r = norm2(ref);
  return 2.0 * static_cast<double>(terms + q + 2) * kF32Unit * norm2(abs_ref) / r +
         2.0 * out_unit;
}

enum class Sched { Cyclic, Interval, Random };

std::vector<int> make_types(Sched sched, int64_t M, int q, uint64_t seed) {
  switch (sched) {
    case Sched::Cyclic:
      return algebra::Schedule::cyclic().types(0, M, q);
    case Sched::Interval: {  // one period P ≥ M (divisible by q): each type a contiguous run
      const int64_t P = ((M + q - 1) / q) * q;
      return algebra::Schedule::interval(P).types(0, M, q);
    }
    case Sched::Random: {
      Rng rng(seed);
      std::vector<int> t(M);
      for (auto& v : t) v = static_cast<int>(rng.below(q));
      return t;
    }
  }
  return {};
}

// Whether some type's rows do not form an arithmetic progression (the gather branch).
bool has_irregular_type(const std::vector<int>& types, int q) {
  for (int a = 0; a < q; ++a) {
    std::vector<int64_t> rows;
    for (size_t m = 0; m < types.size(); ++m)
      if (types[m] == a) rows.push_back(static_cast<int64_t>(m));
    for (size_t i = 2; i < rows.size(); ++i)
      if (rows[i] - rows[i - 1] != rows[1] - rows[0]) return true;
  }
  return false;
}

struct Case {
  std::string law;
  std::vector<int64_t> in, out;  // group widths; empty: equal widths of K and N
  int64_t K = 64, N = 48;
  ops::RowAccess access = ops::RowAccess::InPlace;
};

algebra::GroupWidths widths_of(const Case& c, int q) {
  if (c.in.empty()) return algebra::GroupWidths::equal(q, c.K, c.N);
  return algebra::GroupWidths{c.in, c.out};
}

// Where a result is furthest from its reference: the element, its row's type, both values, and
// how many elements of the worst one's row and column are off by more than half its error.
std::string worst_element(const Tensor& got, const Tensor& ref, const std::vector<int>& types) {
  const int64_t rows = ref.dim(0), cols = ref.dim(1);
  const double* g = got.data<double>();
  const double* r = ref.data<double>();
  int64_t at = 0;
  for (int64_t i = 1; i < rows * cols; ++i)
    if (std::abs(g[i] - r[i]) > std::abs(g[at] - r[at])) at = i;
  const int64_t row = at / cols, col = at % cols;
  const double cut = std::abs(g[at] - r[at]) / 2;
  int in_row = 0, in_col = 0;
  for (int64_t c = 0; c < cols; ++c) in_row += std::abs(g[row * cols + c] - r[row * cols + c]) > cut;
  for (int64_t i = 0; i < rows; ++i) in_col += std::abs(g[i * cols + col] - r[i * cols + col]) > cut;
  std::string out =
      fmt::format("worst at row {} (type {}), column {}: {} against {}; {} such in its row, {} in its column", row,
                  types[row], col, g[at], r[at], in_row, in_col);
  // The relative error of each row type's 64-column blocks, where it is above 1%.
  const int q = 1 + *std::max_element(types.begin(), types.end());
  for (int t = 0; t < q; ++t)
    for (int64_t c0 = 0; c0 < cols; c0 += 64) {
      double e = 0, n = 0;
      for (int64_t i = 0; i < rows; ++i)
        if (types[i] == t)
          for (int64_t c = c0; c < std::min(cols, c0 + 64); ++c) {
            e += (g[i * cols + c] - r[i * cols + c]) * (g[i * cols + c] - r[i * cols + c]);
            n += r[i * cols + c] * r[i * cols + c];
          }
      if (n > 0 && std::sqrt(e / n) > 0.01)
        out += fmt::format("; type {} columns {}+: {:.3f}", t, c0, std::sqrt(e / n));
    }
  return out;
}

// Forward, dX and dW of one law / widths / row-type arrangement against the reference;
// also checks that the GPU class cuts the support exactly as the CPU class. Each kernel set pins
// the kernels of its passes (unset: calibrated, the default); the references are computed once.
void check_case(const Case& c, const std::vector<int>& types, uint64_t seed,
                const std::vector<cuda::AlgProj::Kernels>& kernel_sets) {
  const algebra::Law law = algebra::Law::parse(c.law);
  const int q = law.q();
  const algebra::GroupWidths widths = widths_of(c, q);
  SCOPED_TRACE(fmt::format("law {}, K {}, N {}, M {}", c.law, widths.K(), widths.N(), types.size()));
  const ops::AlgProj cpu(law, widths, c.access);

  const int64_t M = static_cast<int64_t>(types.size()), K = widths.K(), N = widths.N();
  Rng rng(seed);
  const Tensor x = random_bf16_values(rng, {M, K});
  const Tensor w = random_bf16_values(rng, {K, N});
  const Tensor dy = random_bf16_values(rng, {M, N});

  Tensor y_ref = Tensor::empty({M, N}, DType::F64), y_abs = Tensor::empty({M, N}, DType::F64);
  ops::algproj_reference_forward(x, w, law, widths, types, y_ref);
  ops::algproj_reference_forward(abs_of(x), abs_of(w), law, widths, types, y_abs);
  Tensor dx_ref = Tensor::empty({M, K}, DType::F64), dw_ref = Tensor::empty({K, N}, DType::F64);
  Tensor dx_abs = Tensor::empty({M, K}, DType::F64), dw_abs = Tensor::empty({K, N}, DType::F64);
  ops::algproj_reference_backward(x, w, dy, law, widths, types, dx_ref, dw_ref);
  ops::algproj_reference_backward(abs_of(x), abs_of(w), abs_of(dy), law, widths, types, dx_abs,
                                  dw_abs);

  const Tensor xd = to_device(x, DType::BF16), wd = to_device(w, DType::BF16),
               dyd = to_device(dy, DType::BF16);
  // Calibration (unpinned passes, shapes not in the kernel cache) rejects no candidate.
  const int64_t rejected = cuda::AlgProj::rejected_candidates();
  for (const cuda::AlgProj::Kernels& kernels : kernel_sets) {
    SCOPED_TRACE(fmt::format("kernel set {}", &kernels - kernel_sets.data()));
    cuda::AlgProj gpu(law, widths, c.access);
    gpu.set_kernels(kernels);
    ASSERT_EQ(gpu.shared_products(), cpu.shared_products());
    for (int a = 0; a < q; ++a) ASSERT_EQ(gpu.type_products(a), cpu.type_products(a));
    Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
    Tensor dx = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
    Tensor dw = Tensor::empty({K, N}, DType::F32, Device::CUDA);

    // Twice: the second call reuses the cached plans and scratch.
    for (int rep = 0; rep < 2; ++rep) {
      SCOPED_TRACE("call " + std::to_string(rep));
      poison(y);
      poison(dx);
      poison(dw);
      gpu.forward(xd, wd, types, y);
      gpu.backward(xd, wd, dyd, types, &dx, &dw);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Tensor yh = to_host_f64(y), dxh = to_host_f64(dx), dwh = to_host_f64(dw);
      ASSERT_TRUE(all_finite(yh));
      ASSERT_TRUE(all_finite(dxh));
      ASSERT_TRUE(all_finite(dwh));
      EXPECT_LE(rel_error(yh, y_ref), bound(K, q, y_abs, y_ref, kBf16Unit)) << worst_element(yh, y_ref, types);
      EXPECT_LE(rel_error(dxh, dx_ref), bound(N, q, dx_abs, dx_ref, kBf16Unit)) << worst_element(dxh, dx_ref, types);
      EXPECT_LE(rel_error(dwh, dw_ref), bound(M, q, dw_abs, dw_ref, kF32Unit));
    }
    if (kernels.forward) EXPECT_EQ(gpu.last_kernel(ops::AlgPass::Forward), *kernels.forward);
    if (kernels.dx) EXPECT_EQ(gpu.last_kernel(ops::AlgPass::DX), *kernels.dx);
    if (kernels.dw) EXPECT_EQ(gpu.last_kernel(ops::AlgPass::DW), *kernels.dw);
    // y and dw accumulate when asked: the result + the result again.
    gpu.forward(xd, wd, types, y, nullptr, true);
    Tensor y_twice = y_ref.clone();
    for (int64_t i = 0; i < y_twice.numel(); ++i) y_twice.data<double>()[i] *= 2;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // One more bf16 rounding (two with the products schedule) of a value twice as large.
    EXPECT_LE(rel_error(to_host_f64(y), y_twice), bound(K, q, y_abs, y_ref, kBf16Unit) + 2 * kBf16Unit);
    gpu.backward(xd, wd, dyd, types, nullptr, &dw, nullptr, true);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor twice = dw_ref.clone();
    for (int64_t i = 0; i < twice.numel(); ++i) twice.data<double>()[i] *= 2;
    EXPECT_LE(rel_error(to_host_f64(dw), twice), 2 * bound(M, q, dw_abs, dw_ref, kF32Unit));
  }
  EXPECT_EQ(cuda::AlgProj::rejected_candidates(), rejected) << "a calibration candidate disagreed (stderr names it)";
}
// One kernel set (unset passes: calibrated, the default).
void check_case(const Case& c, const std::vector<int>& types, uint64_t seed, const cuda::AlgProj::Kernels& kernels = {}) {
  check_case(c, types, seed, std::vector<cuda::AlgProj::Kernels>{kernels});
}

const Case kDense{"dense:4"};
const Case kQ4{"Q4"};
const Case kQ2xQ2{"Q2xQ2"};
const Case kGraph{"graph:4:0>1,1>2,2>3"};
const Case kBlockDiag{"blockdiag:4"};
// Odd, unequal widths: unaligned group offsets and leading dimensions (products only).
const Case kUnequal{"Q4", {8, 24, 5, 27}, {16, 3, 40, 13}};
// Even, unequal widths, not multiples of 8: the fused kernels' 4-byte copies.
const Case kUnequalEven{"Q4", {10, 22, 6, 26}, {18, 4, 42, 8}};
// Wider than one tile in every dimension, widths multiples of 8 (16-byte copies).
const Case kWide{"Q4", {}, {}, 288, 544};

// Whether two device tensors of one shape and dtype hold the same bytes.
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = to_host(a), hb = to_host(b);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

using cuda::AlgKernel;
AlgKernel fused(int config) { return {AlgKernel::Kind::Fused, config}; }
const AlgKernel kProducts{AlgKernel::Kind::Products, 0};

}  // namespace

TEST(GpuAlgProj, DenseLawDirectPath) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Dense: one shared rectangle, no per-type products: the GEMM writes bf16 directly.
  const cuda::AlgProj p(algebra::Law::parse("dense:4"), algebra::GroupWidths::equal(4, 64, 48));
  EXPECT_EQ(p.shared_products(), 1u);
  for (int a = 0; a < 4; ++a) EXPECT_EQ(p.type_products(a), 0u);
  check_case(kDense, make_types(Sched::Cyclic, 37, 4, 1), 11);
  check_case(kDense, make_types(Sched::Random, 37, 4, 2), 12);
}

TEST(GpuAlgProj, CyclicRowsStrided) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Cyclic types: each type's rows are a progression of stride q (strided operands).
  for (const Case* c : {&kQ4, &kQ2xQ2, &kGraph, &kBlockDiag, &kUnequal})
    check_case(*c, make_types(Sched::Cyclic, 37, 4, 3), 21);
}

TEST(GpuAlgProj, IntervalRowsContiguous) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Interval types within one period: each type's rows are contiguous (stride 1).
  for (const Case* c : {&kQ4, &kQ2xQ2, &kGraph, &kBlockDiag, &kUnequal})
    check_case(*c, make_types(Sched::Interval, 37, 4, 4), 31);
}

TEST(GpuAlgProj, RandomRowsGathered) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Random types: irregular rows are gathered, multiplied and scatter-added back.
  const std::vector<int> types = make_types(Sched::Random, 37, 4, 5);
  ASSERT_TRUE(has_irregular_type(types, 4));
  for (const Case* c : {&kQ4, &kQ2xQ2, &kGraph, &kBlockDiag, &kUnequal})
    check_case(*c, types, 41);
}

TEST(GpuAlgProj, GatherAccessForcesGather) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // RowAccess::Gather gathers strided (cyclic) rows instead of using them in place.
  Case q4 = kQ4, unequal = kUnequal;
  q4.access = unequal.access = ops::RowAccess::Gather;
  check_case(q4, make_types(Sched::Cyclic, 37, 4, 6), 51);
  check_case(unequal, make_types(Sched::Cyclic, 37, 4, 6), 52);
  check_case(q4, make_types(Sched::Interval, 37, 4, 6), 53);
}

TEST(GpuAlgProj, DecodeFewRowsMixedTypes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Decoding: one row, and three rows of mixed types (type 3 at rows 0 and 2: stride 2).
  for (const Case* c : {&kDense, &kQ4, &kQ2xQ2, &kGraph, &kBlockDiag, &kUnequal}) {
    check_case(*c, {2}, 61);
    check_case(*c, {3, 1, 3}, 62);
    check_case(*c, {0, 2, 1}, 63);
  }
}

TEST(GpuAlgProj, LargerBatchOddShapes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // More rows and wider groups than the other tests, beyond one GEMM tile in every dimension.
  Case big{"Q4"};
  big.K = 260;
  big.N = 196;
  check_case(big, make_types(Sched::Cyclic, 301, 4, 7), 71);
  check_case(big, make_types(Sched::Random, 301, 4, 8), 72);
  Case big8{"Q2xQ2xQ2"};
  big8.K = 136;
  big8.N = 200;
  check_case(big8, make_types(Sched::Cyclic, 203, 8, 9), 73);
}

TEST(GpuAlgProj, BackwardOptionalOutputs) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // dx only, then dw only: each matches the reference; the other is not touched.
  const algebra::Law law = algebra::Law::parse("Q4");
  const algebra::GroupWidths widths{{8, 24, 5, 27}, {16, 3, 40, 13}};
  const cuda::AlgProj gpu(law, widths);
  const int64_t M = 29, K = widths.K(), N = widths.N();
  const std::vector<int> types = make_types(Sched::Random, M, 4, 10);
  Rng rng(81);
  const Tensor x = random_bf16_values(rng, {M, K}), w = random_bf16_values(rng, {K, N}),
               dy = random_bf16_values(rng, {M, N});
  Tensor dx_ref = Tensor::empty({M, K}, DType::F64), dw_ref = Tensor::empty({K, N}, DType::F64);
  ops::algproj_reference_backward(x, w, dy, law, widths, types, dx_ref, dw_ref);
  const Tensor xd = to_device(x, DType::BF16), wd = to_device(w, DType::BF16),
               dyd = to_device(dy, DType::BF16);
  Tensor dx = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
  Tensor dw = Tensor::empty({K, N}, DType::F32, Device::CUDA);
  // Loose bounds here (shapes are small: the accumulation term is below 2^-12); the
  // derivation is in the file comment.
  poison(dx);
  gpu.backward(xd, wd, dyd, types, &dx, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(rel_error(to_host_f64(dx), dx_ref), 2 * kBf16Unit + 1.0 / 4096);
  poison(dw);
  gpu.backward(xd, wd, dyd, types, nullptr, &dw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(rel_error(to_host_f64(dw), dw_ref), 1.0 / 4096);
}

TEST(GpuAlgProj, EveryFusedTileShapeEveryPass) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Each row-pass tile shape for forward and dX, each dW tile shape, over laws, widths (16-
  // and 4-byte copies), row arrangements (strided, contiguous, arbitrary, decode rows), and
  // row counts that leave partial tiles.
  auto fused_count = [](ops::AlgPass pass) {
    int n = 0;
    for (const AlgKernel& k : cuda::AlgProj::kernel_candidates(pass)) n += k.kind == AlgKernel::Kind::Fused && !k.split;
    return n;
  };
  const int row_configs = fused_count(ops::AlgPass::Forward), dw_configs = fused_count(ops::AlgPass::DW);
  ASSERT_GE(row_configs, 2);
  ASSERT_GE(dw_configs, 2);
  for (int c = 0; c < row_configs; ++c) {
    SCOPED_TRACE("tile config " + std::to_string(c));
    // Packed configurations run the forward only (PackedTilesEveryConfig below).
    const bool packed = cuda::detail::kAlgRowConfigs[c].packed;
    const cuda::AlgProj::Kernels k{fused(c), fused(packed ? 0 : c), fused(c % dw_configs)};
    for (const Case* cs : {&kQ4, &kQ2xQ2, &kGraph, &kBlockDiag, &kDense, &kUnequalEven}) {
      check_case(*cs, make_types(Sched::Cyclic, 37, 4, 3), 101 + c, k);
      check_case(*cs, make_types(Sched::Random, 37, 4, 5), 111 + c, k);
      check_case(*cs, {3, 1, 3}, 121 + c, k);
    }
    check_case(kWide, make_types(Sched::Interval, 301, 4, 4), 131 + c, k);
    check_case(kWide, make_types(Sched::Cyclic, 130, 4, 4), 141 + c, k);
    check_case(kWide, {2}, 151 + c, k);
  }
}

TEST(GpuAlgProj, PackedTilesEveryConfig) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Packed plans (ops/algproj_tiles.h): tiles of several whole output groups whose segments
  // apply to some of their columns, laid end to end in chunks. Narrow groups as Q_256 at
  // Qwen3-32B (reductions of 20, output groups of 100: 4-byte copies, three segments in one
  // chunk), reductions of 8 into groups of 24 (16-byte copies), output groups wider than a tile
  // (cut), unequal widths, and laws whose segments merge or cover a tile's columns in pieces.
  const Case narrow{"Q16", {}, {}, 320, 1600};
  const Case narrow8{"Q8", {}, {}, 64, 192};
  const Case wide_groups{"Q4", {}, {}, 160, 1088};
  int packed = 0;
  for (int c = 0; c < cuda::detail::kAlgRowConfigCount; ++c) {
    if (!cuda::detail::kAlgRowConfigs[c].packed) continue;
    ++packed;
    SCOPED_TRACE("packed tile config " + std::to_string(c));
    const cuda::AlgProj::Kernels k{fused(c), fused(0), fused(0)};
    for (const Case* cs : {&narrow, &narrow8, &wide_groups, &kUnequalEven, &kQ2xQ2, &kGraph, &kDense}) {
      const int q = algebra::Law::parse(cs->law).q();
      check_case(*cs, make_types(Sched::Cyclic, 300, q, 0), 201 + c, k);
      check_case(*cs, make_types(Sched::Random, 77, q, 3), 211 + c, k);
      check_case(*cs, {3, 1, 3}, 221 + c, k);
    }
    check_case(narrow, make_types(Sched::Interval, 2100, 16, 0), 231 + c, k);
    // Classes of equal rows: every tile is one box, which staged configurations store by TMA
    // (ops::uniform_store_box), strided (cyclic types, 128 and 32 rows a type) or contiguous.
    const cuda::detail::AlgKernelConfig& cfg = cuda::detail::kAlgRowConfigs[c];
    for (const std::vector<int>& types : {make_types(Sched::Cyclic, 2048, 16, 0), make_types(Sched::Cyclic, 512, 16, 0),
                                          make_types(Sched::Interval, 2048, 16, 0)}) {
      const ops::AlgRowPlan plan = ops::plan_row_pass(algebra::Law::parse(narrow.law), widths_of(narrow, 16), types,
                                                      ops::AlgPass::Forward, cfg.rows, cfg.cols, false, cfg.chunk);
      EXPECT_GT(ops::uniform_store_box(plan, static_cast<int64_t>(types.size())).rows, 0);
      check_case(narrow, types, 241 + c, k);
    }
  }
  EXPECT_GE(packed, 1);
}

TEST(GpuAlgProj, PairKernelEveryConfig) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The pair kernel (algproj_pair.cu) on pair plans (ops::plan_pair_pass): Q_256 at Qwen3-32B in
  // miniature (blocks of 20 at leads 0 and 4 into groups of 100, in pairs), Q_128's (blocks of 40
  // into groups of 200), a group cut in two, a graph law whose groups mostly lack the typed block,
  // blocks of 18 (leads 0 to 6), cyclic and interval rows; each configuration where its plan exists,
  // forward assigned and accumulated (check_case), the backward on the fused kernels.
  struct PairCase {
    Case c;
    std::vector<int> (*types)(int rows_per_type, int q);
  };
  auto cyclic = +[](int rows, int q) { return make_types(Sched::Cyclic, int64_t{rows} * q, q, 0); };
  auto interval = +[](int rows, int q) { return make_types(Sched::Interval, int64_t{rows} * q, q, 0); };
  const PairCase cases[] = {
      {{"Q16", {}, {}, 320, 1600}, cyclic},    {{"Q16", {}, {}, 320, 1600}, interval},
      {{"Q8", {}, {}, 320, 1600}, cyclic},     {{"Q4", {}, {}, 160, 1600}, cyclic},
      {{"graph:4:0>1,2>3", {}, {}, 80, 400}, cyclic}, {{"Q8", {}, {}, 144, 192}, cyclic},
  };
  // Per case and row count, every configuration of those rows whose plan exists, on one reference.
  int ran[cuda::detail::kAlgPairConfigCount] = {};
  for (const PairCase& pc : cases) {
    const algebra::Law law = algebra::Law::parse(pc.c.law);
    for (int rows : {64, 128})
      // One tile a type, and for the last case 40 (1280 tiles or more: each block goes round its
      // ring more than once, the producer refilling stages).
      for (int per_type : {rows, &pc == &cases[5] ? 40 * rows : 0}) {
        if (per_type == 0) continue;
        const std::vector<int> types = pc.types(per_type, law.q());
        std::vector<cuda::AlgProj::Kernels> sets;
        for (int c = 0; c < cuda::detail::kAlgPairConfigCount; ++c) {
          const cuda::detail::AlgPairConfig& cfg = cuda::detail::kAlgPairConfigs[c];
          if (cfg.rows != rows) continue;
          const ops::AlgPairPlan plan =
              ops::plan_pair_pass(law, widths_of(pc.c, law.q()), types, cfg.rows, cfg.groups, cfg.group_box);
          if (plan.tiles.empty() || !cuda::detail::alg_pair_runs(cfg, plan.slot, plan.tile_cols, plan.own_gap)) continue;
          ++ran[c];
          sets.push_back({AlgKernel{AlgKernel::Kind::Pair, c}, fused(0), fused(0)});
        }
        if (!sets.empty()) check_case(pc.c, types, 261 + (&pc - cases) + per_type, sets);
      }
  }
  for (int c = 0; c < cuda::detail::kAlgPairConfigCount; ++c) EXPECT_GE(ran[c], 2) << "pair config " << c;
  // A kernel pinned where its plan cannot exist names the problem.
  cuda::AlgProj gpu(algebra::Law::parse("Q2xQ2"), algebra::GroupWidths::equal(4, 64, 256));
  gpu.set_kernels({AlgKernel{AlgKernel::Kind::Pair, 0}, {}, {}});
  const std::vector<int> types = make_types(Sched::Cyclic, 512, 4, 0);
  Tensor x = Tensor::empty({512, 64}, DType::BF16, Device::CUDA), w = Tensor::empty({64, 256}, DType::BF16, Device::CUDA);
  Tensor y = Tensor::empty({512, 256}, DType::BF16, Device::CUDA);
  EXPECT_THROW(gpu.forward(x, w, types, y), Error);
}

TEST(GpuAlgProj, SplitReductionsEveryRowTile) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Q16 dX: a type's own group reduces over N = 2048, the others over 128, so every row tile
  // shape splits those tiles (ops::plan_row_pass) and adds the slots in a second pass.
  const Case q16{"Q16", {}, {}, 256, 2048};
  const algebra::Law law = algebra::Law::parse(q16.law);
  const std::vector<int> cyclic = make_types(Sched::Cyclic, 256, 16, 0);
  int row_configs = 0;
  for (const AlgKernel& k : cuda::AlgProj::kernel_candidates(ops::AlgPass::DX)) row_configs += k.kind == AlgKernel::Kind::Fused;
  for (int c = 0; c < row_configs; ++c) {
    SCOPED_TRACE("tile config " + std::to_string(c));
    const ops::AlgRowPlan plan = ops::plan_row_pass(law, widths_of(q16, 16), cyclic, ops::AlgPass::DX,
                                                    cuda::detail::kAlgRowConfigs[c].rows,
                                                    cuda::detail::kAlgRowConfigs[c].cols);
    ASSERT_FALSE(plan.splits.empty());
    const cuda::AlgProj::Kernels k{fused(c), fused(c), fused(0)};
    check_case(q16, cyclic, 171 + c, k);
    check_case(q16, make_types(Sched::Random, 256, 16, 9), 181 + c, k);
  }
}

TEST(GpuAlgProj, SplitRowListsEveryWeightTile) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Q16 dW: the diagonal blocks reduce over all 2048 rows, the others over 128, so every dW
  // tile shape splits the diagonal tiles' row lists (ops::plan_weight_pass).
  const Case q16{"Q16", {}, {}, 256, 256};
  const algebra::Law law = algebra::Law::parse(q16.law);
  const std::vector<int> cyclic = make_types(Sched::Cyclic, 2048, 16, 0);
  int dw_configs = 0;
  for (const AlgKernel& k : cuda::AlgProj::kernel_candidates(ops::AlgPass::DW)) dw_configs += k.kind == AlgKernel::Kind::Fused && !k.split;
  for (int c = 0; c < dw_configs; ++c) {
    SCOPED_TRACE("dW tile config " + std::to_string(c));
    const ops::AlgWeightPlan plan = ops::plan_weight_pass(law, widths_of(q16, 16), cyclic,
                                                          cuda::detail::kAlgWeightConfigs[c].rows,
                                                          cuda::detail::kAlgWeightConfigs[c].cols);
    ASSERT_FALSE(plan.splits.empty());
    check_case(q16, cyclic, 191 + c, {fused(0), fused(0), AlgKernel{AlgKernel::Kind::Fused, c, true}});
  }
}

TEST(GpuAlgProj, ProductsScheduleWhenPinned) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  const cuda::AlgProj::Kernels k{kProducts, kProducts, kProducts};
  for (const Case* cs : {&kQ4, &kQ2xQ2, &kUnequalEven, &kWide}) {
    check_case(*cs, make_types(Sched::Cyclic, 37, 4, 3), 161, k);
    check_case(*cs, make_types(Sched::Random, 37, 4, 5), 162, k);
  }
}

TEST(GpuAlgProj, CalibrationCheckSumsEveryElement) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The sums calibration judges a candidate by, against float64 on the host, bf16 and fp32, over
  // a length no block count divides; then with one element NaN.
  const int64_t n = 300001;
  Rng rng(171);
  Tensor got = random_bf16_values(rng, {n});
  const Tensor ref = random_bf16_values(rng, {n});
  for (int nan = 0; nan < 2; ++nan) {
    if (nan) got.data<double>()[n / 3] = std::nan("");
    double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double g = got.data<double>()[i], r = ref.data<double>()[i];
      const double d = std::isfinite(g - r) ? std::abs(g - r) : std::numeric_limits<double>::infinity();
      diff2 += d * d;
      ref2 += r * r;
      max_diff = std::max(max_diff, d);
      max_ref = std::max(max_ref, std::abs(r));
    }
    for (DType dtype : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(fmt::format("{}, nan {}", dtype == DType::F32 ? "f32" : "bf16", nan));
      const Tensor gd = to_device(got, dtype), rd = to_device(ref, dtype);
      Tensor sums = Tensor::empty({4}, DType::F64, Device::CUDA);
      poison(sums);
      ASSERT_EQ(cudaMemset(sums.raw(), 0, sums.nbytes()), cudaSuccess);
      cuda::detail::launch_compare_outputs(gd.raw(), rd.raw(), dtype == DType::F32, n,
                                           static_cast<double*>(sums.raw()), nullptr);
      const Tensor h = to_host(sums);
      const double* s = h.data<double>();
      if (nan) {
        EXPECT_EQ(s[0], std::numeric_limits<double>::infinity());
        EXPECT_EQ(s[2], std::numeric_limits<double>::infinity());
        EXPECT_FALSE(cuda::outputs_agree({s[0], s[1], s[2], s[3]}));
      } else {
        // Differences of bf16 values are exact in fp32, their squares in fp64: only the order of
        // the additions differs.
        EXPECT_NEAR(s[0], diff2, 1e-12 * diff2);
        EXPECT_EQ(s[2], max_diff);
      }
      EXPECT_NEAR(s[1], ref2, 1e-12 * ref2);
      EXPECT_EQ(s[3], max_ref);
    }
  }
}

TEST(GpuAlgProj, CalibrationOnNonFiniteInputsRejectsNothing) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Inputs holding a NaN (as uninitialized buffers may) leave the products schedule's output no
  // reference: calibration times the candidates unchecked instead of rejecting every one, which
  // would keep the products schedule for the shape. A shape no other test calibrates.
  const algebra::Law law = algebra::Law::parse("Q4");
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(4, 96, 136);
  const int64_t M = 68, K = 96, N = 136, bad_row = 5;
  Rng rng(181);
  Tensor x = random_bf16_values(rng, {M, K});
  x.data<double>()[bad_row * K + 7] = std::nan("");
  const Tensor w = random_bf16_values(rng, {K, N});
  const std::vector<int> types = make_types(Sched::Cyclic, M, 4, 1);
  Tensor y_ref = Tensor::empty({M, N}, DType::F64);
  ops::algproj_reference_forward(x, w, law, widths, types, y_ref);
  const Tensor xd = to_device(x, DType::BF16), wd = to_device(w, DType::BF16);
  Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
  const int64_t rejected = cuda::AlgProj::rejected_candidates();
  cuda::AlgProj gpu(law, widths);
  gpu.forward(xd, wd, types, y);
  const Tensor yh = to_host_f64(y);
  EXPECT_EQ(cuda::AlgProj::rejected_candidates(), rejected);
  EXPECT_NE(gpu.last_kernel(ops::AlgPass::Forward).kind, AlgKernel::Kind::Products);
  // The other rows are right (the bad row's products are NaN in both).
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      if (i == bad_row) continue;
      const double g = yh.data<double>()[i * N + j], r = y_ref.data<double>()[i * N + j];
      ASSERT_TRUE(std::isfinite(g)) << "row " << i << ", column " << j;
      diff += (g - r) * (g - r);
      ref += r * r;
    }
  EXPECT_LE(std::sqrt(diff / ref), 4 * kBf16Unit);
}

TEST(GpuAlgProj, FusedNeedsEvenWidths) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Odd group widths: calibration only offers the products schedule, and pinning a fused
  // kernel is an error that says so.
  cuda::AlgProj odd(algebra::Law::parse("Q4"), widths_of(kUnequal, 4));
  EXPECT_FALSE(odd.fused_supported());
  EXPECT_TRUE(cuda::AlgProj(algebra::Law::parse("Q4"), widths_of(kUnequalEven, 4)).fused_supported());
  check_case(kUnequal, make_types(Sched::Cyclic, 37, 4, 3), 171);
  odd.set_kernels({fused(0), std::nullopt, std::nullopt});
  const int64_t M = 8;
  Tensor x = Tensor::empty({M, odd.K()}, DType::BF16, Device::CUDA);
  Tensor w = Tensor::empty({odd.K(), odd.N()}, DType::BF16, Device::CUDA);
  Tensor y = Tensor::empty({M, odd.N()}, DType::BF16, Device::CUDA);
  expect_error([&] { odd.forward(x, w, std::vector<int>(M, 0), y); }, "even group offsets");
}

TEST(GpuAlgProj, FewRowKernelsForward) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The few-row (decode) forward kernels, each configuration, including more rows of a type
  // than a tile holds (several tiles per class) and mixed types; dX and dW stay calibrated.
  const Case wide_q2x2{"Q2xQ2", {}, {}, 128, 256}, wide_dense{"dense:4", {}, {}, 64, 128};
  // Each configuration whole and split (these shapes have few column tiles, so the split
  // kernel runs clusters of several blocks per tile).
  int configs = 0;
  for (const AlgKernel& k : cuda::AlgProj::kernel_candidates(ops::AlgPass::Forward))
    configs += k.kind == AlgKernel::Kind::Gemv && !k.split;
  ASSERT_GE(configs, 2);
  for (int c = 0; c < 2 * configs; ++c) {
    SCOPED_TRACE("gemv config " + std::to_string(c / 2) + (c % 2 ? " split" : ""));
    const cuda::AlgProj::Kernels k{AlgKernel{AlgKernel::Kind::Gemv, c / 2, c % 2 == 1}, std::nullopt, std::nullopt};
    for (const Case* cs : {&kWide, &wide_q2x2, &wide_dense}) {
      check_case(*cs, {2}, 201 + c, k);
      check_case(*cs, {3, 1, 3}, 211 + c, k);
      check_case(*cs, make_types(Sched::Cyclic, 37, 4, 3), 221 + c, k);
      check_case(*cs, make_types(Sched::Random, 19, 4, 5), 231 + c, k);
    }
  }
  // Only the forward has it, and only with offsets that are multiples of 8.
  cuda::AlgProj narrow(algebra::Law::parse("Q4"), widths_of(kUnequalEven, 4));
  narrow.set_kernels({AlgKernel{AlgKernel::Kind::Gemv, 0}, std::nullopt, std::nullopt});
  Tensor x = Tensor::empty({1, narrow.K()}, DType::BF16, Device::CUDA);
  Tensor w = Tensor::empty({narrow.K(), narrow.N()}, DType::BF16, Device::CUDA);
  Tensor y = Tensor::empty({1, narrow.N()}, DType::BF16, Device::CUDA);
  EXPECT_THROW(narrow.forward(x, w, {0}, y), Error);
}

TEST(GpuAlgProj, TmaWeightPassEveryConfig) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The Hopper weight pass pinned for dW, each configuration whole and split: cyclic rows
  // (strided chunks), interval rows (runs), partial chunks, Q2⊗Q2's multi-type lists (cut per
  // type), unequal and narrow groups (tiles past a group's end), and a large M whose few tiles
  // every list is split for, a graph law's blocks that no type uses (tiles without chunks), and
  // a few hundred tiles (persistent blocks walk several, two warpgroups taking turns); forward and
  // dX calibrated.
  const Case q4{"Q4", {}, {}, 320, 512}, q2x2{"Q2xQ2", {}, {}, 256, 384},
      unequal{"Q4", {80, 160, 64, 96}, {128, 64, 176, 256}}, narrow{"Q4", {24, 24, 24, 24}, {104, 104, 104, 104}},
      graph{"graph:4:0>1,1>2,2>3", {}, {}, 512, 256};
  for (int c = 0; c < 2 * cuda::detail::kAlgTmaWeightConfigCount; ++c) {
    SCOPED_TRACE("tma weight config " + std::to_string(c / 2) + (c % 2 ? " split" : ""));
    const cuda::AlgProj::Kernels k{std::nullopt, std::nullopt, AlgKernel{AlgKernel::Kind::Tma, c / 2, c % 2 == 1}};
    for (const Case* cs : {&q4, &q2x2, &unequal, &narrow}) {
      check_case(*cs, make_types(Sched::Cyclic, 260, 4, 1), 451 + c, k);
      check_case(*cs, make_types(Sched::Interval, 300, 4, 2), 461 + c, k);
    }
    // 64 rows a type: the graph law's two-type lists, cut per type, fill whole chunks.
    check_case(graph, make_types(Sched::Cyclic, 256, 4, 1), 491 + c, k);
    check_case({"Q2xQ2", {}, {}, 64, 128}, make_types(Sched::Cyclic, 8192, 4, 1), 471 + c, k);
    // 144-288 tiles (more than the blocks of the persistent configurations), forward and dX pinned.
    const AlgKernel tma0{AlgKernel::Kind::Tma, 0};
    check_case({"Q4", {}, {}, 768, 1536}, make_types(Sched::Cyclic, 256, 4, 1), 481 + c, {tma0, tma0, k.dw});
  }
  // Rows it cannot read in chunks: a clear error, not a wrong result.
  cuda::AlgProj gpu(algebra::Law::parse("Q4"), algebra::GroupWidths::equal(4, 320, 512));
  gpu.set_kernels({std::nullopt, std::nullopt, AlgKernel{AlgKernel::Kind::Tma, 0}});
  const int64_t M = 64;
  const Tensor x = Tensor::zeros({M, 320}, DType::BF16, Device::CUDA);
  const Tensor w = Tensor::zeros({320, 512}, DType::BF16, Device::CUDA);
  const Tensor dy = Tensor::zeros({M, 512}, DType::BF16, Device::CUDA);
  Tensor dw = Tensor::empty({320, 512}, DType::F32, Device::CUDA);
  expect_error([&] { gpu.backward(x, w, dy, make_types(Sched::Random, M, 4, 3), nullptr, &dw); },
               "TMA weight pass needs");
}

TEST(GpuAlgProj, ForwardPairAndSwigluEqualSeparateCalls) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Two weight banks of one input (SwiGLU's gate and up) by forward_pair: bit for bit what two
  // forward calls give, whether it is one few-row launch (the whole gemv configurations), or
  // falls back to two calls (split few-row plans, the tile kernels, the products schedule); and
  // forward_swiglu bit for bit what those and swiglu_forward give.
  const Case wide_q2x2{"Q2xQ2", {}, {}, 128, 256};
  std::vector<cuda::AlgProj::Kernels> pins;
  for (const AlgKernel& k : cuda::AlgProj::kernel_candidates(ops::AlgPass::Forward))
    if (k.kind == AlgKernel::Kind::Gemv) pins.push_back({k, std::nullopt, std::nullopt});
  pins.push_back({fused(0), std::nullopt, std::nullopt});
  pins.push_back({kProducts, std::nullopt, std::nullopt});
  pins.push_back({});  // calibrated
  for (const Case* cs : {&kWide, &wide_q2x2}) {
    const algebra::Law law = algebra::Law::parse(cs->law);
    const algebra::GroupWidths widths = widths_of(*cs, law.q());
    for (const std::vector<int>& types : {std::vector<int>{2}, std::vector<int>{3, 1, 3},
                                          make_types(Sched::Cyclic, 37, law.q(), 3)}) {
      const int64_t M = static_cast<int64_t>(types.size()), K = widths.K(), N = widths.N();
      Rng rng(300 + M);
      const Tensor x = to_device(random_bf16_values(rng, {M, K}), DType::BF16);
      const Tensor wa = to_device(random_bf16_values(rng, {K, N}), DType::BF16);
      const Tensor wb = to_device(random_bf16_values(rng, {K, N}), DType::BF16);
      for (size_t i = 0; i < pins.size(); ++i) {
        SCOPED_TRACE("law " + cs->law + ", M " + std::to_string(M) + ", pin " + std::to_string(i));
        cuda::AlgProj gpu(law, widths);
        gpu.set_kernels(pins[i]);
        const auto out = [&] { return Tensor::empty({M, N}, DType::BF16, Device::CUDA); };
        Tensor ya = out(), yb = out(), ra = out(), rb = out(), act = out(), act_ref = out();
        gpu.forward(x, wa, types, ra);
        gpu.forward(x, wb, types, rb);
        cuda::swiglu_forward(ra, rb, act_ref);
        for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the plan
          poison(ya);
          poison(yb);
          gpu.forward_pair(x, wa, wb, types, ya, yb);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_TRUE(same_bits(ya, ra));
          EXPECT_TRUE(same_bits(yb, rb));
          poison(act);
          gpu.forward_swiglu(x, wa, wb, types, ya, yb, act);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_TRUE(same_bits(act, act_ref));
        }
      }
    }
  }
}

TEST(GpuAlgProj, PairStoresWriteEachBoxOnceFromItsBlock) {
  // The pair kernel's walk, on the host (no GPU needed): block b of G takes the tiles from
  // segment b · S / G to (b + 1) · S / G, and each tile stores the 64-column boxes
  // alg_pair_stores names from the staging panels alg_pair_panel names. Every box of every row
  // is stored once, after every one of its columns was laid out by the storing block: a tile that
  // does not start on a 64-column boundary follows its column neighbour in its block, and within
  // a row the panels a tile writes are not those the block's previous tile stores from (those may
  // still be reading; a row's first tile waits for every store).
  struct Shape {
    const char* law;
    int64_t K, N, rows_per_type;
    int tile_rows, groups, box;
  };
  const Shape shapes[] = {
      {"Q256", 5120, 25600, 128, 128, 2, 128},  // Qwen3-32B at M = 32768
      {"Q128", 5120, 25600, 64, 64, 1, 256},    // and at M = 8192
      {"Q16", 320, 1600, 128, 64, 2, 128},      {"graph:4:0>1,2>3", 80, 400, 64, 64, 2, 128},
      {"Q8", 144, 192, 256, 64, 2, 128},        {"Q4", 160, 1600, 64, 64, 1, 256},
  };
  for (const Shape& sh : shapes) {
    const algebra::Law law = algebra::Law::parse(sh.law);
    const int q = law.q();
    const std::vector<int> types = make_types(Sched::Cyclic, sh.rows_per_type * q, q, 0);
    const ops::AlgPairPlan plan = ops::plan_pair_pass(law, algebra::GroupWidths::equal(q, sh.K, sh.N), types,
                                                      sh.tile_rows, sh.groups, sh.box);
    ASSERT_FALSE(plan.tiles.empty()) << sh.law << ": " << plan.why_not;
    ASSERT_LE(plan.tile_cols, cuda::detail::kAlgPairMaxTileCols) << sh.law;
    const int n = static_cast<int>(sh.N), num_segments = static_cast<int>(plan.segments.size()) - 1;
    const int boxes_per_row = (n + 63) / 64;
    for (int blocks : {1, 7, 132, num_segments}) {
      SCOPED_TRACE(fmt::format("{}, {} blocks", sh.law, blocks));
      std::vector<int> stored(static_cast<size_t>(types.size() / sh.tile_rows) * boxes_per_row, 0);
      for (int b = 0; b < blocks; ++b) {
        const int first = cuda::detail::alg_pair_first_tile(plan.segments.data(), num_segments, b, blocks);
        const int last = cuda::detail::alg_pair_first_tile(plan.segments.data(), num_segments, b + 1, blocks);
        for (int i = first; i < last; ++i) {
          const ops::AlgPairTile& t = plan.tiles[i];
          const cuda::detail::AlgPairStores out = cuda::detail::alg_pair_stores(t.col0, plan.tile_cols, n);
          ASSERT_EQ(out.begin % 64, 0);
          ASSERT_TRUE(out.end % 64 == 0 || out.end == n);
          if (t.col0 % 64 != 0) {  // its first box's first columns are the block's previous tile's
            ASSERT_GT(i, first);
            ASSERT_EQ(plan.tiles[i - 1].row0, t.row0);
            ASSERT_EQ(plan.tiles[i - 1].col0 + plan.tile_cols, t.col0);
          }
          if (i > first && t.col0 != 0) {  // the previous tile's stores may still read their panels
            const cuda::detail::AlgPairStores before =
                cuda::detail::alg_pair_stores(plan.tiles[i - 1].col0, plan.tile_cols, n);
            for (int c = t.col0; c < t.col0 + plan.tile_cols; c += 8)
              for (int d = before.begin; d < before.end; d += 64)
                ASSERT_NE(cuda::detail::alg_pair_panel(c), cuda::detail::alg_pair_panel(d)) << "tile " << i;
          }
          // The tile's stores: every column of each box is this tile's or an earlier one's of this row.
          ASSERT_LE(out.end, t.col0 + plan.tile_cols);
          for (int c = out.begin; c < out.end; c += 64) {
            const int64_t run = (t.row0 % plan.stride) + plan.stride * (t.row0 / plan.stride / sh.tile_rows);
            ++stored[static_cast<size_t>(run) * boxes_per_row + c / 64];
          }
        }
      }
      for (size_t i = 0; i < stored.size(); ++i) ASSERT_EQ(stored[i], 1) << "row run " << i / boxes_per_row
                                                                         << ", box " << i % boxes_per_row;
    }
  }
}

TEST(GpuAlgProj, TmaChunkWalkCoversEverySegment) {
  // The row pass's producer and consumers walk a segment by tma_chunk_len: the chunks cover it
  // exactly, each 64 deep but the last, which may be shorter, or 64 plus at most `extra` whole
  // 16-deep slices; extra slices never take more stages.
  constexpr int kChunk = cuda::detail::kAlgTmaChunk;
  for (int extra = 0; extra <= 3; ++extra)
    for (int len = 1; len <= 1200; ++len) {
      SCOPED_TRACE("extra " + std::to_string(extra) + ", segment " + std::to_string(len));
      int k = 0, n = 0;
      while (k < len) {
        const int c = cuda::detail::tma_chunk_len(len - k, extra);
        ASSERT_GT(c, 0);
        ASSERT_LE(c, len - k);
        if (c != kChunk) {
          EXPECT_EQ(c, len - k) << "only a segment's last chunk is not 64 deep";
          if (c > kChunk) {
            EXPECT_EQ((c - kChunk) % 16, 0);
            EXPECT_LE(c, kChunk + 16 * extra);
          }
        }
        k += c;
        ++n;
      }
      EXPECT_EQ(k, len);
      EXPECT_EQ(n, cuda::detail::tma_chunks(len, extra));
      EXPECT_EQ(n, cuda::detail::tma_chunks(len, 0) - (len > kChunk && len % kChunk != 0 &&
                                                         len % kChunk <= 16 * extra && len % 16 == 0));
    }
  // Qwen3-4B's groups of 80 in one stage; 32B's of 160 keep their three.
  EXPECT_EQ(cuda::detail::tma_chunks(80, 1), 1);
  EXPECT_EQ(cuda::detail::tma_chunks(160, 1), 3);
}

// Every configuration on segments whose tail's last slice runs past the segment by 8 in each of
// the four slices (tails of 8, 24, 40 and 56: groups of 72, 88, 104 and 120). A tail of four
// slices (49-63 of k) was once read as a whole chunk's layout; dW is pinned (not calibrated).
TEST(GpuAlgProj, TmaTailsPastTheSegment) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  for (int c = 0; c < cuda::detail::kAlgTmaConfigCount; ++c) {
    if (cuda::detail::kAlgTmaConfigs[c].two_groups) continue;  // Q_q forwards only: TmaTwoGroupForward
    SCOPED_TRACE("tma config " + std::to_string(c));
    const AlgKernel tma{AlgKernel::Kind::Tma, c};
    const cuda::AlgProj::Kernels k{tma, tma, AlgKernel{AlgKernel::Kind::Fused, 0}};
    for (const int64_t w : {72, 88, 104, 120}) {
      const Case cs{"Q4", {w, w, w, w}, {w + 64, w + 64, w + 64, w + 64}};
      check_case(cs, make_types(Sched::Cyclic, 256, 4, 1), 471 + c, k);
    }
  }
}

TEST(GpuAlgProj, TmaTwoGroupForward) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The two-group configurations pinned for the forward (dX and dW by the products schedule):
  // Qwen3-30B-A3B's expert (Q_16, blocks of 128, groups of 48, 128 rows a type), groups narrower
  // than the tile's half, partial tiles (65 rows a type: the second warpgroup's one row, clipped by
  // the map at the view's end), contiguous rows (75 a type: a second warpgroup's 11 rows stored
  // from registers), several tiles a type, one decode row; a shape without a plan and the dX pass
  // refused. check_case's accumulating call stores every tile from registers.
  for (int c = 0; c < cuda::detail::kAlgTmaConfigCount; ++c) {
    if (!cuda::detail::kAlgTmaConfigs[c].two_groups) continue;
    SCOPED_TRACE("tma config " + std::to_string(c));
    const AlgKernel tma{AlgKernel::Kind::Tma, c};
    const cuda::AlgProj::Kernels k{tma, kProducts, kProducts};
    check_case({"Q16", {}, {}, 2048, 768}, make_types(Sched::Cyclic, 2048, 16, 1), 501 + c, k);
    check_case({"Q4", {}, {}, 256, 64}, make_types(Sched::Cyclic, 260, 4, 1), 511 + c, k);
    check_case({"Q4", {}, {}, 512, 192}, make_types(Sched::Interval, 300, 4, 2), 521 + c, k);
    check_case({"Q8", {}, {}, 512, 384}, make_types(Sched::Cyclic, 1096, 8, 1), 531 + c, k);
    check_case({"Q4", {}, {}, 256, 128}, {2}, 541 + c, k);
    // Where it has no plan (groups of 100 > 48, or the dX pass), a pinned two-group configuration
    // says so.
    cuda::AlgProj wide(algebra::Law::parse("Q4"), algebra::GroupWidths::equal(4, 256, 400));
    wide.set_kernels({tma, std::nullopt, std::nullopt});
    const Tensor x = Tensor::zeros({64, 256}, DType::BF16, Device::CUDA);
    const Tensor w = Tensor::zeros({256, 400}, DType::BF16, Device::CUDA);
    Tensor y = Tensor::empty({64, 400}, DType::BF16, Device::CUDA);
    expect_error([&] { wide.forward(x, w, make_types(Sched::Cyclic, 64, 4, 1), y); }, "store box");
    cuda::AlgProj dx_pinned(algebra::Law::parse("Q4"), algebra::GroupWidths::equal(4, 256, 128));
    dx_pinned.set_kernels({std::nullopt, tma, std::nullopt});
    const Tensor x2 = Tensor::zeros({64, 256}, DType::BF16, Device::CUDA);
    const Tensor w2 = Tensor::zeros({256, 128}, DType::BF16, Device::CUDA);
    const Tensor dy2 = Tensor::zeros({64, 128}, DType::BF16, Device::CUDA);
    Tensor dx2 = Tensor::empty({64, 256}, DType::BF16, Device::CUDA);
    expect_error([&] { dx_pinned.backward(x2, w2, dy2, make_types(Sched::Cyclic, 64, 4, 1), &dx2, nullptr); },
                 "dX pass");
  }
}

TEST(GpuAlgProj, TmaClusterSplitDx) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The dX split configurations pinned (forward and dW by the products schedule): Q_q's own
  // blocks reduced by clusters, the rest by the row pass. Partial tiles (65 and 75 rows a type:
  // tiles of one and of eleven rows), strided and contiguous rows, one decode row, own blocks of
  // 32, 64, 80, 96, 128, 160 and 448 columns (cluster kernels of every width, merged tiles and
  // tiles narrower than the kernel), 2 to 8 blocks a tile, and several chunks or none a block
  // (Q_16's 32 chunks in 8 pieces, Q_4's 8 in 2). Each case's plan is checked to split: the
  // planner's own rule, as AlgProj calls it.
  struct SplitCase {
    Case c;
    std::vector<int> types;
  };
  const SplitCase cases[] = {
      {{"Q4", {}, {}, 320, 512}, make_types(Sched::Cyclic, 260, 4, 1)},
      {{"Q4", {}, {}, 320, 512}, make_types(Sched::Interval, 300, 4, 2)},
      {{"Q4", {}, {}, 384, 512}, {2}},
      {{"Q4", {}, {}, 512, 512}, make_types(Sched::Cyclic, 260, 4, 1)},
      {{"Q16", {}, {}, 512, 2048}, make_types(Sched::Cyclic, 2048, 16, 1)},
      {{"Q32", {}, {}, 2048, 6144}, make_types(Sched::Cyclic, 512, 32, 1)},
      // Blocks of 160 (one merged tile of 160 columns: BN 160) and of 448 (merged up to 192).
      {{"Q8", {}, {}, 1280, 1024}, make_types(Sched::Cyclic, 520, 8, 1)},
      {{"Q4", {}, {}, 1792, 512}, make_types(Sched::Interval, 300, 4, 2)},
  };
  // Every split configuration on each case's inputs, so that its float64 references are computed once.
  std::vector<cuda::AlgProj::Kernels> every;
  for (int c = 0; c < cuda::detail::kAlgTmaConfigCount; ++c)
    if (cuda::detail::tma_cluster_splits(cuda::detail::kAlgTmaConfigs[c]))
      every.push_back({kProducts, AlgKernel{AlgKernel::Kind::Tma, c, true}, kProducts});
  ASSERT_FALSE(every.empty());
  for (const SplitCase& sc : cases) {
    const algebra::Law law = algebra::Law::parse(sc.c.law);
    for (const cuda::AlgProj::Kernels& k : every) {
      const cuda::detail::AlgTmaConfig& cfg = cuda::detail::kAlgTmaConfigs[k.dx->config];
      const ops::AlgClusterPlan cp = ops::plan_cluster_split(
          ops::plan_row_pass(law, widths_of(sc.c, law.q()), sc.types, ops::AlgPass::DX, cfg.tile_rows(),
                             cfg.tile_cols(), false),
          cuda::detail::kAlgTmaChunk, cuda::detail::kAlgTmaRows, cuda::detail::kAlgTmaClusterMaxCols,
          cuda::detail::kAlgTmaClusterMaxParts);
      ASSERT_GT(cp.parts, 1) << sc.c.law << ", tma config " << k.dx->config;
    }
    check_case(sc.c, sc.types, 561, every);
  }
  // Nothing to split (own reductions of 624, not whole chunks): the row pass alone.
  check_case({"Q4", {80, 160, 64, 96}, {128, 64, 176, 256}}, make_types(Sched::Cyclic, 260, 4, 1), 571, every);
  // A split configuration pinned for the forward, or a configuration without a cluster kernel: a
  // clear error.
  for (int c = 0; c < cuda::detail::kAlgTmaConfigCount; ++c) {
    const bool splits = cuda::detail::tma_cluster_splits(cuda::detail::kAlgTmaConfigs[c]);
    if (cuda::detail::kAlgTmaConfigs[c].two_groups) continue;
    const AlgKernel split{AlgKernel::Kind::Tma, c, true};
    cuda::AlgProj gpu(algebra::Law::parse("Q4"), algebra::GroupWidths::equal(4, 320, 512));
    const Tensor x = Tensor::zeros({64, 320}, DType::BF16, Device::CUDA);
    const Tensor w = Tensor::zeros({320, 512}, DType::BF16, Device::CUDA);
    const Tensor dy = Tensor::zeros({64, 512}, DType::BF16, Device::CUDA);
    Tensor y = Tensor::empty({64, 512}, DType::BF16, Device::CUDA);
    Tensor dx = Tensor::empty({64, 320}, DType::BF16, Device::CUDA);
    SCOPED_TRACE("tma config " + std::to_string(c));
    expect_error(
        [&] {
          if (splits) {
            gpu.set_kernels({split, std::nullopt, std::nullopt});
            gpu.forward(x, w, make_types(Sched::Cyclic, 64, 4, 1), y);
          } else {
            gpu.set_kernels({std::nullopt, split, std::nullopt});
            gpu.backward(x, w, dy, make_types(Sched::Cyclic, 64, 4, 1), &dx, nullptr);
          }
        },
        "splits the dX pass only");
  }
}

TEST(GpuAlgProj, TmaWeightDiagonalGemm) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // Every TMA weight configuration with the diagonal blocks by one batched GEMM (forward and dX by
  // the products schedule), assigned and (check_case's second backward) accumulated: Q_q, a tensor
  // and a graph law, strided and contiguous rows, partial tiles, one decode row.
  std::vector<cuda::AlgProj::Kernels> every;
  for (int c = 0; c < cuda::detail::kAlgTmaWeightConfigCount; ++c)
    every.push_back({kProducts, kProducts, AlgKernel{AlgKernel::Kind::Tma, c, false, true}});
  check_case({"Q4", {}, {}, 320, 512}, make_types(Sched::Cyclic, 260, 4, 1), 581, every);
  check_case({"Q2xQ2", {}, {}, 256, 384}, make_types(Sched::Interval, 300, 4, 2), 582, every);
  check_case({"graph:4:0>1,1>2,2>3", {}, {}, 512, 256}, make_types(Sched::Cyclic, 256, 4, 1), 583, every);
  check_case({"Q16", {}, {}, 512, 2048}, make_types(Sched::Cyclic, 2048, 16, 1), 584, every);
  check_case({"Q4", {}, {}, 320, 512}, {2}, 585, every);
  // Unequal groups (no batched GEMM), or the forward: a clear error.
  const AlgKernel diag{AlgKernel::Kind::Tma, 0, false, true};
  cuda::AlgProj unequal(algebra::Law::parse("Q4"), algebra::GroupWidths{{64, 128, 64, 64}, {64, 64, 64, 64}});
  unequal.set_kernels({std::nullopt, kProducts, diag});
  const Tensor x = Tensor::zeros({64, 320}, DType::BF16, Device::CUDA);
  const Tensor w = Tensor::zeros({320, 256}, DType::BF16, Device::CUDA);
  const Tensor dy = Tensor::zeros({64, 256}, DType::BF16, Device::CUDA);
  Tensor dw = Tensor::empty({320, 256}, DType::F32, Device::CUDA);
  expect_error([&] { unequal.backward(x, w, dy, make_types(Sched::Cyclic, 64, 4, 1), nullptr, &dw); },
               "one width");
  cuda::AlgProj fwd(algebra::Law::parse("Q4"), algebra::GroupWidths::equal(4, 320, 256));
  fwd.set_kernels({diag, std::nullopt, std::nullopt});
  Tensor y = Tensor::empty({64, 256}, DType::BF16, Device::CUDA);
  expect_error([&] { fwd.forward(x, w, make_types(Sched::Cyclic, 64, 4, 1), y); },
               "belongs to the TMA weight pass");
}

TEST(GpuAlgProj, TmaRowPassEveryConfig) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  register_gpu();
  // The Hopper row pass pinned for the forward and dX, each configuration (one block per tile,
  // persistent, one or two warpgroups): strided (cyclic) and contiguous (interval) rows with
  // partial tiles, one decode row, group widths whose last chunk is a tail of 16, 32 or 48
  // (80, 96, 160, 176: whole 16-deep slices) and 24 and 104 (tails of 24 and 40: a slice past the
  // segment's end), several output tiles per group; dW calibrated.
  const Case q4{"Q4", {}, {}, 320, 512}, q2x2{"Q2xQ2", {}, {}, 256, 384}, dense{"dense:4", {}, {}, 256, 320},
      graph{"graph:4:0>1,1>2,2>3", {}, {}, 512, 256}, unequal{"Q4", {80, 160, 64, 96}, {128, 64, 176, 256}},
      narrow{"Q4", {24, 24, 24, 24}, {104, 104, 104, 104}};  // segments of 24, tiles from column 104
  for (int c = 0; c < cuda::detail::kAlgTmaConfigCount; ++c) {
    if (cuda::detail::kAlgTmaConfigs[c].two_groups) continue;  // Q_q forwards only: TmaTwoGroupForward
    SCOPED_TRACE("tma config " + std::to_string(c));
    const AlgKernel tma{AlgKernel::Kind::Tma, c};
    const cuda::AlgProj::Kernels k{tma, tma, std::nullopt};
    for (const Case* cs : {&q4, &q2x2, &dense, &graph, &unequal, &narrow}) {
      check_case(*cs, make_types(Sched::Cyclic, 260, 4, 1), 401 + c, k);
      check_case(*cs, make_types(Sched::Interval, 300, 4, 2), 411 + c, k);
      check_case(*cs, {2}, 421 + c, k);
    }
    // Hundreds of tiles: the persistent configurations' blocks walk several, their warpgroups
    // taking turns.
    // Narrow groups (16 and 64 columns) keep the float64 references quick.
    check_case({"Q4", {}, {}, 64, 256}, make_types(Sched::Cyclic, 4096, 4, 1), 431 + c, k);
    check_case({"Q2xQ2", {}, {}, 64, 192}, make_types(Sched::Interval, 3000, 4, 2), 441 + c, k);
  }
  // Output groups of 800 (tiles of 384, 384 and 32 for the widest configuration, whose second
  // warpgroup then stores too) over input groups of 80 (a tail of one slice and zero steps):
  // every configuration on one input, so that its float64 references are computed once.
  std::vector<cuda::AlgProj::Kernels> every;
  for (int c = 0; c < cuda::detail::kAlgTmaConfigCount; ++c) {
    if (cuda::detail::kAlgTmaConfigs[c].two_groups) continue;
    const AlgKernel tma{AlgKernel::Kind::Tma, c};
    every.push_back({tma, tma, std::nullopt});
  }
  check_case({"Q4", {}, {}, 320, 3200}, make_types(Sched::Cyclic, 512, 4, 1), 451, every);
  // Rows it cannot read as boxes: a clear error, not a wrong result.
  cuda::AlgProj gpu(algebra::Law::parse("Q4"), algebra::GroupWidths::equal(4, 320, 512));
  gpu.set_kernels({AlgKernel{AlgKernel::Kind::Tma, 0}, std::nullopt, std::nullopt});
  const int64_t M = 37;
  const Tensor x = Tensor::empty({M, 320}, DType::BF16, Device::CUDA);
  const Tensor w = Tensor::empty({320, 512}, DType::BF16, Device::CUDA);
  Tensor y = Tensor::empty({M, 512}, DType::BF16, Device::CUDA);
  expect_error([&] { gpu.forward(x, w, make_types(Sched::Random, M, 4, 3), y); }, "TMA kernel needs");
  // Groups of 20 columns: boxes that would start off a 16-byte boundary (the hardware faults),
  // refused when pinned and left out of calibration.
  const algebra::Law q4_law = algebra::Law::parse("Q4");
  cuda::AlgProj off(q4_law, algebra::GroupWidths::equal(4, 80, 400));
  off.set_kernels({AlgKernel{AlgKernel::Kind::Tma, 0}, std::nullopt, std::nullopt});
  const Tensor xo = Tensor::zeros({64, 80}, DType::BF16, Device::CUDA);
  const Tensor wo = Tensor::zeros({80, 400}, DType::BF16, Device::CUDA);
  Tensor yo = Tensor::empty({64, 400}, DType::BF16, Device::CUDA);
  expect_error([&] { off.forward(xo, wo, make_types(Sched::Cyclic, 64, 4, 1), yo); }, "multiples of 8");
  check_case({"Q4", {20, 20, 20, 20}, {100, 100, 100, 100}}, make_types(Sched::Cyclic, 260, 4, 1), 499);
}
