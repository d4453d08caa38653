#include "quiver/rng.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace quiver {
namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next_u64() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  double r = std::sqrt(-2.0 * std::log(u1));
  double a = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(a);
  has_spare_ = true;
  return r * std::cos(a);
}

uint64_t Rng::below(uint64_t n) {
  QV_CHECK(n > 0, "Rng::below(0)");
  return next_u64() % n;
}

void Rng::fill_uniform(Tensor& t, double lo, double hi) {
  Tensor tmp = Tensor::empty(t.shape(), DType::F64);
  double* p = tmp.data<double>();
  for (int64_t i = 0; i < tmp.numel(); ++i) p[i] = uniform(lo, hi);
  t.copy_from(tmp);
}

void Rng::fill_normal(Tensor& t, double mean, double stddev) {
  Tensor tmp = Tensor::empty(t.shape(), DType::F64);
  double* p = tmp.data<double>();
  for (int64_t i = 0; i < tmp.numel(); ++i) p[i] = mean + stddev * normal();
  t.copy_from(tmp);
}

}  // namespace quiver
