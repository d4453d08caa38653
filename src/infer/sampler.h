// Next-token sampling from F32 logits: greedy, or temperature, then top-k, then top-p
// (nucleus), with a seeded generator so that a seed reproduces a completion.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "quiver/rng.h"

namespace quiver::infer {

struct SamplerOptions {
  double temperature = 1.0;  // 0 means greedy
  int64_t top_k = 0;         // keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // keep the smallest most-likely set whose mass reaches p; 1 = all
  bool greedy = false;       // argmax (the lowest id among equal maxima)
  uint64_t seed = 0;

  bool is_greedy() const { return greedy || temperature == 0; }
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);

  // Draws one token id from logits[0..V).
  int32_t sample(const float* logits, int64_t V);

  // The distribution sample() draws from (V probabilities summing to 1; zeros outside the
  // kept set). Greedy: all mass on the argmax.
  std::vector<double> distribution(const float* logits, int64_t V) const;

  const SamplerOptions& options() const { return options_; }

 private:
  SamplerOptions options_;
  Rng rng_;
  // The kept tokens as (probability, id), normalized; most likely first when top-p applies.
  // Returns a reference to scratch reused between calls (no allocation per token).
  const std::vector<std::pair<double, int32_t>>& kept(const float* logits, int64_t V) const;
  mutable std::vector<int32_t> ids_scratch_;
  mutable std::vector<std::pair<double, int32_t>> items_scratch_;
};

int32_t argmax(const float* logits, int64_t V);

}  // namespace quiver::infer
