// bench_algproj_cuda (algproj_bench.h).
#include "cuda/algproj_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "algebra/law.h"
#include "cuda/algproj.h"
#include "cuda/algproj_launch.h"
#include "cuda/backend.h"
#include "cuda/bench_stats.h"
#include "cuda/check.h"
#include "cuda/gemm.h"
#include "quiver/dtype.h"
#include "quiver/error.h"

namespace quiver::cuda {
namespace {

using detail::median;

constexpr double kPeakFlops = 790e12;     // bf16 dense tensor-core peak (PERF.md)
constexpr double kPeakBandwidth = 4.3e12;  // HBM3e bytes/s (PERF.md)

struct Shape3 {
  const char* model;
  int64_t K, N;  // expansion (D, F): K = D input features, N = F output features
  int q_star;    // the paper's q* at M = 2048
};

// SPEC §1.6: expansion shapes and the q* of the M = 2048 warm speedups.
constexpr Shape3 kShapes[] = {
    {"Qwen3-1.7B", 2048, 6144, 32},          {"Qwen3-4B", 2560, 9728, 32},
    {"Qwen3-8B", 4096, 12288, 32},           {"Qwen3-30B-A3B expert", 2048, 768, 16},
    {"DeepSeek-V3 expert", 7168, 2048, 16},  {"Qwen3-32B", 5120, 25600, 32},
};

bool is_32b(const Shape3& s) { return std::strcmp(s.model, "Qwen3-32B") == 0; }

// Table 1 of the algebra paper (H200 NVL, warm speedup over dense at the listed q*).
double paper_speedup(const Shape3& s, int64_t M, int q) {
  if (M == 2048 && q == s.q_star) {
    const double v[] = {3.04, 3.14, 5.04, 1.57, 2.91, 5.06};
    return v[&s - kShapes];
  }
  if (is_32b(s) && M == 8192 && q == 128) return 8.33;
  if (is_32b(s) && M == 32768 && q == 256) return 11.51;
  return 0;
}

static_assert(sizeof(bf16) == 2, "bf16 values are copied from device bf16 buffers");

std::vector<bf16> rows_to_host(const uint16_t* dev, int64_t cols, const std::vector<int64_t>& rows) {
  std::vector<bf16> out(rows.size() * cols);
  for (size_t i = 0; i < rows.size(); ++i)
    QV_CUDA_CHECK(cudaMemcpy(out.data() + i * cols, dev + rows[i] * cols, cols * 2, cudaMemcpyDeviceToHost));
  return out;
}

std::vector<bf16> all_to_host(const uint16_t* dev, int64_t n) {
  std::vector<bf16> out(n);
  QV_CUDA_CHECK(cudaMemcpy(out.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  return out;
}

// One row of each of the types 0, 1, q/2, q−1 present, from the middle of the batch.
std::vector<int64_t> sample_rows(const std::vector<int>& types, int q) {
  std::vector<int64_t> rows;
  const int64_t M = static_cast<int64_t>(types.size());
  for (int a : {0, 1, q / 2, q - 1})
    for (int64_t m = M / 2; m < M + M / 2; ++m)
      if (types[m % M] == a) {
        if (std::find(rows.begin(), rows.end(), m % M) == rows.end()) rows.push_back(m % M);
        break;
      }
  return rows;
}

double rel(double num, double den) { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }

// CUDA-graph timing of one side.
struct Timed {
  cudaGraphExec_t warm = nullptr, single = nullptr;
  int repeat = 1;
  std::vector<float> warm_us, flushed_us;
};

cudaGraphExec_t capture(cudaStream_t stream, int repeat, const std::function<void()>& call) {
  cudaGraph_t g;
  QV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < repeat; ++r) call();
  QV_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  cudaGraphExec_t exec;
  QV_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  QV_CUDA_CHECK(cudaGraphDestroy(g));
  return exec;
}

class Bench {
 public:
  explicit Bench(const AlgProjBenchOptions& o) : o_(o) {
    QV_CUDA_CHECK(cudaStreamCreate(&stream_));
    QV_CUDA_CHECK(cudaEventCreate(&start_));
    QV_CUDA_CHECK(cudaEventCreate(&stop_));
    QV_CHECK(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS, "bench algproj: cublasCreate failed");
    QV_CHECK(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS, "bench algproj: cublasSetStream failed");
    int dev = 0, l2 = 0;
    QV_CUDA_CHECK(cudaGetDevice(&dev));
    QV_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    flush_bytes_ = 2 * static_cast<size_t>(l2);
    QV_CUDA_CHECK(cudaMalloc(&flush_, flush_bytes_));
  }
  ~Bench() {
    cudaFree(flush_);
    cublasDestroy(cublas_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  std::vector<AlgProjBenchRow> run();

 private:
  float time_graph(cudaGraphExec_t g, bool flush) {
    if (flush) QV_CUDA_CHECK(cudaMemsetAsync(flush_, flush_parity_++ & 1, flush_bytes_, stream_));
    QV_CUDA_CHECK(cudaEventRecord(start_, stream_));
    QV_CUDA_CHECK(cudaGraphLaunch(g, stream_));
    QV_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    QV_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1000.0f;
  }
  float time_eager(const std::function<void()>& call) {
    QV_CUDA_CHECK(cudaEventRecord(start_, stream_));
    call();
    QV_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    QV_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1000.0f;
  }
  // Times dense (the faster of two calls) against the algebraic call; fills the row's times.
  void compare(const std::function<void()>& cublas_call, const std::function<void()>& lt_call,
               const std::function<void()>& alg_call, AlgProjBenchRow& row);
  void cublas_gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const void* A,
                   int64_t lda, const void* B, int64_t ldb, void* C, cudaDataType c_type, int64_t ldc) {
    const float alpha = 1.0f, beta = 0.0f;
    QV_CHECK(cublasGemmEx(cublas_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, A,
                          CUDA_R_16BF, static_cast<int>(lda), B, CUDA_R_16BF, static_cast<int>(ldb), &beta, C, c_type,
                          static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS,
             "bench algproj: cublasGemmEx failed");
  }

  const AlgProjBenchOptions& o_;
  cudaStream_t stream_;
  cudaEvent_t start_, stop_;
  cublasHandle_t cublas_;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  int flush_parity_ = 0;
};

void Bench::compare(const std::function<void()>& cublas_call, const std::function<void()>& lt_call,
                    const std::function<void()>& alg_call, AlgProjBenchRow& row) {
  // Warm-up (cuBLAS and cuBLASLt plans exist before capture), then the faster dense library.
  for (int i = 0; i < 2; ++i) cublas_call(), lt_call(), alg_call();
  float t_cublas = 1e30f, t_lt = 1e30f;
  for (int i = 0; i < 3; ++i) {
    t_cublas = std::min(t_cublas, time_eager(cublas_call));
    t_lt = std::min(t_lt, time_eager(lt_call));
  }
  const bool use_lt = t_lt <= t_cublas;
  row.dense_kernel = use_lt ? "cublaslt" : "cublas";
  const std::function<void()>& dense_call = use_lt ? lt_call : cublas_call;
  const float t_alg = time_eager(alg_call);
  // A warm graph holds enough calls to last ~200 µs, so launch costs do not dominate.
  auto repeat_for = [](float us) { return std::clamp(static_cast<int>(std::ceil(200.0f / std::max(us, 1.0f))), 1, 64); };
  Timed sides[2];
  const std::function<void()>* calls[2] = {&dense_call, &alg_call};
  sides[0].repeat = repeat_for(use_lt ? t_lt : t_cublas);
  sides[1].repeat = repeat_for(t_alg);
  for (int s = 0; s < 2; ++s) {
    sides[s].warm = capture(stream_, sides[s].repeat, *calls[s]);
    sides[s].single = capture(stream_, 1, *calls[s]);
    time_graph(sides[s].warm, false);  // upload
  }
  for (int t = 0; t < o_.runs; ++t)
    for (Timed& s : sides) s.warm_us.push_back(time_graph(s.warm, false) / s.repeat);
  for (int t = 0; t < o_.runs; ++t)
    for (Timed& s : sides) s.flushed_us.push_back(time_graph(s.single, true));
  if (o_.clock_probe) {
    // Right after dense is the alternating trials' own state; this is the rested one.
    std::vector<float> after_idle;
    for (int t = 0; t < o_.runs; ++t) {
      time_graph(sides[0].warm, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      after_idle.push_back(time_graph(sides[1].warm, false) / sides[1].repeat);
    }
    row.alg_after_idle_us = median(after_idle);
  }
  for (Timed& s : sides) {
    QV_CUDA_CHECK(cudaGraphExecDestroy(s.warm));
    QV_CUDA_CHECK(cudaGraphExecDestroy(s.single));
  }
  // An empty dependent kernel in a graph of as many calls as the algebraic side's.
  cudaGraphExec_t empty = capture(stream_, sides[1].repeat, [&] { detail::launch_empty_dependent(stream_); });
  time_graph(empty, false);  // upload
  std::vector<float> empty_us;
  for (int t = 0; t < o_.runs; ++t) empty_us.push_back(time_graph(empty, false) / sides[1].repeat);
  QV_CUDA_CHECK(cudaGraphExecDestroy(empty));
  row.launch_us = median(empty_us);
  row.dense_us = median(sides[0].warm_us);
  row.alg_us = median(sides[1].warm_us);
  row.speedup = row.dense_us / row.alg_us;
  row.dense_flushed_us = median(sides[0].flushed_us);
  row.alg_flushed_us = median(sides[1].flushed_us);
  row.speedup_flushed = row.dense_flushed_us / row.alg_flushed_us;
}

std::vector<AlgProjBenchRow> Bench::run() {
  std::vector<AlgProjBenchRow> out;
  for (const Shape3& s : kShapes) {
    if (!o_.model.empty() && std::string(s.model).find(o_.model) == std::string::npos) continue;
    std::vector<int64_t> Ms = o_.M;
    if (is_32b(s) && o_.q.empty())
      for (int64_t m : {8192, 32768})
        if (std::find(Ms.begin(), Ms.end(), m) == Ms.end()) Ms.push_back(m);
    const int64_t K = s.K, N = s.N;
    for (int64_t M : Ms) {
      std::vector<int> qs = o_.q;
      if (qs.empty()) {
        if (o_.paper_q_only) {
          qs = {M == 8192 ? 128 : M == 32768 ? 256 : s.q_star};
        } else {
          qs = {4, 8, 16, 32, 64};
          if (is_32b(s)) qs.insert(qs.end(), {128, 256});
        }
      }
      const bool grads = o_.backward && M == 2048;
      Tensor x = Tensor::empty({M, K}, DType::BF16, Device::CUDA), w = Tensor::empty({K, N}, DType::BF16, Device::CUDA);
      Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA), y_dense = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
      auto* X = static_cast<uint16_t*>(x.raw());
      auto* W = static_cast<uint16_t*>(w.raw());
      detail::launch_fill_hashed_bf16(X, M * K, 1, 1.0f, stream_);
      detail::launch_fill_hashed_bf16(W, K * N, 2, static_cast<float>(1.0 / std::sqrt(double(K))), stream_);
      Tensor dy, dx, dw, dx_dense, dw_dense;
      if (grads) {
        dy = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
        dx = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
        dw = Tensor::empty({K, N}, DType::F32, Device::CUDA);
        dx_dense = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
        dw_dense = Tensor::empty({K, N}, DType::F32, Device::CUDA);
        detail::launch_fill_hashed_bf16(static_cast<uint16_t*>(dy.raw()), M * N, 3, 1.0f, stream_);
      }
      QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const std::vector<bf16> w_host = all_to_host(W, K * N);
      std::vector<bf16> x_all, dy_all;
      if (grads) {
        x_all = all_to_host(X, M * K);
        dy_all = all_to_host(static_cast<uint16_t*>(dy.raw()), M * N);
      }
      for (int q : qs) {
        if (q > K || q > N || K % q || N % q) continue;
        const algebra::Law law = algebra::Law::complete(q);
        const algebra::GroupWidths widths = algebra::GroupWidths::equal(q, K, N);
        const std::vector<int> types = algebra::Schedule::cyclic().types(0, M, q);
        const AlgProj alg(law, widths);
        const auto ko = widths.in_offsets(), no = widths.out_offsets();
        const int64_t s_w = K / q, r_w = N / q;
        // The law's multiply-adds and the weight blocks the present types use.
        double macs = 0;
        const std::vector<double> cost = algebra::type_costs(law, widths);
        std::vector<char> present(q, 0);
        for (int t : types) macs += cost[t], present[t] = 1;
        double w_blocks = 0;
        for (int b = 0; b < q; ++b)
          for (int d = 0; d < q; ++d) {
            bool used = false;
            for (int a = 0; a < q && !used; ++a) used = present[a] && law.contributes(a, b, d);
            w_blocks += used ? 1 : 0;
          }
        const double w_bytes = w_blocks * s_w * r_w * 2.0;
        auto base_row = [&](const char* pass) {
          AlgProjBenchRow row;
          row.model = s.model;
          row.pass = pass;
          row.M = M;
          row.K = K;
          row.N = N;
          row.q = q;
          return row;
        };
        auto floor_of = [&](double bytes) { return std::max(2.0 * macs / kPeakFlops, bytes / kPeakBandwidth) * 1e6; };

        // ---- forward ----
        {
          AlgProjBenchRow row = base_row("forward");
          compare([&] { cublas_gemm(CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, W, N, X, K, y_dense.raw(), CUDA_R_16BF, N); },
                  [&] { gemm(false, false, M, N, K, 1.0f, X, DType::BF16, K, W, DType::BF16, N, 0.0f, y_dense.raw(),
                             DType::BF16, N, stream_); },
                  [&] { alg.forward(x, w, types, y, stream_); }, row);
          row.alg_kernel = kernel_name(ops::AlgPass::Forward, alg.last_kernel(ops::AlgPass::Forward));
          row.floor_us = floor_of(w_bytes + 2.0 * M * (K + N));
          row.of_floor = row.alg_us / row.floor_us;
          row.paper_speedup = paper_speedup(s, M, q);
          const std::vector<int64_t> rows = sample_rows(types, q);
          const std::vector<bf16> xs = rows_to_host(X, K, rows), ys = rows_to_host(static_cast<uint16_t*>(y.raw()), N, rows);
          double num = 0, den = 0;
          std::vector<double> acc(N);
          for (size_t i = 0; i < rows.size(); ++i) {
            const int a = types[rows[i]];
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int d = 0; d < q; ++d)
              for (int b : law.support(a, d))
                for (int64_t k = ko[b]; k < ko[b + 1]; ++k) {
                  const double xv = bf16_to_float(xs[i * K + k]);
                  for (int64_t n = no[d]; n < no[d + 1]; ++n) acc[n] += xv * bf16_to_float(w_host[k * N + n]);
                }
            for (int64_t n = 0; n < N; ++n) {
              const double diff = bf16_to_float(ys[i * N + n]) - acc[n];
              num += diff * diff;
              den += acc[n] * acc[n];
            }
          }
          row.rel_error = rel(num, den);
          // bf16 output rounded once (2^-8 relative, two units allowed) plus fp32 accumulation
          // (≲ K·2^-24 relative for these sums): 2^-6 still fails any wrong block (error ~1).
          row.correct = std::isfinite(row.rel_error) && row.rel_error <= 1.0 / 64;
          out.push_back(row);
        }
        if (!grads || q != s.q_star) continue;

        // ---- dX = dY Wᵀ (masked) ----
        {
          AlgProjBenchRow row = base_row("dx");
          const auto* DY = static_cast<const uint16_t*>(dy.raw());
          compare([&] { cublas_gemm(CUBLAS_OP_T, CUBLAS_OP_N, K, M, N, W, N, DY, N, dx_dense.raw(), CUDA_R_16BF, K); },
                  [&] { gemm(false, true, M, K, N, 1.0f, DY, DType::BF16, N, W, DType::BF16, N, 0.0f, dx_dense.raw(),
                             DType::BF16, K, stream_); },
                  [&] { alg.backward(x, w, dy, types, &dx, nullptr, stream_); }, row);
          row.alg_kernel = kernel_name(ops::AlgPass::DX, alg.last_kernel(ops::AlgPass::DX));
          row.floor_us = floor_of(w_bytes + 2.0 * M * (K + N));
          row.of_floor = row.alg_us / row.floor_us;
          const std::vector<int64_t> rows = sample_rows(types, q);
          const std::vector<bf16> dxs = rows_to_host(static_cast<uint16_t*>(dx.raw()), K, rows);
          double num = 0, den = 0;
          for (size_t i = 0; i < rows.size(); ++i) {
            const int a = types[rows[i]];
            for (int b = 0; b < q; ++b)
              for (int64_t k = ko[b]; k < ko[b + 1]; ++k) {
                double acc = 0;
                for (int d = 0; d < q; ++d)
                  if (law.contributes(a, b, d))
                    for (int64_t n = no[d]; n < no[d + 1]; ++n)
                      acc += bf16_to_float(dy_all[rows[i] * N + n]) * bf16_to_float(w_host[k * N + n]);
                const double diff = bf16_to_float(dxs[i * K + k]) - acc;
                num += diff * diff;
                den += acc * acc;
              }
          }
          row.rel_error = rel(num, den);
          row.correct = std::isfinite(row.rel_error) && row.rel_error <= 1.0 / 64;
          out.push_back(row);
        }
        // ---- dW = Xᵀ dY (masked), fp32 ----
        {
          AlgProjBenchRow row = base_row("dw");
          const auto* DY = static_cast<const uint16_t*>(dy.raw());
          compare([&] { cublas_gemm(CUBLAS_OP_N, CUBLAS_OP_T, N, K, M, DY, N, X, K, dw_dense.raw(), CUDA_R_32F, N); },
                  [&] { gemm(true, false, K, N, M, 1.0f, X, DType::BF16, K, DY, DType::BF16, N, 0.0f, dw_dense.raw(),
                             DType::F32, N, stream_); },
                  [&] { alg.backward(x, w, dy, types, nullptr, &dw, stream_); }, row);
          row.alg_kernel = kernel_name(ops::AlgPass::DW, alg.last_kernel(ops::AlgPass::DW));
          row.floor_us = floor_of(2.0 * M * (K + N) + 4.0 * K * N);
          row.of_floor = row.alg_us / row.floor_us;
          std::vector<float> dw_host(K * N);
          QV_CUDA_CHECK(cudaMemcpy(dw_host.data(), dw.raw(), K * N * 4, cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          for (int e = 0; e < 512; ++e) {  // sampled elements, spread over blocks
            const int64_t k = (e * 7919) % K, n = (e * 104729 + e * e * 13) % N;
            const int b = static_cast<int>(k / s_w), d = static_cast<int>(n / r_w);
            double acc = 0;
            for (int64_t m = 0; m < M; ++m)
              if (law.contributes(types[m], b, d)) acc += bf16_to_float(x_all[m * K + k]) * bf16_to_float(dy_all[m * N + n]);
            const double diff = dw_host[k * N + n] - acc;
            num += diff * diff;
            den += acc * acc;
          }
          row.rel_error = rel(num, den);
          // fp32 output and accumulation over ≤ M exact products: ≲ M·2^-24 relative.
          row.correct = std::isfinite(row.rel_error) && row.rel_error <= 1.0 / 4096;
          out.push_back(row);
        }
      }
    }
  }
  return out;
}

}  // namespace

std::vector<AlgProjBenchRow> bench_algproj_cuda(const AlgProjBenchOptions& options) {
  QV_CHECK(device_count() > 0, "bench_algproj_cuda: no CUDA device");
  QV_CHECK(options.runs >= 5, "bench_algproj_cuda: runs = {} (at least 5)", options.runs);
  for (int64_t m : options.M) QV_CHECK(m > 0, "bench_algproj_cuda: M = {}", m);
  for (int q : options.q) QV_CHECK(q >= 1, "bench_algproj_cuda: q = {}", q);
  register_backend();
  Bench bench(options);
  return bench.run();
}

}  // namespace quiver::cuda
