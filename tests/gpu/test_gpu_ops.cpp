// GPU tests of the element-wise and row-wise ops (src/cuda/ops.h) against the CPU references
// (src/ops/*.h, src/train/optimizer.h) run in F64 on the same bf16-rounded inputs.
//
// Tolerances. bf16 keeps 8 significant bits: unit roundoff u = 2^-8 ≈ 3.9e-3. A bf16 output
// that is the exact result rounded once is within u of it elementwise, so within u in
// relative norm; the kernels compute in fp32 (relative error ~1e-6, far below u) and round
// once, so they must land within kBf16Tol = 2u (the "at most twice a naive bf16 result" rule
// of DESIGN.md). fp32 outputs (statistics, parameter gradients, losses) carry only fp32
// summation error, ~ (terms) · 2^-24 in the worst case and far less in norm: kF32Tol = 1e-4,
// still orders of magnitude below what a wrong formula gives (errors of O(1)). Optimizer
// results are compared at 1e-6 (the kernels use the CPU's fp64 expressions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <vector>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/ops.h"
#include "gpu/gpu_testing.h"
#include "ops/activation.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"
#include "train/distributed.h"
#include "train/optimizer.h"

using namespace quiver;
using namespace quiver::gpu_testing;

namespace {

constexpr double kBf16Tol = 2.0 / 256.0;
constexpr double kF32Tol = 1e-4;
constexpr double kAdamTol = 1e-6;

// Random bf16 values (host); .to(F64) of the result is exact, so the reference sees the
// same inputs as the kernel.
Tensor random_f32(const Shape& shape, Rng& rng, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  rng.fill_uniform(t, lo, hi);
  return t;
}

Tensor f64(const Tensor& t) { return t.to(DType::F64); }

// int32 ids in device memory (held by an F32 tensor of the same byte size).
struct DeviceIds {
  Tensor storage;
  explicit DeviceIds(const std::vector<int32_t>& ids) {
    storage = Tensor::empty({static_cast<int64_t>(std::max<size_t>(1, ids.size()))}, DType::F32,
                            Device::CUDA);
    if (!ids.empty())
      QV_CUDA_CHECK(cudaMemcpy(storage.raw(), ids.data(), ids.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
  }
  const int32_t* data() const { return static_cast<const int32_t*>(storage.raw()); }
};

bool all_finite(const Tensor& host) {
  Tensor d = host.to(DType::F64);
  const double* p = d.data<double>();
  for (int64_t i = 0; i < d.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

}  // namespace

TEST(GpuOps, ConvertRoundsLikeTheHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(11);
  const int64_t n = 70001;  // several grid-stride blocks, not a multiple of the block size
  Tensor src = random_f32({n}, rng, -3e4, 3e4);
  float* p = src.data<float>();
  // Ties (low half exactly 0x8000, even and odd upper halves), NaN, ±inf, ±0, subnormals,
  // a value that rounds up to inf.
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7fc00001u, 0xff800001u,
                               0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u,
                               0x807fffffu, 0x7f7fffffu, 0x3f80ffffu, 0x3f807fffu};
  for (size_t k = 0; k < std::size(specials); ++k) std::memcpy(&p[k * 97], &specials[k], 4);
  Tensor dev_src = to_device(src);
  Tensor dev_bf16 = poisoned({n}, DType::BF16);
  cuda::convert(dev_src, dev_bf16);
  Tensor got = to_host(dev_bf16);
  const bf16* g = got.data<bf16>();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(g[i].bits, float_to_bf16(p[i]).bits) << "element " << i;

  Tensor dev_f32 = poisoned({n}, DType::F32);
  cuda::convert(dev_bf16, dev_f32);
  Tensor back = to_host(dev_f32);
  for (int64_t i = 0; i < n; ++i) {
    const float want = bf16_to_float(g[i]);
    ASSERT_EQ(std::memcmp(&back.data<float>()[i], &want, 4), 0) << "element " << i;
  }
  EXPECT_THROW(cuda::convert(dev_src, dev_f32), Error);
}

TEST(GpuOps, EmbeddingForwardAndAccumulatingBackward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(12);
  const int64_t vocab = 53, width = 37, n = 301;  // tokens repeat, so the atomics collide
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(vocab));
  tokens[0] = 0;
  tokens[1] = vocab - 1;
  DeviceIds dev_tokens(tokens);
  Tensor table = random_f32({vocab, width}, rng);

  Tensor out = poisoned({7, 43, width}, DType::BF16);
  cuda::embedding_forward(dev_tokens.data(), n, to_device(table), out);
  Tensor ref = Tensor::empty({n, width}, DType::F64);
  ops::embedding_forward(tokens.data(), n, f64(table), ref);
  // Forward is a copy rounded once to bf16: within u elementwise.
  Tensor got = to_host(out);
  EXPECT_TRUE(all_finite(got));
  EXPECT_LT(rel_error(f64(got).reshape({n, width}), ref), 1.0 / 256.0);

  Tensor dout = random_bf16({n, width}, rng);
  Tensor dtable0 = random_f32({vocab, width}, rng);
  Tensor dtable = to_device(dtable0);
  Tensor dev_dout = to_device(dout);
  cuda::embedding_backward_accumulate(dev_tokens.data(), n, dev_dout, dtable);
  cuda::embedding_backward_accumulate(dev_tokens.data(), n, dev_dout, dtable);
  Tensor want = f64(dtable0);
  ops::embedding_backward_accumulate(tokens.data(), n, f64(dout), want);
  ops::embedding_backward_accumulate(tokens.data(), n, f64(dout), want);
  // fp32 sums of about a dozen terms (2 · 301/53 plus the start value) in a varying order:
  // at most ~13 · 2^-24 ≈ 8e-7 of the summands' size per element; 1e-5 leaves room.
  EXPECT_LT(rel_error(f64(to_host(dtable)), want), 1e-5);
}

namespace {

// LayerNorm (with_bias) or RMSNorm at one shape and parameter dtype, forward and backward
// (backward twice, to check that dweight/dbias accumulate and dx is assigned; then once adding
// into dx).
void check_norm(bool layer, const Shape& shape, DType param_dtype, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << (layer ? "layernorm " : "rmsnorm ") << shape_str(shape)
                                  << " params " << dtype_name(param_dtype));
  Rng rng(seed);
  const int64_t width = shape.back();
  const int64_t rows = shape_numel(shape) / width;
  const double eps = 1e-5;
  Tensor x = random_bf16(shape, rng, -1.5, 2.5);  // nonzero mean exercises the centering
  Tensor weight = random_f32({width}, rng, 0.5, 1.5);
  Tensor bias = random_f32({width}, rng, -0.5, 0.5);
  if (param_dtype == DType::BF16) {
    weight = weight.to(DType::BF16);
    bias = bias.to(DType::BF16);
  }
  Tensor dy = random_bf16(shape, rng);

  Tensor ref_y = Tensor::empty(shape, DType::F64), ref_mean = Tensor::empty({rows}, DType::F64),
         ref_rstd = Tensor::empty({rows}, DType::F64);
  Tensor dev_x = to_device(x), dev_w = to_device(weight), dev_b = to_device(bias);
  Tensor y = poisoned(shape, DType::BF16), mean = poisoned({rows}, DType::F32),
         rstd = poisoned({rows}, DType::F32);
  if (layer) {
    ops::layernorm_forward(f64(x), f64(weight), f64(bias), eps, ref_y, ref_mean, ref_rstd);
    cuda::layernorm_forward(dev_x, dev_w, dev_b, eps, y, mean, rstd);
    EXPECT_LT(rel_error(f64(to_host(mean)), ref_mean), kF32Tol);
  } else {
    ops::rmsnorm_forward(f64(x), f64(weight), eps, ref_y, ref_rstd);
    cuda::rmsnorm_forward(dev_x, dev_w, eps, y, rstd);
  }
  Tensor got_y = to_host(y);
  EXPECT_TRUE(all_finite(got_y));
  EXPECT_LT(rel_error(f64(got_y), ref_y), kBf16Tol);
  EXPECT_LT(rel_error(f64(to_host(rstd)), ref_rstd), kF32Tol);

  Tensor ref_dx = Tensor::empty(shape, DType::F64);
  Tensor dw0 = random_f32({width}, rng), db0 = random_f32({width}, rng);
  Tensor ref_dw = f64(dw0), ref_db = f64(db0);
  Tensor dev_dy = to_device(dy), dx = poisoned(shape, DType::BF16);
  Tensor dw = to_device(dw0), db = to_device(db0);
  for (int call = 0; call < 2; ++call) {
    if (layer) {
      ops::layernorm_backward(f64(dy), f64(x), f64(weight), ref_mean, ref_rstd, ref_dx, ref_dw,
                              ref_db);
      cuda::layernorm_backward(dev_dy, dev_x, dev_w, mean, rstd, dx, dw, db);
    } else {
      ops::rmsnorm_backward(f64(dy), f64(x), f64(weight), ref_rstd, ref_dx, ref_dw);
      cuda::rmsnorm_backward(dev_dy, dev_x, dev_w, rstd, dx, dw);
    }
  }
  Tensor got_dx = to_host(dx);
  EXPECT_TRUE(all_finite(got_dx));
  EXPECT_LT(rel_error(f64(got_dx), ref_dx), kBf16Tol);
  EXPECT_LT(rel_error(f64(to_host(dw)), ref_dw), kF32Tol);
  if (layer) EXPECT_LT(rel_error(f64(to_host(db)), ref_db), kF32Tol);

  // accumulate_dx: dx (a residual gradient) += the norm's gradient, rounded once.
  Tensor dx0 = random_bf16(shape, rng);
  Tensor dev_acc = to_device(dx0);
  if (layer)
    cuda::layernorm_backward(dev_dy, dev_x, dev_w, mean, rstd, dev_acc, dw, db, nullptr, true);
  else
    cuda::rmsnorm_backward(dev_dy, dev_x, dev_w, rstd, dev_acc, dw, nullptr, true);
  Tensor ref_acc = f64(dx0);
  const double* r = ref_dx.data<double>();
  double* o = ref_acc.data<double>();
  for (int64_t i = 0; i < ref_acc.numel(); ++i) o[i] += r[i];
  EXPECT_LT(rel_error(f64(to_host(dev_acc)), ref_acc), kBf16Tol);
}

}  // namespace

TEST(GpuOps, LayerNormForwardBackward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Width below one block, width over several block strides, rows over the 32 row lanes.
  for (DType dt : {DType::F32, DType::BF16}) {
    check_norm(true, {3, 7, 37}, dt, 21);
    check_norm(true, {70, 1000}, dt, 22);
  }
  // Rows over several 512-row splits of the parameter sums (an uneven last split).
  check_norm(true, {2, 1500, 96}, DType::F32, 25);
}

TEST(GpuOps, RmsNormForwardBackward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::F32, DType::BF16}) {
    check_norm(false, {3, 7, 37}, dt, 23);
    check_norm(false, {70, 1000}, dt, 24);
  }
  check_norm(false, {2, 1500, 96}, DType::F32, 26);
}

TEST(GpuOps, RopeForwardBackwardAndInPlace) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(31);
  struct Case {
    Shape shape;
    int64_t pos0;
    double base;
  };
  for (const Case& c : {Case{{2, 5, 3, 10}, 7, ops::kRopeBase}, Case{{9, 2, 64}, 100000, 5e5}}) {
    SCOPED_TRACE(shape_str(c.shape));
    Tensor x = random_bf16(c.shape, rng);
    Tensor ref = Tensor::empty(c.shape, DType::F64), ref_back = Tensor::empty(c.shape, DType::F64);
    ops::rope_forward(f64(x), ref, c.pos0, c.base);
    ops::rope_backward(f64(x), ref_back, c.pos0, c.base);
    Tensor dev_x = to_device(x);
    Tensor y = poisoned(c.shape, DType::BF16), dx = poisoned(c.shape, DType::BF16);
    cuda::rope_forward(dev_x, y, c.pos0, c.base);
    cuda::rope_backward(dev_x, dx, c.pos0, c.base);
    Tensor got = to_host(y), got_back = to_host(dx);
    EXPECT_TRUE(all_finite(got) && all_finite(got_back));
    EXPECT_LT(rel_error(f64(got), ref), kBf16Tol);
    EXPECT_LT(rel_error(f64(got_back), ref_back), kBf16Tol);
    // In place gives the same bits as out of place.
    cuda::rope_forward(dev_x, dev_x, c.pos0, c.base);
    EXPECT_EQ(rel_error(to_host(dev_x).to(DType::F64), f64(got)), 0.0);
  }
}

TEST(GpuOps, SwigluAndGeluForwardBackward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(41);
  const Shape shape{7, 143};  // 1001 elements
  // Wide range: saturated sigmoid / GELU tails (where the backward guards 0 · ∞) included.
  Tensor gate = random_bf16(shape, rng, -12.0, 12.0), up = random_bf16(shape, rng);
  Tensor dout = random_bf16(shape, rng);
  Tensor dev_gate = to_device(gate), dev_up = to_device(up), dev_dout = to_device(dout);

  Tensor ref = Tensor::empty(shape, DType::F64), ref_dg = Tensor::empty(shape, DType::F64),
         ref_du = Tensor::empty(shape, DType::F64);
  ops::swiglu_forward(f64(gate), f64(up), ref);
  ops::swiglu_backward(f64(dout), f64(gate), f64(up), ref_dg, ref_du);
  Tensor out = poisoned(shape, DType::BF16), dg = poisoned(shape, DType::BF16),
         du = poisoned(shape, DType::BF16);
  cuda::swiglu_forward(dev_gate, dev_up, out);
  cuda::swiglu_backward(dev_dout, dev_gate, dev_up, dg, du);
  EXPECT_LT(rel_error(f64(to_host(out)), ref), kBf16Tol);
  EXPECT_LT(rel_error(f64(to_host(dg)), ref_dg), kBf16Tol);
  EXPECT_LT(rel_error(f64(to_host(du)), ref_du), kBf16Tol);

  Tensor gy = Tensor::empty(shape, DType::F64), gdx = Tensor::empty(shape, DType::F64);
  ops::gelu_forward(f64(gate), gy);
  ops::gelu_backward(f64(dout), f64(gate), gdx);
  Tensor y = poisoned(shape, DType::BF16), dx = poisoned(shape, DType::BF16);
  cuda::gelu_forward(dev_gate, y);
  cuda::gelu_backward(dev_dout, dev_gate, dx);
  Tensor got_y = to_host(y), got_dx = to_host(dx);
  EXPECT_TRUE(all_finite(got_y) && all_finite(got_dx));
  EXPECT_LT(rel_error(f64(got_y), gy), kBf16Tol);
  EXPECT_LT(rel_error(f64(got_dx), gdx), kBf16Tol);
}

namespace {

// Cross-entropy at one vocabulary size; per-row reference losses come from one-row calls.
void check_cross_entropy(int64_t rows, int64_t vocab, std::vector<int32_t> targets, float scale,
                         uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " vocab " << vocab);
  Rng rng(seed);
  Tensor logits = random_bf16({rows, vocab}, rng, -8.0, 8.0);
  if (rows > 1) {  // one row far from zero: the max shift must keep it finite
    Tensor big = random_bf16({vocab}, rng, 60.0, 80.0);
    std::memcpy(logits.data<bf16>() + vocab, big.data<bf16>(), vocab * sizeof(bf16));
  }
  Tensor ref_grad = Tensor::empty({rows, vocab}, DType::F64);
  const double ref_loss =
      ops::cross_entropy_forward_backward(f64(logits), targets.data(), scale, &ref_grad);
  Tensor ref_rows = Tensor::zeros({rows}, DType::F64);
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] >= 0)
      ref_rows.data<double>()[r] = ops::cross_entropy_forward_backward(
          f64(logits).slice(0, r, r + 1).clone(), &targets[r], 1.0f, nullptr);

  DeviceIds dev_targets(targets);
  Tensor dev_logits = to_device(logits);
  Tensor row_loss = poisoned({rows}, DType::F32), loss = poisoned({1}, DType::F32);
  Tensor dlogits = poisoned({rows, vocab}, DType::BF16);
  cuda::cross_entropy(dev_logits, dev_targets.data(), scale, row_loss, loss, &dlogits);
  Tensor got_loss = to_host(loss);
  Tensor got_grad = to_host(dlogits);
  EXPECT_TRUE(all_finite(got_grad));
  // fp32 log-sum-exp: relative error ~1e-6 of the loss.
  EXPECT_NEAR(got_loss.data<float>()[0], ref_loss, 1e-5 * std::max(1.0, std::abs(ref_loss)));
  EXPECT_LT(rel_error(f64(to_host(row_loss)), ref_rows), 1e-5);
  EXPECT_LT(rel_error(f64(got_grad), ref_grad), kBf16Tol);
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0)
      for (int64_t j = 0; j < vocab; ++j)
        ASSERT_EQ(got_grad.data<bf16>()[r * vocab + j].bits, 0) << "ignored row " << r;

  // Without dlogits: the same loss, and the buffer left alone.
  Tensor loss2 = poisoned({1}, DType::F32);
  cuda::cross_entropy(dev_logits, dev_targets.data(), scale, row_loss, loss2, nullptr);
  EXPECT_EQ(to_host(loss2).data<float>()[0], got_loss.data<float>()[0]);
}

}  // namespace

TEST(GpuOps, CrossEntropyLossAndGradient) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // GPT-2 vocabulary (many strides of the 1024-thread block), one ignored row.
  check_cross_entropy(5, 50257, {17, 50256, -1, 0, 31337}, 0.5f, 51);
  // Vocabulary smaller than a warp; several ignored rows (-1 and other negatives).
  check_cross_entropy(6, 7, {3, -1, 6, -100, 0, 2}, 1.0f, 52);
  // Every row ignored: loss 0, gradient 0.
  check_cross_entropy(3, 129, {-1, -1, -1}, 1.0f, 53);
}

namespace {

std::vector<train::ParamSegment> test_segments() {
  // Decay and no-decay segments, a gap, a frozen segment, and a tail outside every segment.
  return {{0, 1000, true, true},
          {1000, 37, false, true},
          {1100, 233, true, false},
          {1333, 70001, true, true},
          {71334, 5, false, true}};
}

}  // namespace

TEST(GpuOps, AdamWMatchesTheCpuOptimizer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(61);
  const int64_t p = 71400;
  train::AdamWOptions options;
  options.weight_decay = 0.1;
  train::AdamW cpu(test_segments(), p, options);
  cuda::DeviceParamSegments segments(test_segments(), p);
  Tensor params = random_f32({p}, rng);
  Tensor initial = params.clone();
  Tensor dev_params = to_device(params);
  Tensor m = Tensor::zeros({p}, DType::F32, Device::CUDA);
  Tensor v = Tensor::zeros({p}, DType::F32, Device::CUDA);
  const double lrs[] = {1e-3, 3e-3, 5e-4};
  for (int step = 1; step <= 3; ++step) {
    Tensor grads = random_f32({p}, rng, -0.1, 0.1);
    cpu.step(params.data<float>(), grads.data<float>(), lrs[step - 1]);
    cuda::adamw_step(dev_params, to_device(grads), m, v, segments, options, lrs[step - 1], step);
  }
  Tensor got = to_host(dev_params), got_m = to_host(m), got_v = to_host(v);
  EXPECT_LT(rel_error(got, params), kAdamTol);
  EXPECT_LT(rel_error(got_m, cpu.m()), kAdamTol);
  EXPECT_LT(rel_error(got_v, cpu.v()), kAdamTol);
  EXPECT_GT(rel_error(got, initial), 1e-4);  // the update did something
  // Outside trainable segments nothing moves and the moments stay zero.
  for (int64_t i : {int64_t{1037}, int64_t{1099}, int64_t{1100}, int64_t{1332}, int64_t{71339},
                    p - 1}) {
    EXPECT_EQ(got.data<float>()[i], initial.data<float>()[i]) << i;
    EXPECT_EQ(got_m.data<float>()[i], 0.0f) << i;
    EXPECT_EQ(got_v.data<float>()[i], 0.0f) << i;
  }
}

// The two halves of clipping, as one process calls them.
void clip_on_device(Tensor& grads, const cuda::DeviceParamSegments& segments, double max_norm, Tensor& norm) {
  cuda::grad_square_sum(grads, segments);
  cuda::clip_to_norm(grads, segments, max_norm, norm);
}

TEST(GpuOps, GradNormAndClipping) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(71);
  const int64_t p = 71400;
  const auto segs = test_segments();
  cuda::DeviceParamSegments segments(segs, p);
  Tensor grads = random_f32({p}, rng, -1.0, 1.0);
  const double ref_norm = train::grad_norm(grads.data<float>(), segs);
  for (double max_norm : {ref_norm / 3.0, ref_norm * 2.0, 0.0}) {
    SCOPED_TRACE(max_norm);
    Tensor want = grads.clone();
    train::clip_grad_norm(want.data<float>(), segs, ref_norm, max_norm);
    Tensor dev = to_device(grads), norm = poisoned({1}, DType::F32);
    clip_on_device(dev, segments, max_norm, norm);
    const float got_norm = to_host(norm).data<float>()[0];
    EXPECT_NEAR(got_norm, ref_norm, kAdamTol * ref_norm);
    EXPECT_LT(rel_error(to_host(dev), want), kAdamTol);
    // Deterministic: a second run gives the same bits.
    Tensor dev2 = to_device(grads), norm2 = poisoned({1}, DType::F32);
    clip_on_device(dev2, segments, max_norm, norm2);
    EXPECT_EQ(to_host(norm2).data<float>()[0], got_norm);
  }
}

// ZeRO-1's optimizer step with every rank's shard done in turn on one device: the shards'
// squared sums added (what the ranks' all-reduce does) clip as the whole buffer's norm does,
// and AdamW over each shard (train::optimizer_shard: the segments in the shard, rebased, with
// the shard's own m and v) gives the whole buffer's parameters and moments. Only the order of
// the norm's sum differs, so the results agree to the AdamW tolerance.
TEST(GpuOps, ShardedClippingAndAdamWEqualTheWholeBuffer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t p = 71400;
  const auto segs = test_segments();
  train::AdamWOptions options;
  options.weight_decay = 0.1;
  const double max_norm = 1.0, lrs[] = {1e-3, 3e-3, 5e-4};
  for (int world : {2, 3}) {
    SCOPED_TRACE(world);
    Rng rng(83);
    const Tensor initial = random_f32({p}, rng);
    cuda::DeviceParamSegments whole(segs, p);
    Tensor want = to_device(initial), want_m = Tensor::zeros({p}, DType::F32, Device::CUDA);
    Tensor want_v = Tensor::zeros({p}, DType::F32, Device::CUDA), want_norm = poisoned({1}, DType::F32);
    std::vector<train::OptimizerShard> shards;
    std::vector<std::unique_ptr<cuda::DeviceParamSegments>> shard_segments;
    std::vector<Tensor> m, v;
    for (int r = 0; r < world; ++r) {
      shards.push_back(train::optimizer_shard(segs, p, r, world));
      const int64_t n = shards.back().range.size();
      shard_segments.push_back(std::make_unique<cuda::DeviceParamSegments>(shards.back().segments, n));
      m.push_back(Tensor::zeros({n}, DType::F32, Device::CUDA));
      v.push_back(Tensor::zeros({n}, DType::F32, Device::CUDA));
    }
    Tensor got = to_device(initial);
    for (int step = 1; step <= 3; ++step) {
      const Tensor grads = random_f32({p}, rng, -0.1, 0.1);
      Tensor g_whole = to_device(grads), g = to_device(grads);
      clip_on_device(g_whole, whole, max_norm, want_norm);
      cuda::adamw_step(want, g_whole, want_m, want_v, whole, options, lrs[step - 1], step);
      double total = 0;
      for (int r = 0; r < world; ++r) {
        const train::Range range = shards[r].range;
        cuda::grad_square_sum(g.slice(0, range.begin, range.end), *shard_segments[r]);
        double part = 0;
        QV_CUDA_CHECK(cudaDeviceSynchronize());
        QV_CUDA_CHECK(cudaMemcpy(&part, shard_segments[r]->square_sum(), sizeof(double), cudaMemcpyDeviceToHost));
        total += part;
      }
      for (int r = 0; r < world; ++r) {
        const train::Range range = shards[r].range;
        QV_CUDA_CHECK(cudaMemcpy(shard_segments[r]->square_sum(), &total, sizeof(double), cudaMemcpyHostToDevice));
        Tensor g_shard = g.slice(0, range.begin, range.end), p_shard = got.slice(0, range.begin, range.end);
        Tensor norm = poisoned({1}, DType::F32);
        cuda::clip_to_norm(g_shard, *shard_segments[r], max_norm, norm);
        EXPECT_NEAR(to_host(norm).data<float>()[0], to_host(want_norm).data<float>()[0],
                    kAdamTol * to_host(want_norm).data<float>()[0]);
        cuda::adamw_step(p_shard, g_shard, m[r], v[r], *shard_segments[r], options, lrs[step - 1], step);
      }
    }
    EXPECT_LT(rel_error(to_host(got), to_host(want)), kAdamTol);
    EXPECT_GT(rel_error(to_host(want), initial), 1e-4);  // the update did something
    // The shards' moments, placed at their ranges, are the whole buffer's.
    Tensor got_m = Tensor::zeros({p}, DType::F32), got_v = Tensor::zeros({p}, DType::F32);
    for (int r = 0; r < world; ++r) {
      const train::Range range = shards[r].range;
      got_m.slice(0, range.begin, range.end).copy_from(to_host(m[r]));
      got_v.slice(0, range.begin, range.end).copy_from(to_host(v[r]));
    }
    EXPECT_LT(rel_error(got_m, to_host(want_m)), kAdamTol);
    EXPECT_LT(rel_error(got_v, to_host(want_v)), kAdamTol);
  }
}
