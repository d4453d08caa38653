#include "ops/embedding.h"

#include <algorithm>
#include <vector>

#include "quiver/parallel.h"

namespace quiver::ops {
namespace {

void check_float_cpu(const Tensor& t, const char* op, const char* name) {
  QV_CHECK(t.defined(), "{}: {} is undefined", op, name);
  QV_CHECK(t.device() == Device::CPU && t.is_contiguous(),
           "{}: {} must be a contiguous CPU tensor (shape {})", op, name, shape_str(t.shape()));
  QV_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, "{}: {} must be F32 or F64, got {}",
           op, name, dtype_name(t.dtype()));
}

// The table is [V, D]; the rows tensor (out or dout) holds n rows of width D in any
// leading shape and the table's dtype.
void check_embedding_shapes(const char* op, int64_t n, const Tensor& table, const char* table_name,
                            const Tensor& rows, const char* rows_name) {
  QV_CHECK(n >= 0, "{}: token count must be non-negative, got {}", op, n);
  check_float_cpu(table, op, table_name);
  check_float_cpu(rows, op, rows_name);
  QV_CHECK(table.ndim() == 2, "{}: {} must be [V, D], got {}", op, table_name,
           shape_str(table.shape()));
  QV_CHECK(rows.dtype() == table.dtype(), "{}: {} has dtype {}, {} has {}", op, rows_name,
           dtype_name(rows.dtype()), table_name, dtype_name(table.dtype()));
  const int64_t width = table.dim(1);
  QV_CHECK(rows.ndim() >= 1 && rows.dim(-1) == width && rows.numel() == n * width,
           "{}: {} must hold {} rows of width {} (e.g. [{}, {}]), got {}", op, rows_name, n, width,
           n, width, shape_str(rows.shape()));
}

void check_tokens(const char* op, const int32_t* tokens, int64_t n, int64_t vocab) {
  QV_CHECK(n == 0 || tokens != nullptr, "{}: tokens is null but n = {}", op, n);
  for (int64_t i = 0; i < n; ++i)
    QV_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
             "{}: token id {} at position {} is outside the vocabulary [0, {})", op, tokens[i], i,
             vocab);
}

template <typename T>
void gather_rows(const int32_t* tokens, int64_t n, const T* table, int64_t width, T* out) {
  parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i)
                   std::copy_n(table + tokens[i] * width, width, out + i * width);
               });
}

// Positions grouped by token with a stable counting sort, so each vocabulary row is
// updated by one thread, adding its positions in increasing order.
template <typename T>
void scatter_add_rows(const int32_t* tokens, int64_t n, int64_t vocab, const T* dout, int64_t width,
                      T* dtable) {
  std::vector<int64_t> bucket_start(static_cast<size_t>(vocab) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++bucket_start[tokens[i] + 1];
  for (int64_t v = 0; v < vocab; ++v) bucket_start[v + 1] += bucket_start[v];
  std::vector<int64_t> positions(static_cast<size_t>(n));
  std::vector<int64_t> fill = bucket_start;
  for (int64_t i = 0; i < n; ++i) positions[fill[tokens[i]]++] = i;
  std::vector<int32_t> present;
  for (int64_t v = 0; v < vocab; ++v)
    if (bucket_start[v + 1] > bucket_start[v]) present.push_back(static_cast<int32_t>(v));

  const int64_t rows_per_token = std::max<int64_t>(1, n / std::max<int64_t>(1, present.size()));
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width * rows_per_token));
  parallel_for(static_cast<int64_t>(present.size()), grain, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int32_t v = present[k];
      T* row = dtable + static_cast<int64_t>(v) * width;
      for (int64_t p = bucket_start[v]; p < bucket_start[v + 1]; ++p) {
        const T* src = dout + positions[p] * width;
        for (int64_t d = 0; d < width; ++d) row[d] += src[d];
      }
    }
  });
}

}  // namespace

void embedding_forward(const int32_t* tokens, int64_t n, const Tensor& table, Tensor& out) {
  const char* op = "embedding_forward";
  check_embedding_shapes(op, n, table, "table", out, "out");
  check_tokens(op, tokens, n, table.dim(0));
  if (table.dtype() == DType::F32)
    gather_rows(tokens, n, table.data<float>(), table.dim(1), out.data<float>());
  else
    gather_rows(tokens, n, table.data<double>(), table.dim(1), out.data<double>());
}

void embedding_backward_accumulate(const int32_t* tokens, int64_t n, const Tensor& dout,
                                   Tensor& dtable) {
  const char* op = "embedding_backward";
  check_embedding_shapes(op, n, dtable, "dtable", dout, "dout");
  check_tokens(op, tokens, n, dtable.dim(0));
  if (dtable.dtype() == DType::F32)
    scatter_add_rows(tokens, n, dtable.dim(0), dout.data<float>(), dtable.dim(1),
                     dtable.data<float>());
  else
    scatter_add_rows(tokens, n, dtable.dim(0), dout.data<double>(), dtable.dim(1),
                     dtable.data<double>());
}

}  // namespace quiver::ops
