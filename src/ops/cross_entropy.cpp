#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "quiver/parallel.h"

namespace quiver::ops {
namespace {

// One row: loss = logsumexp(row) − row[target], with the max subtracted before exp and
// the sum in double. When grad is not null it receives factor · (softmax(row) − onehot):
// the shifted exponentials are stored there during the sum and rescaled afterwards, so
// each logit is exponentiated once.
template <typename T>
double row_loss(const T* logits, int64_t vocab, int32_t target, double factor, T* grad) {
  T max_logit = logits[0];
  for (int64_t j = 1; j < vocab; ++j) max_logit = std::max(max_logit, logits[j]);
  const double shift = static_cast<double>(max_logit);
  double sum = 0;
  if (grad) {
    for (int64_t j = 0; j < vocab; ++j) {
      const double e = std::exp(static_cast<double>(logits[j]) - shift);
      grad[j] = static_cast<T>(e);
      sum += e;
    }
    const T to_probability_scaled = static_cast<T>(factor / sum);
    for (int64_t j = 0; j < vocab; ++j) grad[j] *= to_probability_scaled;
    grad[target] = static_cast<T>(static_cast<double>(grad[target]) - factor);
  } else {
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(logits[j]) - shift);
  }
  // Shifted target logit first: shift + log(sum) would round log(sum) away for huge logits.
  return std::log(sum) - (static_cast<double>(logits[target]) - shift);
}

template <typename T>
double cross_entropy_impl(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                          int64_t counted, double scale, T* grad) {
  const double factor = counted > 0 ? scale / static_cast<double>(counted) : 0.0;
  std::vector<double> losses(static_cast<size_t>(rows), 0.0);
  parallel_for(rows, std::max<int64_t>(1, 16384 / vocab), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* grad_row = grad ? grad + r * vocab : nullptr;
      if (targets[r] < 0) {
        if (grad_row) std::fill_n(grad_row, vocab, T(0));
        continue;
      }
      losses[r] = row_loss(logits + r * vocab, vocab, targets[r], factor, grad_row);
    }
  });
  // Summed in row order, so the loss does not depend on the thread count.
  double total = 0;
  for (double loss : losses) total += loss;
  return counted > 0 ? total / static_cast<double>(counted) : 0.0;
}

}  // namespace

double cross_entropy_forward_backward(const Tensor& logits, const int32_t* targets, float scale,
                                      Tensor* dlogits) {
  const char* op = "cross_entropy";
  QV_CHECK(logits.defined(), "{}: logits is undefined", op);
  QV_CHECK(logits.device() == Device::CPU && logits.is_contiguous(),
           "{}: logits must be a contiguous CPU tensor (shape {})", op, shape_str(logits.shape()));
  QV_CHECK(logits.dtype() == DType::F32 || logits.dtype() == DType::F64,
           "{}: logits must be F32 or F64, got {}", op, dtype_name(logits.dtype()));
  QV_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0,
           "{}: logits must be [N, V] with V > 0, got {}", op, shape_str(logits.shape()));
  const int64_t vocab = logits.dim(-1);
  const int64_t rows = logits.numel() / vocab;
  QV_CHECK(rows == 0 || targets != nullptr, "{}: targets is null for {} rows", op, rows);
  if (dlogits) {
    QV_CHECK(dlogits->defined(), "{}: dlogits is undefined", op);
    QV_CHECK(dlogits->device() == Device::CPU && dlogits->is_contiguous(),
             "{}: dlogits must be a contiguous CPU tensor (shape {})", op,
             shape_str(dlogits->shape()));
    QV_CHECK(dlogits->dtype() == logits.dtype(), "{}: dlogits: expected dtype {} (as logits), got {}",
             op, dtype_name(logits.dtype()), dtype_name(dlogits->dtype()));
    QV_CHECK(dlogits->shape() == logits.shape(), "{}: dlogits: expected shape {} (as logits), got {}",
             op, shape_str(logits.shape()), shape_str(dlogits->shape()));
  }
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    QV_CHECK(targets[r] < vocab, "{}: target {} of row {} is outside the vocabulary [0, {})", op,
             targets[r], r, vocab);
    if (targets[r] >= 0) ++counted;
  }
  if (logits.dtype() == DType::F32)
    return cross_entropy_impl(logits.data<float>(), targets, rows, vocab, counted, scale,
                              dlogits ? dlogits->data<float>() : nullptr);
  return cross_entropy_impl(logits.data<double>(), targets, rows, vocab, counted, scale,
                            dlogits ? dlogits->data<double>() : nullptr);
}

}  // namespace quiver::ops
