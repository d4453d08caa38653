// CPU GEMM through OpenBLAS (row-major). C = alpha · op(A) · op(B) + beta · C, where
// op(A) is M×K, op(B) is K×N, and lda/ldb/ldc are the row strides of the stored matrices.
#pragma once
#include <cstdint>

namespace quiver::blas {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);

void set_threads(int n);  // OpenBLAS's own thread count
int threads();

// Holds OpenBLAS at one thread for a scope: ops that call GEMMs from inside
// quiver::parallel_for use it so the two thread pools do not oversubscribe the cores.
class SingleThreadScope {
 public:
  SingleThreadScope() : saved_(threads()) {
    if (saved_ != 1) set_threads(1);
  }
  ~SingleThreadScope() {
    if (saved_ != 1) set_threads(saved_);
  }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int saved_;
};

}  // namespace quiver::blas
