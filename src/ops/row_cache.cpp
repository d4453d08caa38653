#include "ops/row_cache.h"

#include <algorithm>

#include "quiver/error.h"

namespace quiver::ops::detail {

namespace {
// Copies n rows per sequence of [B, n, H, Dh] data into rows [length, length + n) of a
// [B, capacity, H, Dh] cache tensor.
void copy_rows(Tensor& cache, int64_t length, const Tensor& rows, int64_t n) {
  const int64_t B = cache.dim(0), cap = cache.dim(1), row = cache.dim(2) * cache.dim(3);
  const size_t es = dtype_size(cache.dtype());
  const char* src = static_cast<const char*>(rows.raw());
  char* dst = static_cast<char*>(cache.raw());
  for (int64_t b = 0; b < B; ++b)
    std::copy(src + b * n * row * es, src + (b + 1) * n * row * es,
              dst + (b * cap + length) * row * es);
}
}  // namespace

void allocate_row_pair(const char* cache, int64_t batch, int64_t capacity, int64_t heads,
                       int64_t head_dim, DType dtype, Tensor& first, Tensor& second) {
  QV_CHECK(batch >= 1 && capacity >= 1 && heads >= 1 && head_dim >= 1,
           "{}: batch, capacity, heads and head_dim must be positive, got {}, {}, {}, {}", cache,
           batch, capacity, heads, head_dim);
  QV_CHECK(dtype == DType::F32 || dtype == DType::F64, "{}: dtype must be F32 or F64, got {}",
           cache, dtype_name(dtype));
  first = Tensor::zeros({batch, capacity, heads, head_dim}, dtype);
  second = Tensor::zeros({batch, capacity, heads, head_dim}, dtype);
}

int64_t append_row_pair(const char* cache, Tensor& first, Tensor& second, int64_t length,
                        const Tensor& first_rows, const Tensor& second_rows, const char* first_name,
                        const char* second_name) {
  QV_CHECK(first.defined(), "{}: append to a cache that was never sized", cache);
  const int64_t B = first.dim(0), capacity = first.dim(1), H = first.dim(2), Dh = first.dim(3);
  check_cpu_contiguous(first_rows, first_name);
  check_dtype(first_rows, first.dtype(), first_name);
  QV_CHECK(first_rows.ndim() == 4 || (first_rows.ndim() == 3 && B == 1),
           "{}: expected shape [B, n, H, Dh] (or [n, H, Dh] when B = 1), got {}", first_name,
           shape_str(first_rows.shape()));
  const int64_t n = first_rows.dim(-3);
  check_shape(first_rows, first_rows.ndim() == 4 ? Shape{B, n, H, Dh} : Shape{n, H, Dh},
              first_name);
  check_cpu_contiguous(second_rows, second_name);
  check_dtype(second_rows, first.dtype(), second_name);
  check_shape(second_rows, first_rows.shape(), second_name);
  QV_CHECK(length + n <= capacity, "{}: appending {} rows to {} exceeds the capacity {}", cache, n,
           length, capacity);
  copy_rows(first, length, first_rows, n);
  copy_rows(second, length, second_rows, n);
  return length + n;
}

int64_t append_single_row_pair(const char* cache, Tensor& first, Tensor& second, int64_t length,
                               const Tensor& first_row, const Tensor& second_row,
                               const char* first_name, const char* second_name) {
  QV_CHECK(first.defined(), "{}: append to a cache that was never sized", cache);
  const Shape row{first.dim(0), first.dim(2), first.dim(3)};
  for (auto [t, name] : {std::pair{&first_row, first_name}, {&second_row, second_name}}) {
    check_cpu_contiguous(*t, name);
    check_dtype(*t, first.dtype(), name);
    check_shape(*t, row, name);
  }
  const Shape rows{row[0], 1, row[1], row[2]};
  return append_row_pair(cache, first, second, length, first_row.reshape(rows),
                         second_row.reshape(rows), first_name, second_name);
}

}  // namespace quiver::ops::detail
