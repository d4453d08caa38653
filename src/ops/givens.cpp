#include "ops/givens.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quiver/parallel.h"

namespace quiver::ops {

bool givens_mixes(int64_t heads) {
  QV_CHECK(heads >= 1, "givens: head count must be at least 1, got {}", heads);
  QV_CHECK(heads == 1 || heads % 2 == 0,
           "givens: head count must be even for Givens pairing (or 1 for no mixing), got H = {}",
           heads);
  return heads > 1;
}

std::vector<std::pair<int64_t, int64_t>> givens_pairs(int64_t heads, int64_t layer) {
  QV_CHECK(layer >= 0, "givens: layer index must be non-negative, got {}", layer);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  if (!givens_mixes(heads)) return pairs;
  for (int64_t k = 0; k < heads / 2; ++k) {
    if (layer % 2 == 0)
      pairs.emplace_back(2 * k, 2 * k + 1);
    else
      pairs.emplace_back(2 * k + 1, (2 * k + 2) % heads);
  }
  return pairs;
}

namespace {

// Rows (of H·Dh elements) per block of the dθ reduction; fixed so that the summation
// order does not depend on the thread count.
constexpr int64_t kRowsPerBlock = 64;

struct Geometry {
  int64_t rows = 0, heads = 0, head_dim = 0;
};

Geometry check_states(const Tensor& t, const char* name) {
  check_cpu_contiguous(t, name);
  QV_CHECK(t.ndim() == 3 || t.ndim() == 4, "givens: {} must be [T, H, Dh] or [B, T, H, Dh], got {}",
           name, shape_str(t.shape()));
  QV_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, "givens: {} must be F32 or F64, got {}",
           name, dtype_name(t.dtype()));
  Geometry g;
  g.heads = t.dim(-2);
  g.head_dim = t.dim(-1);
  g.rows = g.heads * g.head_dim == 0 ? 0 : t.numel() / (g.heads * g.head_dim);
  givens_mixes(g.heads);
  return g;
}

void check_theta(const Tensor& theta, const Tensor& states, int64_t heads, const char* name) {
  check_cpu_contiguous(theta, name);
  check_shape(theta, {heads / 2}, name);
  QV_CHECK(theta.dtype() == DType::F32 || theta.dtype() == states.dtype(),
           "givens: {} must be F32 or {} (the dtype of the states), got {}", name,
           dtype_name(states.dtype()), dtype_name(theta.dtype()));
}

std::vector<double> angles(const Tensor& theta) {
  std::vector<double> out(static_cast<size_t>(theta.numel()));
  for (int64_t k = 0; k < theta.numel(); ++k)
    out[k] = theta.dtype() == DType::F32 ? static_cast<double>(theta.data<float>()[k])
                                         : theta.data<double>()[k];
  return out;
}

// Rotates every pair of every row: out_a = c·in_a − s·in_b, out_b = s·in_a + c·in_b.
// The backward of dI is the same kernel with s negated.
template <typename T>
void rotate(const T* in, T* out, const Geometry& g, const std::vector<std::pair<int64_t, int64_t>>& pairs,
            const std::vector<T>& c, const std::vector<T>& s) {
  const int64_t row_size = g.heads * g.head_dim;
  parallel_for(g.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_size)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   for (size_t k = 0; k < pairs.size(); ++k) {
                     const T* ia = in + r * row_size + pairs[k].first * g.head_dim;
                     const T* ib = in + r * row_size + pairs[k].second * g.head_dim;
                     T* oa = out + r * row_size + pairs[k].first * g.head_dim;
                     T* ob = out + r * row_size + pairs[k].second * g.head_dim;
                     const T ck = c[k], sk = s[k];
                     for (int64_t d = 0; d < g.head_dim; ++d) {
                       T a = ia[d], b = ib[d];
                       oa[d] = ck * a - sk * b;
                       ob[d] = sk * a + ck * b;
                     }
                   }
                 }
               });
}

template <typename T>
void forward_impl(const Tensor& I, const std::vector<double>& theta, int64_t layer, Tensor& out,
                  const Geometry& g) {
  const auto pairs = givens_pairs(g.heads, layer);
  if (pairs.empty()) {
    if (out.raw() != I.raw()) std::memmove(out.raw(), I.raw(), I.nbytes());
    return;
  }
  std::vector<T> c(pairs.size()), s(pairs.size());
  for (size_t k = 0; k < pairs.size(); ++k) {
    c[k] = static_cast<T>(std::cos(theta[k]));
    s[k] = static_cast<T>(std::sin(theta[k]));
  }
  rotate(I.data<T>(), out.data<T>(), g, pairs, c, s);
}

template <typename T>
void backward_impl(const Tensor& dOut, const Tensor& I, const std::vector<double>& theta, int64_t layer,
                   Tensor& dI, std::vector<double>& dtheta, const Geometry& g) {
  const auto pairs = givens_pairs(g.heads, layer);
  const size_t P = pairs.size();
  dtheta.assign(P, 0.0);
  if (P == 0) {
    if (dI.raw() != dOut.raw()) std::memmove(dI.raw(), dOut.raw(), dOut.nbytes());
    return;
  }
  std::vector<double> cd(P), sd(P);
  for (size_t k = 0; k < P; ++k) {
    cd[k] = std::cos(theta[k]);
    sd[k] = std::sin(theta[k]);
  }
  // dθ first, reading dOut before dI (which may alias it) is written.
  const T* go = dOut.data<T>();
  const T* x = I.data<T>();
  const int64_t row_size = g.heads * g.head_dim;
  const int64_t blocks = (g.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<double> partial(static_cast<size_t>(blocks) * P, 0.0);
  parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      double* acc = partial.data() + blk * P;
      const int64_t r_end = std::min(g.rows, (blk + 1) * kRowsPerBlock);
      for (int64_t r = blk * kRowsPerBlock; r < r_end; ++r) {
        for (size_t k = 0; k < P; ++k) {
          const int64_t oa = r * row_size + pairs[k].first * g.head_dim;
          const int64_t ob = r * row_size + pairs[k].second * g.head_dim;
          // dθ = Σ dOut_a·(−Ĩ_b) + dOut_b·Ĩ_a, with Ĩ recomputed from I.
          double sum = 0;
          for (int64_t d = 0; d < g.head_dim; ++d) {
            double a = x[oa + d], b = x[ob + d];
            double ya = cd[k] * a - sd[k] * b, yb = sd[k] * a + cd[k] * b;
            sum += static_cast<double>(go[ob + d]) * ya - static_cast<double>(go[oa + d]) * yb;
          }
          acc[k] += sum;
        }
      }
    }
  });
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (size_t k = 0; k < P; ++k) dtheta[k] += partial[blk * P + k];

  std::vector<T> c(P), s(P);
  for (size_t k = 0; k < P; ++k) {
    c[k] = static_cast<T>(cd[k]);
    s[k] = static_cast<T>(-sd[k]);
  }
  rotate(go, dI.data<T>(), g, pairs, c, s);
}

}  // namespace

void givens_forward(const Tensor& I, const Tensor& theta, int64_t layer, Tensor& out) {
  Geometry g = check_states(I, "I");
  check_theta(theta, I, g.heads, "theta");
  check_shape(out, I.shape(), "out");
  check_dtype(out, I.dtype(), "out");
  check_cpu_contiguous(out, "out");
  QV_CHECK(layer >= 0, "givens: layer index must be non-negative, got {}", layer);
  const std::vector<double> th = angles(theta);
  if (I.dtype() == DType::F32)
    forward_impl<float>(I, th, layer, out, g);
  else
    forward_impl<double>(I, th, layer, out, g);
}

void givens_backward(const Tensor& dOut, const Tensor& I, const Tensor& theta, int64_t layer,
                     Tensor& dI, Tensor& dTheta) {
  Geometry g = check_states(I, "I");
  check_shape(dOut, I.shape(), "dOut");
  check_dtype(dOut, I.dtype(), "dOut");
  check_cpu_contiguous(dOut, "dOut");
  check_shape(dI, I.shape(), "dI");
  check_dtype(dI, I.dtype(), "dI");
  check_cpu_contiguous(dI, "dI");
  check_theta(theta, I, g.heads, "theta");
  check_shape(dTheta, theta.shape(), "dTheta");
  check_dtype(dTheta, theta.dtype(), "dTheta");
  check_cpu_contiguous(dTheta, "dTheta");
  QV_CHECK(layer >= 0, "givens: layer index must be non-negative, got {}", layer);
  const std::vector<double> th = angles(theta);
  std::vector<double> dth;
  if (I.dtype() == DType::F32)
    backward_impl<float>(dOut, I, th, layer, dI, dth, g);
  else
    backward_impl<double>(dOut, I, th, layer, dI, dth, g);
  for (size_t k = 0; k < dth.size(); ++k) {
    if (dTheta.dtype() == DType::F32)
      dTheta.data<float>()[k] = static_cast<float>(dth[k]);
    else
      dTheta.data<double>()[k] = dth[k];
  }
}

}  // namespace quiver::ops
