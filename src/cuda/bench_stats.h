// Shared statistics of the GPU benchmarks (algproj_bench, relation_bench): host code.
#pragma once
#include <algorithm>
#include <vector>

namespace quiver::cuda::detail {

// The median of timed trials (the mean of the middle two for an even count).
inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace quiver::cuda::detail
