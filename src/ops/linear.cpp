#include "ops/linear.h"

#include <algorithm>
#include <vector>

#include "core/blas.h"
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

void check_exact_shape(const Tensor& t, const Shape& expected, DType dtype, const char* op,
                       const char* name) {
  check_float_cpu(t, dtype, op, name);
  QV_CHECK(t.shape() == expected, "{}: {}: expected shape {}, got {}", op, name,
           shape_str(expected), shape_str(t.shape()));
}

// x [..., K] and W [K, N_out]: the GEMM sizes and the output shape [..., N_out].
struct Dims {
  int64_t rows, in_features, out_features;
  Shape out_shape;
};

Dims linear_dims(const Tensor& x, const Tensor& w, const char* op) {
  QV_CHECK(x.defined(), "{}: x is undefined", op);
  QV_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::F64, "{}: x must be F32 or F64, got {}",
           op, dtype_name(x.dtype()));
  check_float_cpu(x, x.dtype(), op, "x");
  check_float_cpu(w, x.dtype(), op, "w");
  QV_CHECK(w.ndim() == 2, "{}: w must be [K, N_out], got {}", op, shape_str(w.shape()));
  QV_CHECK(x.ndim() >= 1 && x.dim(-1) == w.dim(0),
           "{}: x must be [N, K] with K = {} (w is {}), got {}", op, w.dim(0),
           shape_str(w.shape()), shape_str(x.shape()));
  Dims dims;
  dims.in_features = w.dim(0);
  dims.out_features = w.dim(1);
  dims.rows = dims.in_features > 0 ? x.numel() / dims.in_features : 0;
  if (dims.in_features == 0) {
    int64_t leading = 1;
    for (int i = 0; i + 1 < x.ndim(); ++i) leading *= x.dim(i);
    dims.rows = leading;
  }
  dims.out_shape = x.shape();
  dims.out_shape.back() = dims.out_features;
  return dims;
}

template <typename T>
void forward_impl(const T* x, const T* w, const T* b, const Dims& d, T* y) {
  if (b) {
    parallel_for(d.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.out_features)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r)
                     std::copy_n(b, d.out_features, y + r * d.out_features);
                 });
  } else if (d.in_features == 0) {
    std::fill_n(y, d.rows * d.out_features, T(0));
  }
  if (d.in_features == 0) return;
  blas::gemm(false, false, d.rows, d.out_features, d.in_features, T(1), x, d.in_features, w,
             std::max<int64_t>(1, d.out_features), b ? T(1) : T(0), y,
             std::max<int64_t>(1, d.out_features));
}

template <typename T>
void backward_impl(const T* dy, const T* x, const T* w, const Dims& d, T* dx, T* dw, T* db) {
  const int64_t ld_out = std::max<int64_t>(1, d.out_features);
  const int64_t ld_in = std::max<int64_t>(1, d.in_features);
  if (dx) {
    if (d.out_features == 0)
      std::fill_n(dx, d.rows * d.in_features, T(0));
    else
      blas::gemm(false, true, d.rows, d.in_features, d.out_features, T(1), dy, ld_out, w, ld_out,
                 T(0), dx, ld_in);
  }
  if (d.rows > 0)
    blas::gemm(true, false, d.in_features, d.out_features, d.rows, T(1), x, ld_in, dy, ld_out,
               T(1), dw, ld_out);
  if (db) {
    // Column sums in double; each thread owns a column range and adds rows in order, so the
    // result does not depend on the thread count.
    parallel_for(d.out_features, std::max<int64_t>(8, 65536 / std::max<int64_t>(1, d.rows)),
                 [&](int64_t begin, int64_t end) {
                   std::vector<double> sums(static_cast<size_t>(end - begin), 0.0);
                   for (int64_t r = 0; r < d.rows; ++r) {
                     const T* row = dy + r * d.out_features;
                     for (int64_t c = begin; c < end; ++c) sums[c - begin] += row[c];
                   }
                   for (int64_t c = begin; c < end; ++c)
                     db[c] = static_cast<T>(db[c] + sums[c - begin]);
                 });
  }
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  const char* op = "linear_forward";
  const Dims dims = linear_dims(x, w, op);
  const DType dtype = x.dtype();
  if (b.defined()) check_exact_shape(b, {dims.out_features}, dtype, op, "b");
  check_exact_shape(y, dims.out_shape, dtype, op, "y");
  if (dtype == DType::F32)
    forward_impl(x.data<float>(), w.data<float>(), b.defined() ? b.data<float>() : nullptr, dims,
                 y.data<float>());
  else
    forward_impl(x.data<double>(), w.data<double>(), b.defined() ? b.data<double>() : nullptr,
                 dims, y.data<double>());
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor& dw_accumulate, Tensor* db_accumulate) {
  const char* op = "linear_backward";
  const Dims dims = linear_dims(x, w, op);
  const DType dtype = x.dtype();
  check_exact_shape(dy, dims.out_shape, dtype, op, "dy");
  if (dx) check_exact_shape(*dx, x.shape(), dtype, op, "dx");
  check_exact_shape(dw_accumulate, w.shape(), dtype, op, "dw");
  if (db_accumulate) check_exact_shape(*db_accumulate, {dims.out_features}, dtype, op, "db");
  if (dtype == DType::F32)
    backward_impl(dy.data<float>(), x.data<float>(), w.data<float>(), dims,
                  dx ? dx->data<float>() : nullptr, dw_accumulate.data<float>(),
                  db_accumulate ? db_accumulate->data<float>() : nullptr);
  else
    backward_impl(dy.data<double>(), x.data<double>(), w.data<double>(), dims,
                  dx ? dx->data<double>() : nullptr, dw_accumulate.data<double>(),
                  db_accumulate ? db_accumulate->data<double>() : nullptr);
}

}  // namespace quiver::ops
