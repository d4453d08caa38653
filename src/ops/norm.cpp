#include "ops/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quiver/parallel.h"

namespace quiver::ops {
namespace {

void check_float_cpu(const Tensor& t, DType dtype, const char* op, const char* name) {
  QV_CHECK(t.defined(), "{}: {} is undefined", op, name);
  QV_CHECK(t.device() == Device::CPU && t.is_contiguous(),
           "{}: {} must be a contiguous CPU tensor (shape {})", op, name, shape_str(t.shape()));
  QV_CHECK(t.dtype() == dtype, "{}: {}: expected dtype {}, got {}", op, name, dtype_name(dtype),
           dtype_name(t.dtype()));
}

void check_same_shape(const Tensor& t, const Tensor& like, DType dtype, const char* op,
                      const char* name, const char* like_name) {
  check_float_cpu(t, dtype, op, name);
  QV_CHECK(t.shape() == like.shape(), "{}: {}: expected shape {} (as {}), got {}", op, name,
           shape_str(like.shape()), like_name, shape_str(t.shape()));
}

// Parameters (weight, bias and their gradients) are [D].
void check_vector(const Tensor& t, int64_t size, DType dtype, const char* op, const char* name) {
  check_float_cpu(t, dtype, op, name);
  QV_CHECK(t.ndim() == 1 && t.dim(0) == size, "{}: {}: expected shape [{}], got {}", op, name,
           size, shape_str(t.shape()));
}

// Saved row statistics (mean, rstd) hold one value per row in any shape ([N] or [B, T]).
void check_row_stats(const Tensor& t, int64_t rows, DType dtype, const char* op, const char* name) {
  check_float_cpu(t, dtype, op, name);
  QV_CHECK(t.numel() == rows, "{}: {}: expected {} elements (one per row), got shape {}", op, name,
           rows, shape_str(t.shape()));
}

// x is [..., D]: rows = product of the leading dims.
struct Rows {
  int64_t count;
  int64_t width;
};

Rows input_rows(const Tensor& x, const char* op) {
  QV_CHECK(x.defined(), "{}: x is undefined", op);
  QV_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::F64, "{}: x must be F32 or F64, got {}",
           op, dtype_name(x.dtype()));
  check_float_cpu(x, x.dtype(), op, "x");
  QV_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, "{}: x must be [N, D] with D > 0, got {}", op,
           shape_str(x.shape()));
  return {x.numel() / x.dim(-1), x.dim(-1)};
}

int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 8192 / width); }
int64_t column_grain(int64_t rows) { return std::max<int64_t>(8, 65536 / std::max<int64_t>(1, rows)); }

template <typename T>
void layernorm_forward_impl(const T* x, const T* weight, const T* bias, double eps, int64_t rows,
                            int64_t width, T* y, T* mean_out, T* rstd_out) {
  parallel_for(rows, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * width;
      double sum = 0;
      for (int64_t d = 0; d < width; ++d) sum += xr[d];
      const double mean = sum / static_cast<double>(width);
      double squares = 0;
      for (int64_t d = 0; d < width; ++d) {
        const double centered = xr[d] - mean;
        squares += centered * centered;
      }
      const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(width) + eps);
      mean_out[r] = static_cast<T>(mean);
      rstd_out[r] = static_cast<T>(rstd);
      const T m = static_cast<T>(mean), s = static_cast<T>(rstd);
      T* yr = y + r * width;
      for (int64_t d = 0; d < width; ++d) yr[d] = (xr[d] - m) * s * weight[d] + bias[d];
    }
  });
}

// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)) with g = dy ⊙ weight, x̂ = (x − mean) · rstd.
// dweight/dbias are column sums over rows: each thread owns a column range and adds rows
// in order, so the result does not depend on the thread count.
template <typename T>
void layernorm_backward_impl(const T* dy, const T* x, const T* weight, const T* mean_in,
                             const T* rstd_in, int64_t rows, int64_t width, T* dx, T* dweight,
                             T* dbias) {
  parallel_for(rows, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * width;
      const T* dyr = dy + r * width;
      const T m = mean_in[r], s = rstd_in[r];
      double g_sum = 0, gx_sum = 0;
      for (int64_t d = 0; d < width; ++d) {
        const double g = static_cast<double>(dyr[d]) * weight[d];
        g_sum += g;
        gx_sum += g * static_cast<double>((xr[d] - m) * s);
      }
      const T g_mean = static_cast<T>(g_sum / static_cast<double>(width));
      const T gx_mean = static_cast<T>(gx_sum / static_cast<double>(width));
      T* dxr = dx + r * width;
      for (int64_t d = 0; d < width; ++d)
        dxr[d] = s * (dyr[d] * weight[d] - g_mean - (xr[d] - m) * s * gx_mean);
    }
  });
  parallel_for(width, column_grain(rows), [&](int64_t begin, int64_t end) {
    std::vector<double> weight_sum(static_cast<size_t>(end - begin), 0.0);
    std::vector<double> bias_sum(weight_sum.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * width;
      const T* dyr = dy + r * width;
      const T m = mean_in[r], s = rstd_in[r];
      for (int64_t d = begin; d < end; ++d) {
        weight_sum[d - begin] += static_cast<double>(dyr[d]) * static_cast<double>((xr[d] - m) * s);
        bias_sum[d - begin] += dyr[d];
      }
    }
    for (int64_t d = begin; d < end; ++d) {
      dweight[d] = static_cast<T>(dweight[d] + weight_sum[d - begin]);
      dbias[d] = static_cast<T>(dbias[d] + bias_sum[d - begin]);
    }
  });
}

template <typename T>
void rmsnorm_forward_impl(const T* x, const T* weight, double eps, int64_t rows, int64_t width,
                          T* y, T* rstd_out) {
  parallel_for(rows, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * width;
      double squares = 0;
      for (int64_t d = 0; d < width; ++d) squares += static_cast<double>(xr[d]) * xr[d];
      const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(width) + eps);
      rstd_out[r] = static_cast<T>(rstd);
      const T s = static_cast<T>(rstd);
      T* yr = y + r * width;
      for (int64_t d = 0; d < width; ++d) yr[d] = xr[d] * s * weight[d];
    }
  });
}

// dx = rstd · (g − x̂ · mean(g ⊙ x̂)) with g = dy ⊙ weight, x̂ = x · rstd.
template <typename T>
void rmsnorm_backward_impl(const T* dy, const T* x, const T* weight, const T* rstd_in, int64_t rows,
                           int64_t width, T* dx, T* dweight) {
  parallel_for(rows, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * width;
      const T* dyr = dy + r * width;
      const T s = rstd_in[r];
      double gx_sum = 0;
      for (int64_t d = 0; d < width; ++d)
        gx_sum += static_cast<double>(dyr[d]) * weight[d] * static_cast<double>(xr[d] * s);
      const T gx_mean = static_cast<T>(gx_sum / static_cast<double>(width));
      T* dxr = dx + r * width;
      for (int64_t d = 0; d < width; ++d) dxr[d] = s * (dyr[d] * weight[d] - xr[d] * s * gx_mean);
    }
  });
  parallel_for(width, column_grain(rows), [&](int64_t begin, int64_t end) {
    std::vector<double> weight_sum(static_cast<size_t>(end - begin), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * width;
      const T* dyr = dy + r * width;
      const T s = rstd_in[r];
      for (int64_t d = begin; d < end; ++d)
        weight_sum[d - begin] += static_cast<double>(dyr[d]) * static_cast<double>(xr[d] * s);
    }
    for (int64_t d = begin; d < end; ++d) dweight[d] = static_cast<T>(dweight[d] + weight_sum[d - begin]);
  });
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  const Rows rows = input_rows(x, op);
  const DType dtype = x.dtype();
  QV_CHECK(eps >= 0 && std::isfinite(eps), "{}: eps must be finite and non-negative, got {}", op, eps);
  check_vector(weight, rows.width, dtype, op, "weight");
  check_vector(bias, rows.width, dtype, op, "bias");
  check_same_shape(y, x, dtype, op, "y", "x");
  check_row_stats(mean, rows.count, dtype, op, "mean");
  check_row_stats(rstd, rows.count, dtype, op, "rstd");
  if (dtype == DType::F32)
    layernorm_forward_impl(x.data<float>(), weight.data<float>(), bias.data<float>(), eps,
                           rows.count, rows.width, y.data<float>(), mean.data<float>(),
                           rstd.data<float>());
  else
    layernorm_forward_impl(x.data<double>(), weight.data<double>(), bias.data<double>(), eps,
                           rows.count, rows.width, y.data<double>(), mean.data<double>(),
                           rstd.data<double>());
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx,
                        Tensor& dweight_accumulate, Tensor& dbias_accumulate) {
  const char* op = "layernorm_backward";
  const Rows rows = input_rows(x, op);
  const DType dtype = x.dtype();
  check_same_shape(dy, x, dtype, op, "dy", "x");
  check_vector(weight, rows.width, dtype, op, "weight");
  check_row_stats(mean, rows.count, dtype, op, "mean");
  check_row_stats(rstd, rows.count, dtype, op, "rstd");
  check_same_shape(dx, x, dtype, op, "dx", "x");
  check_vector(dweight_accumulate, rows.width, dtype, op, "dweight");
  check_vector(dbias_accumulate, rows.width, dtype, op, "dbias");
  if (dtype == DType::F32)
    layernorm_backward_impl(dy.data<float>(), x.data<float>(), weight.data<float>(),
                            mean.data<float>(), rstd.data<float>(), rows.count, rows.width,
                            dx.data<float>(), dweight_accumulate.data<float>(),
                            dbias_accumulate.data<float>());
  else
    layernorm_backward_impl(dy.data<double>(), x.data<double>(), weight.data<double>(),
                            mean.data<double>(), rstd.data<double>(), rows.count, rows.width,
                            dx.data<double>(), dweight_accumulate.data<double>(),
                            dbias_accumulate.data<double>());
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const Rows rows = input_rows(x, op);
  const DType dtype = x.dtype();
  QV_CHECK(eps >= 0 && std::isfinite(eps), "{}: eps must be finite and non-negative, got {}", op, eps);
  check_vector(weight, rows.width, dtype, op, "weight");
  check_same_shape(y, x, dtype, op, "y", "x");
  check_row_stats(rstd, rows.count, dtype, op, "rstd");
  if (dtype == DType::F32)
    rmsnorm_forward_impl(x.data<float>(), weight.data<float>(), eps, rows.count, rows.width,
                         y.data<float>(), rstd.data<float>());
  else
    rmsnorm_forward_impl(x.data<double>(), weight.data<double>(), eps, rows.count, rows.width,
                         y.data<double>(), rstd.data<double>());
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight_accumulate) {
  const char* op = "rmsnorm_backward";
  const Rows rows = input_rows(x, op);
  const DType dtype = x.dtype();
  check_same_shape(dy, x, dtype, op, "dy", "x");
  check_vector(weight, rows.width, dtype, op, "weight");
  check_row_stats(rstd, rows.count, dtype, op, "rstd");
  check_same_shape(dx, x, dtype, op, "dx", "x");
  check_vector(dweight_accumulate, rows.width, dtype, op, "dweight");
  if (dtype == DType::F32)
    rmsnorm_backward_impl(dy.data<float>(), x.data<float>(), weight.data<float>(),
                          rstd.data<float>(), rows.count, rows.width, dx.data<float>(),
                          dweight_accumulate.data<float>());
  else
    rmsnorm_backward_impl(dy.data<double>(), x.data<double>(), weight.data<double>(),
                          rstd.data<double>(), rows.count, rows.width, dx.data<double>(),
                          dweight_accumulate.data<double>());
}

}  // namespace quiver::ops
