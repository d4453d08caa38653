// Dense GEMMs on the GPU through cuBLASLt, and the dense linear layer built on them.
//
// Convention: ROW-MAJOR, as quiver::blas::gemm (src/core/blas.h):
//   C = act(alpha · op(A) · op(B) + beta · C + bias)
// op(A) is M×K, op(B) is K×N, C is M×N; lda/ldb/ldc are the row strides (in elements) of the
// stored matrices (A is stored M×K, or K×M when trans_a; B is stored K×N, or N×K when trans_b).
// bias (length N) is added to every row of C; act is the identity or GELU (tanh form).
// beta = 0 ignores C's old contents, NaN included. Only the M×N window of C is written.
//
// Types: the accumulation is fp32 (CUBLAS_COMPUTE_32F; never TF32). Supported operand/output
// combinations are those cuBLASLt offers for that compute type:
//   A, B bf16 -> C bf16 or fp32;   A, B fp32 -> C fp32.
// Epilogues: cuBLASLt fuses BIAS, GELU and GELU_BIAS (CUBLASLT_EPILOGUE_*) for these
// combinations with the bias in the type of C: its documented rule for non-fp8 kernels is
// "bias elements have C's type". A bias of the other type (fp32 bias with a bf16 C, bf16 bias
// with an fp32 C), or an epilogue for which the heuristic returns no algorithm, is not fused:
// the GEMM runs plain and a small kernel then adds the bias (and applies GELU) in fp32, rounding
// a bf16 C once more. Keep biases in C's type where speed matters.
//
// Descriptors and the chosen algorithm are cached per (device, shape, leading dims, types,
// transposes, epilogue, pointer alignments, batch and strides): a repeated call makes no
// heuristic query and allocates nothing. Before capturing a CUDA graph, run each GEMM once
// (warm-up) so that the context (context.h) exists and the capture only replays cached plans.
//
// Autotuning. The heuristic's first choice can be far from the best kernel (on an H200 it ran
// a [61440, 768] x [768, 50257] product at ~100 TFLOP/s), so the first call of a new plan asks
// for up to 8 candidates, runs each on `stream` (one untimed and two timed runs) and keeps the
// fastest. That first call synchronizes the host and, when beta ≠ 0, saves C's window in a
// temporary device buffer (cudaMalloc) and restores it after the timed runs; windows over
// 256 MiB with beta ≠ 0, plans built under stream capture, and all plans after
// set_gemm_autotune(false) or with QUIVER_GEMM_AUTOTUNE=0 in the environment keep the
// heuristic's first choice. Every later call launches on `stream` without synchronizing the
// host. The choice depends on timings, so two processes may run different kernels (the
// same product up to fp32 summation order).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "quiver/dtype.h"
#include "quiver/tensor.h"

namespace quiver::cuda {

enum class Epilogue : uint8_t { None, Bias, Gelu, BiasGelu };

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          DType a_type, int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C,
          DType c_type, int64_t ldc, cudaStream_t stream = 0);

// As gemm, with an epilogue. bias: device vector of N elements of bias_type (bf16 or fp32);
// null (and bias_type ignored) for Epilogue::None and Epilogue::Gelu.
void gemm_epilogue(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const void* A, DType a_type, int64_t lda, const void* B, DType b_type,
                   int64_t ldb, float beta, void* C, DType c_type, int64_t ldc, Epilogue epilogue,
                   const void* bias, DType bias_type, cudaStream_t stream = 0);

// Strided batched GEMM: for j < batch, member j is the product above with A + j·stride_a,
// B + j·stride_b, C + j·stride_c and bias + j·stride_bias (strides in elements; 0 shares an
// operand or the bias across the batch; stride_c ≥ M·ldc, so the outputs do not overlap). One
// cuBLASLt launch where cuBLASLt has an algorithm for it (the bias in C's type); otherwise one
// gemm_epilogue per member, with the same result.
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, DType a_type, int64_t lda, int64_t stride_a, const void* B,
                  DType b_type, int64_t ldb, int64_t stride_b, float beta, void* C, DType c_type,
                  int64_t ldc, int64_t stride_c, int64_t batch, Epilogue epilogue, const void* bias,
                  DType bias_type, int64_t stride_bias, cudaStream_t stream = 0);

// Autotuning of new plans (see above): on by default. Plans are cached per setting, so a
// benchmark can compare the heuristic's first choice with the timed one.
void set_gemm_autotune(bool enabled);
bool gemm_autotune_enabled();

// Number of cached GEMM plans (tests check that repeated shapes reuse their plan).
size_t gemm_plan_cache_size();

// Dense layer on the GPU, matching ops::linear_forward / linear_backward (src/ops/linear.h).
// Shapes: x [..., K] (rows N = all leading dims), w [K, N_out] (input × output), b [N_out] or
// undefined, y and dy [..., N_out]. All CUDA, contiguous. x, w, y, dy, dx bf16; b bf16 or fp32;
// dw fp32 [K, N_out]; db fp32 [N_out].

// y = x W + b (assigned; bf16 bias fused into the GEMM's epilogue).
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                    cudaStream_t stream = 0);

// dx = dy Wᵀ (assigned; skipped when dx is null), dw += xᵀ dy (fp32 accumulation into the fp32
// gradient), db += Σ_rows dy (fp32; skipped when db is null).
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor& dw_accumulate, Tensor* db_accumulate, cudaStream_t stream = 0);

}  // namespace quiver::cuda
