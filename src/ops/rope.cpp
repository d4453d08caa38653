#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quiver/parallel.h"

namespace quiver::ops {

template <typename T>
void rope_apply(const T* x, T* y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                int64_t pos0, double base, bool inverse) {
  const int64_t half = head_dim / 2;
  // cos/sin of θ(pos0 + t, i), [seq, half], computed in double and shared by batch and heads.
  std::vector<T> cos_table(static_cast<size_t>(seq * half)), sin_table(cos_table.size());
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  const double sign = inverse ? -1.0 : 1.0;
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(pos0 + t) * inv_freq[i];
      cos_table[t * half + i] = static_cast<T>(std::cos(angle));
      sin_table[t * half + i] = static_cast<T>(sign * std::sin(angle));
    }
  }
  const int64_t rows = batch * seq;
  const int64_t row_size = heads * head_dim;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_size)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const T* c = cos_table.data() + (r % seq) * half;
                   const T* s = sin_table.data() + (r % seq) * half;
                   for (int64_t h = 0; h < heads; ++h) {
                     const T* xi = x + (r * heads + h) * head_dim;
                     T* yi = y + (r * heads + h) * head_dim;
                     for (int64_t i = 0; i < half; ++i) {
                       T a = xi[i], b = xi[i + half];
                       yi[i] = a * c[i] - b * s[i];
                       yi[i + half] = a * s[i] + b * c[i];
                     }
                   }
                 }
               });
}

template void rope_apply<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                double, bool);
template void rope_apply<double>(const double*, double*, int64_t, int64_t, int64_t, int64_t,
                                 int64_t, double, bool);

namespace {

void rope_dispatch(const Tensor& in, Tensor& out, int64_t pos0, double base, bool inverse,
                   const char* in_name, const char* out_name) {
  check_cpu_contiguous(in, in_name);
  QV_CHECK(in.ndim() == 3 || in.ndim() == 4, "rope: {} must be [T, H, Dh] or [B, T, H, Dh], got {}",
           in_name, shape_str(in.shape()));
  const int64_t head_dim = in.dim(-1);
  QV_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head width must be even and positive, got {} ({} {})",
           head_dim, in_name, shape_str(in.shape()));
  QV_CHECK(pos0 >= 0, "rope: pos0 must be non-negative, got {}", pos0);
  QV_CHECK(std::isfinite(base) && base > 0, "rope: base must be positive and finite, got {}", base);
  check_shape(out, in.shape(), out_name);
  check_dtype(out, in.dtype(), out_name);
  check_cpu_contiguous(out, out_name);
  const int64_t batch = in.ndim() == 4 ? in.dim(0) : 1;
  const int64_t seq = in.dim(-3), heads = in.dim(-2);
  switch (in.dtype()) {
    case DType::F32:
      rope_apply(in.data<float>(), out.data<float>(), batch, seq, heads, head_dim, pos0, base, inverse);
      break;
    case DType::F64:
      rope_apply(in.data<double>(), out.data<double>(), batch, seq, heads, head_dim, pos0, base,
                 inverse);
      break;
    default:
      fail("rope: {} must be F32 or F64, got {}", in_name, dtype_name(in.dtype()));
  }
}

}  // namespace

void rope_forward(const Tensor& x, Tensor& y, int64_t pos0, double base) {
  rope_dispatch(x, y, pos0, base, /*inverse=*/false, "x", "y");
}

void rope_backward(const Tensor& dy, Tensor& dx, int64_t pos0, double base) {
  rope_dispatch(dy, dx, pos0, base, /*inverse=*/true, "dy", "dx");
}

}  // namespace quiver::ops
