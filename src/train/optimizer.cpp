#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "quiver/parallel.h"

namespace quiver::train {

namespace {

// Work is split in fixed blocks of the flat buffer so that reductions add in the same order
// whatever the thread count.
constexpr int64_t kBlock = 1 << 15;

// Calls fn(segment, begin, end) for the parts of trainable segments inside [block_begin, block_end).
template <typename Fn>
void for_trainable_in(const std::vector<ParamSegment>& segments, int64_t block_begin,
                      int64_t block_end, Fn&& fn) {
  auto it = std::upper_bound(segments.begin(), segments.end(), block_begin,
                             [](int64_t x, const ParamSegment& s) { return x < s.offset + s.numel; });
  for (; it != segments.end() && it->offset < block_end; ++it) {
    if (!it->trainable) continue;
    int64_t begin = std::max(block_begin, it->offset);
    int64_t end = std::min(block_end, it->offset + it->numel);
    if (begin < end) fn(*it, begin, end);
  }
}

int64_t extent(const std::vector<ParamSegment>& segments) {
  int64_t end = 0;
  for (const ParamSegment& s : segments) end = std::max(end, s.offset + s.numel);
  return end;
}

}  // namespace

std::vector<ParamSegment> sorted_segments(std::vector<ParamSegment> segments, int64_t num_params, const char* who) {
  std::sort(segments.begin(), segments.end(),
            [](const ParamSegment& a, const ParamSegment& b) { return a.offset < b.offset; });
  int64_t previous_end = 0;
  for (const ParamSegment& s : segments) {
    QV_CHECK(s.offset >= previous_end && s.numel >= 0 && s.offset + s.numel <= num_params,
             "{}: parameter segment [{}, {}) overlaps another or lies outside the {} parameters", who, s.offset,
             s.offset + s.numel, num_params);
    previous_end = s.offset + s.numel;
  }
  return segments;
}

AdamW::AdamW(std::vector<ParamSegment> segments, int64_t num_params, AdamWOptions options)
    : segments_(sorted_segments(std::move(segments), num_params, "AdamW")),
      num_params_(num_params),
      options_(options) {
  QV_CHECK(options_.beta1 >= 0 && options_.beta1 < 1, "AdamW: beta1 must be in [0, 1), got {}",
           options_.beta1);
  QV_CHECK(options_.beta2 >= 0 && options_.beta2 < 1, "AdamW: beta2 must be in [0, 1), got {}",
           options_.beta2);
  QV_CHECK(options_.eps > 0, "AdamW: eps must be positive, got {}", options_.eps);
  QV_CHECK(options_.weight_decay >= 0, "AdamW: weight decay must be non-negative, got {}",
           options_.weight_decay);
  m_ = Tensor::zeros({num_params}, DType::F32);
  v_ = Tensor::zeros({num_params}, DType::F32);
}

void AdamW::set_steps_taken(int64_t t) {
  QV_CHECK(t >= 0, "AdamW: step count must be non-negative, got {}", t);
  t_ = t;
}

void AdamW::step(float* params, const float* grads, double lr) {
  ++t_;
  const double b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const double step_size = lr / (1.0 - std::pow(b1, static_cast<double>(t_)));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_)));
  const double decay_factor = 1.0 - lr * options_.weight_decay;
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  const int64_t n = extent(segments_);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t block = block_begin; block < block_end; ++block) {
      for_trainable_in(segments_, block * kBlock, std::min(n, (block + 1) * kBlock),
                       [&](const ParamSegment& s, int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i) {
                           const double g = grads[i];
                           const double mi = b1 * m[i] + (1.0 - b1) * g;
                           const double vi = b2 * v[i] + (1.0 - b2) * g * g;
                           m[i] = static_cast<float>(mi);
                           v[i] = static_cast<float>(vi);
                           double p = params[i];
                           if (s.decay) p *= decay_factor;
                           p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
                           params[i] = static_cast<float>(p);
                         }
                       });
    }
  });
}

void LrSchedule::validate() const {
  QV_CHECK(peak_lr >= 0 && std::isfinite(peak_lr), "learning rate must be finite and non-negative, got {}",
           peak_lr);
  QV_CHECK(total_steps >= 1, "the schedule needs at least one step, got {}", total_steps);
  QV_CHECK(warmup >= 0, "warmup steps must be non-negative, got {}", warmup);
  QV_CHECK(final_lr_frac >= 0 && final_lr_frac <= 1, "final_lr_frac must be in [0, 1], got {}",
           final_lr_frac);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double final_lr = final_lr_frac * peak_lr;
  const int64_t decay_steps = total_steps - 1 - warmup;
  if (decay_steps <= 0) return peak_lr;
  if (step >= total_steps - 1) return final_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(decay_steps);
  return final_lr + (peak_lr - final_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double grad_norm(const float* grads, const std::vector<ParamSegment>& segments) {
  const int64_t n = extent(segments);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t block = block_begin; block < block_end; ++block) {
      double sum = 0;
      for_trainable_in(segments, block * kBlock, std::min(n, (block + 1) * kBlock),
                       [&](const ParamSegment&, int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i)
                           sum += static_cast<double>(grads[i]) * grads[i];
                       });
      partial[static_cast<size_t>(block)] = sum;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return std::sqrt(total);
}

double clip_grad_norm(float* grads, const std::vector<ParamSegment>& segments, double norm,
                      double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  const double scale = max_norm / norm;
  const int64_t n = extent(segments);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t block = block_begin; block < block_end; ++block)
      for_trainable_in(segments, block * kBlock, std::min(n, (block + 1) * kBlock),
                       [&](const ParamSegment&, int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i)
                           grads[i] = static_cast<float>(grads[i] * scale);
                       });
  });
  return scale;
}

}  // namespace quiver::train
