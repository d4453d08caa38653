#include "cuda/gemm.h"

#include <algorithm>
#include <array>
#include <limits>
#include <atomic>
#include <cstdlib>
#include <string>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/gemm_launch.h"
#include "quiver/error.h"


namespace quiver::cuda {

namespace {
// On unless QUIVER_GEMM_AUTOTUNE=0.
std::atomic<bool> autotune{[] {
  const char* env = std::getenv("QUIVER_GEMM_AUTOTUNE");
  return !(env && std::string(env) == "0");
}()};
}  // namespace

void set_gemm_autotune(bool enabled) { autotune.store(enabled); }
bool gemm_autotune_enabled() { return autotune.load(); }

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
// The heuristic must be told, or it may pick a kernel that needs more alignment than a view has.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// Everything the heuristic's choice depends on.
struct PlanKey {
  std::array<int64_t, 24> v;
  bool operator==(const PlanKey& o) const { return v == o.v; }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t x : k.v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// A cached cuBLASLt problem: descriptors (cuBLASLt's column-major view) and the chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  // Unchecked: destroyed at exit, and a destructor must not throw.
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct PlanCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

struct Problem {
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc;
  DType a_type, b_type, c_type;
  cublasLtEpilogue_t epilogue;
  DType bias_type;  // meaningful when the epilogue has a bias
  const void *A, *B, *C, *bias;
  // Strided batch (batch 1: a single product); strides in elements, 0 shares an operand.
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0, stride_bias = 0;
};

bool has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS;
}

PlanKey key_of(const Problem& p, int device) {
  return PlanKey{{device, p.trans_a, p.trans_b, p.M, p.N, p.K, p.lda, p.ldb, p.ldc,
                  static_cast<int64_t>(p.a_type), static_cast<int64_t>(p.b_type),
                  static_cast<int64_t>(p.c_type), static_cast<int64_t>(p.epilogue),
                  has_bias(p.epilogue) ? static_cast<int64_t>(p.bias_type) : -1,
                  alignment_of(p.A), alignment_of(p.B), alignment_of(p.C),
                  has_bias(p.epilogue) ? alignment_of(p.bias) : 0, p.batch, p.stride_a,
                  p.stride_b, p.stride_c, has_bias(p.epilogue) ? p.stride_bias : 0,
                  gemm_autotune_enabled() ? 1 : 0}};
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  QV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

void set_batch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride) {
  const int32_t count = static_cast<int32_t>(batch);
  QV_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                   sizeof(count)));
  QV_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// The heuristic's best candidates for a plan whose descriptors are built.
constexpr int kCandidates = 8;

std::vector<cublasLtMatmulAlgo_t> candidates(const Problem& p, const Plan& plan, const Context& ctx,
                                             cublasStatus_t& status) {
  cublasLtMatmulPreference_t pref = nullptr;
  QV_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = ctx.workspace_bytes();
  const uint32_t align_lt_a = alignment_of(p.B), align_lt_b = alignment_of(p.A),
                 align_c = alignment_of(p.C);
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &align_lt_a, sizeof(align_lt_a));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &align_lt_b, sizeof(align_lt_b));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &align_c, sizeof(align_c));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &align_c, sizeof(align_c));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(ctx.lt(), plan.desc, plan.a, plan.b, plan.c, plan.c,
                                            pref, kCandidates, results, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (status != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < returned; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i].algo);
  return algos;
}

// The window of C a product touches, in bytes: what must be saved before timing candidates
// that accumulate into C.
size_t c_span_bytes(const Problem& p) {
  const int64_t elements = (p.batch - 1) * p.stride_c + (p.M - 1) * p.ldc + p.N;
  return static_cast<size_t>(elements) * (p.c_type == DType::BF16 ? 2 : 4);
}

// Larger windows of an accumulated C are not saved: such a plan keeps the heuristic's choice.
constexpr size_t kMaxSavedBytes = size_t{256} << 20;

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // the legacy stream during another stream's capture: do not time
    return true;
  }
  return capture != cudaStreamCaptureStatusNone;
}

// Runs every candidate once to warm up, then twice timed, on `stream`, and returns the index
// of the fastest. C is saved first and restored after when beta ≠ 0 (the runs accumulate
// into it); with beta = 0 the caller's own launch overwrites what the runs wrote. A candidate
// that fails to launch is skipped.
size_t fastest_candidate(const Problem& p, const Plan& plan, const std::vector<cublasLtMatmulAlgo_t>& algos,
                         const Context& ctx, float alpha, float beta, void* C, cudaStream_t stream) {
  void* saved = nullptr;
  const size_t span = c_span_bytes(p);
  if (beta != 0.0f) {
    QV_CUDA_CHECK(cudaStreamSynchronize(stream));
    QV_CUDA_CHECK(cudaMalloc(&saved, span));
    QV_CUDA_CHECK(cudaMemcpyAsync(saved, C, span, cudaMemcpyDeviceToDevice, stream));
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  QV_CUDA_CHECK(cudaEventCreate(&start));
  QV_CUDA_CHECK(cudaEventCreate(&stop));
  size_t best = 0;
  float best_ms = -1.0f;
  for (size_t i = 0; i < algos.size(); ++i) {
    auto launch = [&] {
      return cublasLtMatmul(ctx.lt(), plan.desc, &alpha, p.B, plan.a, p.A, plan.b, &beta, C, plan.c,
                            C, plan.c, &algos[i], ctx.workspace(), ctx.workspace_bytes(), stream);
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    QV_CUDA_CHECK(cudaEventRecord(start, stream));
    const bool ok = launch() == CUBLAS_STATUS_SUCCESS && launch() == CUBLAS_STATUS_SUCCESS;
    QV_CUDA_CHECK(cudaEventRecord(stop, stream));
    QV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (ok && (best_ms < 0.0f || ms < best_ms)) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (saved) {
    QV_CUDA_CHECK(cudaMemcpyAsync(C, saved, span, cudaMemcpyDeviceToDevice, stream));
    QV_CUDA_CHECK(cudaStreamSynchronize(stream));
    QV_CUDA_CHECK(cudaFree(saved));
  }
  return best;
}

// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's "A" is our B and its
// "B" is our A. A row-major r×c matrix with row stride ld is a column-major c×r matrix with
// leading dimension ld, so each operand keeps its transpose flag and swaps rows and columns.
// Null when cuBLASLt has no algorithm for the problem.
std::unique_ptr<Plan> build_plan(const Problem& p, const Context& ctx, float alpha, float beta, void* C,
                                 cudaStream_t stream) {
  auto plan = std::make_unique<Plan>();
  QV_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_lt_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue);
  if (has_bias(p.epilogue)) {
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
             static_cast<int32_t>(cuda_type(p.bias_type)));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);  // its alignment matters
    if (p.batch > 1) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, p.stride_bias);
  }
  // cuBLASLt's A = our B: column-major N×K (or K×N, transposed) with leading dimension ldb.
  QV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(p.b_type),
                                             static_cast<uint64_t>(p.trans_b ? p.K : p.N),
                                             static_cast<uint64_t>(p.trans_b ? p.N : p.K), p.ldb));
  // cuBLASLt's B = our A: column-major K×M (or M×K, transposed) with leading dimension lda.
  QV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(p.a_type),
                                             static_cast<uint64_t>(p.trans_a ? p.M : p.K),
                                             static_cast<uint64_t>(p.trans_a ? p.K : p.M), p.lda));
  // C and D: column-major N×M with leading dimension ldc.
  QV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(p.c_type),
                                             static_cast<uint64_t>(p.N), static_cast<uint64_t>(p.M),
                                             p.ldc));
  if (p.batch > 1) {
    set_batch(plan->a, p.batch, p.stride_b);
    set_batch(plan->b, p.batch, p.stride_a);
    set_batch(plan->c, p.batch, p.stride_c);
  }
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const std::vector<cublasLtMatmulAlgo_t> algos = candidates(p, *plan, ctx, status);
  if (algos.empty()) {
    // A fused epilogue or a batch cuBLASLt cannot do here: the caller runs another path.
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT || p.batch > 1) return nullptr;
    fail("gemm: cuBLASLt has no algorithm for M={} N={} K={} trans_a={} trans_b={} lda={} "
         "ldb={} ldc={} A {} B {} C {} epilogue {} ({}: {})",
         p.M, p.N, p.K, p.trans_a, p.trans_b, p.lda, p.ldb, p.ldc, dtype_name(p.a_type),
         dtype_name(p.b_type), dtype_name(p.c_type), static_cast<int>(p.epilogue),
         cublasLtGetStatusName(status), cublasLtGetStatusString(status));
  }
  size_t chosen = 0;
  if (algos.size() > 1 && gemm_autotune_enabled() && !stream_is_capturing(stream) &&
      (beta == 0.0f || c_span_bytes(p) <= kMaxSavedBytes))
    chosen = fastest_candidate(p, *plan, algos, ctx, alpha, beta, C, stream);
  plan->algo = algos[chosen];
  return plan;
}

// Launches the GEMM; false (nothing launched) when cuBLASLt has no algorithm for the problem's
// fused epilogue or batch. Such problems are cached as a null plan, so the answer is asked for
// once.
bool run_cublaslt(const Problem& p, float alpha, float beta, void* C, cudaStream_t stream) {
  Context& ctx = context();
  PlanCache& cache = plan_cache();
  // One lock for lookup and launch: the bias pointer is written into the shared descriptor.
  std::lock_guard<std::mutex> lock(cache.mutex);
  const PlanKey key = key_of(p, ctx.device());
  auto it = cache.plans.find(key);
  if (it == cache.plans.end())
    it = cache.plans.emplace(key, build_plan(p, ctx, alpha, beta, C, stream)).first;
  if (!it->second) return false;
  Plan& plan = *it->second;
  if (has_bias(p.epilogue)) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  QV_CUBLAS_CHECK(cublasLtMatmul(ctx.lt(), plan.desc, &alpha, p.B, plan.a, p.A, plan.b, &beta, C,
                                 plan.c, C, plan.c, &plan.algo, ctx.workspace(),
                                 ctx.workspace_bytes(), stream));
  return true;
}

void check_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A,
                     DType a_type, int64_t lda, const void* B, DType b_type, int64_t ldb,
                     const void* C, DType c_type, int64_t ldc, Epilogue epilogue,
                     const void* bias, DType bias_type) {
  QV_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M={} N={} K={}", M, N, K);
  QV_CHECK(a_type == b_type, "gemm: A and B must have one dtype (cuBLASLt has no mixed "
           "bf16/fp32 operands), got A {} B {}", dtype_name(a_type), dtype_name(b_type));
  QV_CHECK(a_type == DType::BF16 || a_type == DType::F32,
           "gemm: operands must be BF16 or F32, got {}", dtype_name(a_type));
  QV_CHECK(c_type == DType::F32 || (c_type == DType::BF16 && a_type == DType::BF16),
           "gemm: with {} operands C must be {}, got {}", dtype_name(a_type),
           a_type == DType::BF16 ? "BF16 or F32" : "F32", dtype_name(c_type));
  const int64_t a_width = trans_a ? M : K, b_width = trans_b ? K : N;
  QV_CHECK(lda >= std::max<int64_t>(1, a_width), "gemm: lda = {} < {} (A stored {}×{})", lda,
           std::max<int64_t>(1, a_width), trans_a ? K : M, a_width);
  QV_CHECK(ldb >= std::max<int64_t>(1, b_width), "gemm: ldb = {} < {} (B stored {}×{})", ldb,
           std::max<int64_t>(1, b_width), trans_b ? N : K, b_width);
  QV_CHECK(ldc >= std::max<int64_t>(1, N), "gemm: ldc = {} < {} (C is {}×{})", ldc,
           std::max<int64_t>(1, N), M, N);
  if (M > 0 && N > 0) {
    QV_CHECK(C != nullptr, "gemm: C is null");
    QV_CHECK(K == 0 || (A != nullptr && B != nullptr), "gemm: A or B is null");
  }
  if (epilogue == Epilogue::Bias || epilogue == Epilogue::BiasGelu) {
    QV_CHECK(bias != nullptr || N == 0, "gemm: the bias epilogue needs a bias");
    QV_CHECK(bias_type == DType::BF16 || bias_type == DType::F32,
             "gemm: bias must be BF16 or F32, got {}", dtype_name(bias_type));
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          DType a_type, int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C,
          DType c_type, int64_t ldc, cudaStream_t stream) {
  gemm_epilogue(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type,
                ldc, Epilogue::None, nullptr, DType::F32, stream);
}

void gemm_epilogue(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const void* A, DType a_type, int64_t lda, const void* B, DType b_type,
                   int64_t ldb, float beta, void* C, DType c_type, int64_t ldc, Epilogue epilogue,
                   const void* bias, DType bias_type, cudaStream_t stream) {
  check_gemm_args(trans_a, trans_b, M, N, K, A, a_type, lda, B, b_type, ldb, C, c_type, ldc,
                  epilogue, bias, bias_type);
  if (M == 0 || N == 0) return;
  const bool with_bias = epilogue == Epilogue::Bias || epilogue == Epilogue::BiasGelu;
  const bool with_gelu = epilogue == Epilogue::Gelu || epilogue == Epilogue::BiasGelu;
  const bool c_bf16 = c_type == DType::BF16;
  const bool bias_bf16 = bias_type == DType::BF16;
  if (K == 0) {  // the product is empty: C = act(beta·C + bias); cuBLASLt is not asked
    detail::launch_bias_act(C, c_bf16, M, N, ldc, beta, with_bias ? bias : nullptr, bias_bf16,
                            with_gelu, stream);
    return;
  }
  // cuBLASLt fuses a bias only in C's type; another bias type, or an epilogue for which the
  // heuristic finds no algorithm, is applied by a second pass over C.
  if (epilogue != Epilogue::None && (!with_bias || bias_type == c_type)) {
    const cublasLtEpilogue_t fused = with_bias && with_gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                     : with_bias            ? CUBLASLT_EPILOGUE_BIAS
                                                            : CUBLASLT_EPILOGUE_GELU;
    const Problem problem{trans_a, trans_b, M, N, K, lda, ldb, ldc, a_type, b_type, c_type,
                          fused, bias_type, A, B, C, with_bias ? bias : nullptr};
    if (run_cublaslt(problem, alpha, beta, C, stream)) return;
  }
  const Problem plain{trans_a, trans_b, M, N, K, lda, ldb, ldc, a_type, b_type, c_type,
                      CUBLASLT_EPILOGUE_DEFAULT, bias_type, A, B, C, nullptr};
  run_cublaslt(plain, alpha, beta, C, stream);
  if (epilogue != Epilogue::None)
    detail::launch_bias_act(C, c_bf16, M, N, ldc, 1.0f, with_bias ? bias : nullptr, bias_bf16,
                            with_gelu, stream);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, DType a_type, int64_t lda, int64_t stride_a, const void* B,
                  DType b_type, int64_t ldb, int64_t stride_b, float beta, void* C, DType c_type,
                  int64_t ldc, int64_t stride_c, int64_t batch, Epilogue epilogue, const void* bias,
                  DType bias_type, int64_t stride_bias, cudaStream_t stream) {
  QV_CHECK(batch >= 1, "gemm_batched: batch must be ≥ 1, got {}", batch);
  QV_CHECK(batch <= std::numeric_limits<int32_t>::max(), "gemm_batched: batch {} is too large", batch);
  QV_CHECK(stride_a >= 0 && stride_b >= 0 && stride_bias >= 0,
           "gemm_batched: strides must be non-negative, got A {} B {} bias {}", stride_a, stride_b,
           stride_bias);
  QV_CHECK(batch == 1 || stride_c >= M * ldc,
           "gemm_batched: stride_c = {} < M·ldc = {}: the outputs of the batch would overlap",
           stride_c, M * ldc);
  check_gemm_args(trans_a, trans_b, M, N, K, A, a_type, lda, B, b_type, ldb, C, c_type, ldc,
                  epilogue, bias, bias_type);
  const bool with_bias = epilogue == Epilogue::Bias || epilogue == Epilogue::BiasGelu;
  const bool with_gelu = epilogue == Epilogue::Gelu || epilogue == Epilogue::BiasGelu;
  const size_t a_size = a_type == DType::BF16 ? 2 : 4, c_size = c_type == DType::BF16 ? 2 : 4;
  const size_t bias_size = bias_type == DType::BF16 ? 2 : 4;
  // One product per member, through the unbatched path (its epilogue fallbacks included).
  auto each = [&] {
    for (int64_t j = 0; j < batch; ++j)
      gemm_epilogue(trans_a, trans_b, M, N, K, alpha, static_cast<const char*>(A) + j * stride_a * a_size,
                    a_type, lda, static_cast<const char*>(B) + j * stride_b * a_size, b_type, ldb, beta,
                    static_cast<char*>(C) + j * stride_c * c_size, c_type, ldc, epilogue,
                    with_bias ? static_cast<const char*>(bias) + j * stride_bias * bias_size : nullptr,
                    bias_type, stream);
  };
  if (batch == 1 || M == 0 || N == 0 || K == 0 || (with_bias && bias_type != c_type)) {
    each();
    return;
  }
  const cublasLtEpilogue_t fused = with_bias && with_gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                   : with_bias            ? CUBLASLT_EPILOGUE_BIAS
                                   : with_gelu            ? CUBLASLT_EPILOGUE_GELU
                                                          : CUBLASLT_EPILOGUE_DEFAULT;
  Problem problem{trans_a, trans_b, M, N, K, lda, ldb, ldc, a_type, b_type, c_type,
                  fused, bias_type, A, B, C, with_bias ? bias : nullptr};
  problem.batch = batch;
  problem.stride_a = stride_a;
  problem.stride_b = stride_b;
  problem.stride_c = stride_c;
  problem.stride_bias = with_bias ? stride_bias : 0;
  if (!run_cublaslt(problem, alpha, beta, C, stream)) each();
}

size_t gemm_plan_cache_size() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.plans.size();
}

// ---- dense linear layer ----

namespace {

void check_cuda_tensor(const Tensor& t, const char* op, const char* name) {
  QV_CHECK(t.defined(), "{}: {} is undefined", op, name);
  QV_CHECK(t.device() == Device::CUDA && t.is_contiguous(),
           "{}: {} must be a contiguous CUDA tensor (shape {}, device {})", op, name,
           shape_str(t.shape()), device_name(t.device()));
}

void check_exact(const Tensor& t, const Shape& shape, DType dtype, const char* op,
                 const char* name) {
  check_cuda_tensor(t, op, name);
  QV_CHECK(t.dtype() == dtype, "{}: {}: expected dtype {}, got {}", op, name, dtype_name(dtype),
           dtype_name(t.dtype()));
  QV_CHECK(t.shape() == shape, "{}: {}: expected shape {}, got {}", op, name, shape_str(shape),
           shape_str(t.shape()));
}

// x [..., K] and W [K, N_out]: GEMM sizes and the output shape [..., N_out].
struct LinearDims {
  int64_t rows, in_features, out_features;
  Shape out_shape;
};

LinearDims linear_dims(const Tensor& x, const Tensor& w, const char* op) {
  check_cuda_tensor(x, op, "x");
  check_cuda_tensor(w, op, "w");
  QV_CHECK(x.dtype() == DType::BF16, "{}: x must be BF16, got {}", op, dtype_name(x.dtype()));
  QV_CHECK(w.dtype() == DType::BF16, "{}: w must be BF16, got {}", op, dtype_name(w.dtype()));
  QV_CHECK(w.ndim() == 2, "{}: w must be [K, N_out], got {}", op, shape_str(w.shape()));
  QV_CHECK(x.ndim() >= 1 && x.dim(-1) == w.dim(0),
           "{}: x must be [N, K] with K = {} (w is {}), got {}", op, w.dim(0),
           shape_str(w.shape()), shape_str(x.shape()));
  LinearDims d;
  d.in_features = w.dim(0);
  d.out_features = w.dim(1);
  d.rows = 1;
  for (int i = 0; i + 1 < x.ndim(); ++i) d.rows *= x.dim(i);
  d.out_shape = x.shape();
  d.out_shape.back() = d.out_features;
  return d;
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                    cudaStream_t stream) {
  const char* op = "cuda::linear_forward";
  const LinearDims d = linear_dims(x, w, op);
  if (b.defined()) {
    check_cuda_tensor(b, op, "b");
    QV_CHECK(b.dtype() == DType::BF16 || b.dtype() == DType::F32,
             "{}: b must be BF16 or F32, got {}", op, dtype_name(b.dtype()));
    QV_CHECK(b.shape() == Shape{d.out_features}, "{}: b: expected shape {}, got {}", op,
             shape_str({d.out_features}), shape_str(b.shape()));
  }
  check_exact(y, d.out_shape, DType::BF16, op, "y");
  const int64_t ld_in = std::max<int64_t>(1, d.in_features);
  const int64_t ld_out = std::max<int64_t>(1, d.out_features);
  gemm_epilogue(false, false, d.rows, d.out_features, d.in_features, 1.0f, x.raw(), DType::BF16,
                ld_in, w.raw(), DType::BF16, ld_out, 0.0f, y.raw(), DType::BF16, ld_out,
                b.defined() ? Epilogue::Bias : Epilogue::None, b.defined() ? b.raw() : nullptr,
                b.defined() ? b.dtype() : DType::F32, stream);
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor& dw_accumulate, Tensor* db_accumulate, cudaStream_t stream) {
  const char* op = "cuda::linear_backward";
  const LinearDims d = linear_dims(x, w, op);
  check_exact(dy, d.out_shape, DType::BF16, op, "dy");
  if (dx) check_exact(*dx, x.shape(), DType::BF16, op, "dx");
  check_exact(dw_accumulate, w.shape(), DType::F32, op, "dw");
  if (db_accumulate) check_exact(*db_accumulate, {d.out_features}, DType::F32, op, "db");
  const int64_t ld_in = std::max<int64_t>(1, d.in_features);
  const int64_t ld_out = std::max<int64_t>(1, d.out_features);
  // dx [N, K] = dy [N, N_out] · Wᵀ (W stored [K, N_out]).
  if (dx)
    gemm(false, true, d.rows, d.in_features, d.out_features, 1.0f, dy.raw(), DType::BF16, ld_out,
         w.raw(), DType::BF16, ld_out, 0.0f, dx->raw(), DType::BF16, ld_in, stream);
  // dw [K, N_out] += xᵀ (x stored [N, K]) · dy.
  gemm(true, false, d.in_features, d.out_features, d.rows, 1.0f, x.raw(), DType::BF16, ld_in,
       dy.raw(), DType::BF16, ld_out, 1.0f, dw_accumulate.raw(), DType::F32, ld_out, stream);
  if (db_accumulate)
    detail::launch_column_sum_accumulate(static_cast<const uint16_t*>(dy.raw()), d.rows,
                                         d.out_features, ld_out,
                                         static_cast<float*>(db_accumulate->raw()), stream);
}

}  // namespace quiver::cuda
