// AdamW with decoupled weight decay, the learning-rate schedule (linear warmup, then cosine
// to a final fraction of the peak) and global-norm gradient clipping, over the flat F32
// parameter and gradient buffers of a model.
#pragma once
#include <cstdint>
#include <vector>

#include "quiver/tensor.h"

namespace quiver::train {

// A contiguous range of the flat parameter buffer and how the optimizer treats it.
struct ParamSegment {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = false;      // decoupled weight decay applies (matrices by default)
  bool trainable = true;   // false: neither updated nor counted in the gradient norm
};

// `segments` sorted by offset; an error naming `who` if two overlap or one lies outside
// [0, num_params). What the optimizer, its shards and its device tables accept.
std::vector<ParamSegment> sorted_segments(std::vector<ParamSegment> segments, int64_t num_params, const char* who);

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// PyTorch's AdamW, step t = 1, 2, ...:
//   m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²
//   θ ← θ (1 − lr·wd)                                  (decay segments only)
//   θ ← θ − (lr / (1−β1^t)) · m / (sqrt(v) / sqrt(1−β2^t) + eps)
// m and v are F32 flat buffers the size of the parameter buffer; entries of segments that are
// not trainable stay zero. The update is elementwise, so its result does not depend on the
// thread count.
class AdamW {
 public:
  AdamW(std::vector<ParamSegment> segments, int64_t num_params, AdamWOptions options);

  // One update of params (F32, [P]) from grads (F32, [P]) at learning rate lr.
  void step(float* params, const float* grads, double lr);

  const AdamWOptions& options() const { return options_; }
  const std::vector<ParamSegment>& segments() const { return segments_; }
  int64_t num_params() const { return num_params_; }
  int64_t steps_taken() const { return t_; }

  // State for checkpoints: m, v ([P] F32) and the step count t.
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  const Tensor& m() const { return m_; }
  const Tensor& v() const { return v_; }
  void set_steps_taken(int64_t t);

 private:
  std::vector<ParamSegment> segments_;
  int64_t num_params_;
  AdamWOptions options_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

// Linear warmup, then cosine decay to final_lr_frac · peak_lr at the last step.
// Steps are 0-based optimizer updates s = 0 .. total_steps−1:
//   s < warmup:  lr = peak · (s+1) / warmup       (the ramp from 0 ends at the peak on step warmup−1)
//   s ≥ warmup:  lr = final + (peak − final) · ½ (1 + cos(π · (s − warmup) / (total − 1 − warmup)))
// so the first cosine step is at the peak and step total−1 is exactly at final. Steps past the
// end stay at final. A run too short for a decay phase (total ≤ warmup + 1) stays at the peak
// after the warmup.
struct LrSchedule {
  double peak_lr = 3e-4;
  int64_t warmup = 0;
  int64_t total_steps = 1;
  double final_lr_frac = 0.1;

  double at(int64_t step) const;
  void validate() const;
};

// √(Σ g²) over the trainable segments, accumulated in double in fixed blocks so the result is
// the same for any thread count.
double grad_norm(const float* grads, const std::vector<ParamSegment>& segments);

// Scales the trainable gradients by max_norm / norm when norm > max_norm (max_norm ≤ 0: off).
// Returns the scale applied (1 when no clipping).
double clip_grad_norm(float* grads, const std::vector<ParamSegment>& segments, double norm,
                      double max_norm);

}  // namespace quiver::train
