// Seeded, reproducible random numbers: xoshiro256** seeded through splitmix64.
// The same seed gives the same stream on every machine.
#pragma once
#include <cstdint>

#include "quiver/tensor.h"

namespace quiver {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  double uniform();                  // [0, 1)
  double uniform(double lo, double hi);
  double normal();                   // standard normal (Box–Muller)
  uint64_t below(uint64_t n);        // uniform integer in [0, n)

  // Fills a CPU tensor of any float dtype.
  void fill_uniform(Tensor& t, double lo, double hi);
  void fill_normal(Tensor& t, double mean = 0.0, double stddev = 1.0);

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace quiver
