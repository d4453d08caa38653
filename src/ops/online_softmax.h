// The online-softmax step that the CPU flash mixers share (attention and FlashRelation differ
// only in how a score is formed): one query row against one key tile.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace quiver::ops {

// s holds the row's `valid` scores followed by padding up to `width`. Updates the running max
// m and sum l, rescales the accumulator row acc[0, Dh), and turns s into the tile's
// unnormalized weights exp(s − m_new), with zeros in the padding.
template <typename T>
inline void online_softmax_row(T* s, int64_t valid, int64_t width, T& m, T& l, T* acc,
                               int64_t Dh) {
  T mx = m;
  for (int64_t c = 0; c < valid; ++c) mx = std::max(mx, s[c]);
  const T alpha = std::exp(m - mx);
  T sum = 0;
  for (int64_t c = 0; c < valid; ++c) {
    s[c] = std::exp(s[c] - mx);
    sum += s[c];
  }
  std::fill(s + valid, s + width, T(0));
  l = l * alpha + sum;
  m = mx;
  for (int64_t c = 0; c < Dh; ++c) acc[c] *= alpha;
}

}  // namespace quiver::ops
