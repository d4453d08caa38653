// AdamW against a plain double-precision transcription of the update, the schedule at its key
// steps, and global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "quiver/parallel.h"
#include "quiver/rng.h"
#include "train/optimizer.h"

using namespace quiver;
using namespace quiver::train;

namespace {

// Segments over 1000 + 37 + 3000 + 5 parameters: a decayed matrix, a norm vector, another
// decayed matrix that straddles the optimizer's internal blocks, and a frozen scalar group.
std::vector<ParamSegment> mixed_segments() {
  return {{0, 1000, true, true}, {1000, 37, false, true}, {1037, 70000, true, true},
          {71037, 5, false, false}};
}
constexpr int64_t kParams = 71042;

std::vector<float> random_vector(int64_t n, Rng& rng, double stddev) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(stddev * rng.normal());
  return v;
}

}  // namespace

TEST(AdamW, ThreeStepsMatchHandComputationInDouble) {
  Rng rng(3);
  AdamWOptions opt;
  opt.beta1 = 0.8;
  opt.beta2 = 0.95;
  opt.eps = 1e-6;
  opt.weight_decay = 0.1;
  const auto segments = mixed_segments();
  AdamW adam(segments, kParams, opt);

  std::vector<float> params = random_vector(kParams, rng, 0.5);
  std::vector<double> p_ref(params.begin(), params.end());
  std::vector<double> m_ref(kParams, 0.0), v_ref(kParams, 0.0);
  const double lrs[] = {1e-2, 3e-3, 5e-2};
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> grads = random_vector(kParams, rng, 1.0);
    adam.step(params.data(), grads.data(), lrs[t - 1]);
    const double lr = lrs[t - 1];
    for (const ParamSegment& s : segments) {
      if (!s.trainable) continue;
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const double g = grads[i];
        m_ref[i] = opt.beta1 * m_ref[i] + (1 - opt.beta1) * g;
        v_ref[i] = opt.beta2 * v_ref[i] + (1 - opt.beta2) * g * g;
        const double m_hat = m_ref[i] / (1 - std::pow(opt.beta1, t));
        const double v_hat = v_ref[i] / (1 - std::pow(opt.beta2, t));
        if (s.decay) p_ref[i] -= lr * opt.weight_decay * p_ref[i];
        p_ref[i] -= lr * m_hat / (std::sqrt(v_hat) + opt.eps);
      }
    }
  }
  EXPECT_EQ(adam.steps_taken(), 3);
  double max_err = 0, max_m_err = 0;
  const float* m = adam.m().data<float>();
  for (int64_t i = 0; i < kParams; ++i) {
    max_err = std::max(max_err, std::abs(params[i] - p_ref[i]) / (std::abs(p_ref[i]) + 1e-3));
    max_m_err = std::max(max_m_err, std::abs(m[i] - m_ref[i]));
  }
  // Parameters and moments are stored in F32 between steps: a few ulps of drift.
  EXPECT_LT(max_err, 1e-5);
  EXPECT_LT(max_m_err, 1e-6);
  // The frozen segment is untouched and its moments stay zero.
  for (int64_t i = 71037; i < kParams; ++i) {
    EXPECT_EQ(params[i], static_cast<float>(p_ref[i]));
    EXPECT_EQ(m[i], 0.0f);
  }
}

TEST(AdamW, DecayOnlyWhereMarked) {
  // With zero gradients the Adam term vanishes and only the decoupled decay moves θ.
  AdamW adam({{0, 4, true, true}, {4, 4, false, true}}, 8, AdamWOptions{});
  std::vector<float> params(8, 2.0f), grads(8, 0.0f);
  adam.step(params.data(), grads.data(), 0.5);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(params[i], 2.0f * (1 - 0.5 * 0.1));
  for (int i = 4; i < 8; ++i) EXPECT_EQ(params[i], 2.0f);
}

TEST(AdamW, RejectsOverlappingSegments) {
  EXPECT_THROW(AdamW({{0, 10, true, true}, {5, 10, true, true}}, 20, AdamWOptions{}), Error);
  EXPECT_THROW(AdamW({{0, 30, true, true}}, 20, AdamWOptions{}), Error);
}

TEST(LrSchedule, KeySteps) {
  LrSchedule s{.peak_lr = 1e-3, .warmup = 10, .total_steps = 111, .final_lr_frac = 0.1};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);          // (0+1)/10 of the peak
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);          // warmup ends at the peak
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);         // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-4), 1e-15);  // halfway through the 100 decay steps
  EXPECT_NEAR(s.at(35), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);        // the last step is at the final fraction
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  for (int64_t i = 10; i < 110; ++i) EXPECT_GT(s.at(i), s.at(i + 1));
}

TEST(LrSchedule, NoWarmupAndTinyRuns) {
  LrSchedule s{.peak_lr = 2.0, .warmup = 0, .total_steps = 3, .final_lr_frac = 0.5};
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_DOUBLE_EQ(s.at(1), 1.5);
  EXPECT_DOUBLE_EQ(s.at(2), 1.0);
  LrSchedule one{.peak_lr = 2.0, .warmup = 0, .total_steps = 1, .final_lr_frac = 0.5};
  EXPECT_DOUBLE_EQ(one.at(0), 2.0);
  LrSchedule bad{.peak_lr = 1.0, .warmup = 0, .total_steps = 0, .final_lr_frac = 0.1};
  EXPECT_THROW(bad.validate(), Error);
}

TEST(Clipping, ScalesExactlyToTheMaxNorm) {
  Rng rng(5);
  const auto segments = mixed_segments();
  std::vector<float> grads = random_vector(kParams, rng, 1.0);
  double sum = 0;
  for (const ParamSegment& s : segments)
    if (s.trainable)
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) sum += double(grads[i]) * grads[i];
  const double norm = grad_norm(grads.data(), segments);
  EXPECT_NEAR(norm, std::sqrt(sum), 1e-12 * std::sqrt(sum));

  const float frozen = grads[kParams - 1];
  const double scale = clip_grad_norm(grads.data(), segments, norm, 1.0);
  EXPECT_NEAR(scale, 1.0 / norm, 1e-15);
  EXPECT_NEAR(grad_norm(grads.data(), segments), 1.0, 1e-6);
  EXPECT_EQ(grads[kParams - 1], frozen);

  // Below the threshold, or with clipping off, nothing changes.
  std::vector<float> copy = grads;
  EXPECT_EQ(clip_grad_norm(grads.data(), segments, 1.0, 2.0), 1.0);
  EXPECT_EQ(clip_grad_norm(grads.data(), segments, 1e9, 0.0), 1.0);
  EXPECT_EQ(copy, grads);
}

TEST(Clipping, NormIsIndependentOfThreadCount) {
  Rng rng(6);
  const auto segments = mixed_segments();
  std::vector<float> grads = random_vector(kParams, rng, 1.0);
  const int saved = num_threads();
  set_num_threads(1);
  const double one = grad_norm(grads.data(), segments);
  set_num_threads(3);
  const double three = grad_norm(grads.data(), segments);
  set_num_threads(saved);
  EXPECT_EQ(one, three);
}
