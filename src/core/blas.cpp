#include "core/blas.h"

#include <cblas.h>

#include "quiver/error.h"

namespace quiver::blas {
namespace {
void check_dims(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
  QV_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M={} N={} K={}", M, N, K);
  QV_CHECK(lda >= 1 && ldb >= 1 && ldc >= 1, "gemm: leading dimensions must be positive");
  QV_CHECK(M < (1ll << 31) && N < (1ll << 31) && K < (1ll << 31) && lda < (1ll << 31) &&
               ldb < (1ll << 31) && ldc < (1ll << 31),
           "gemm: sizes beyond 32-bit BLAS indices");
}
}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_dims(M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  check_dims(M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

void set_threads(int n) { openblas_set_num_threads(n); }
int threads() { return openblas_get_num_threads(); }

}  // namespace quiver::blas
