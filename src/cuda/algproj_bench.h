// The algebraic-projection kernel benchmark of SPEC §1.6 on the GPU: cuda::AlgProj (law Q_q,
// cyclic row types, calibrated kernels) against dense bf16 GEMMs of the same shape.
//
// Protocol: bf16 operands and outputs, fp32 accumulation, preallocated outputs. Dense is the
// faster of cuBLAS (cublasGemmEx) and cuBLASLt (cuda::gemm) for that shape; the algebraic side
// is calibrated first (algproj.h), and the kernel it picked is reported. Both sides are timed
// as CUDA-graph replays, in alternating trials, and reported as medians: warm (a graph of
// `repeat` calls, so each call finds the previous one's data in L2 when it fits) and flushed
// (one call per replay, after writing a buffer twice the L2 size). Every timed configuration
// is checked against the independent formula of SPEC §1.3 in double precision on sampled rows
// (forward, dX) or sampled elements (dW).
//
// Floors: max(FLOPs / 790 TFLOP/s, bytes / 4.3 TB/s), with FLOPs = 2 · (the law's
// multiply-adds) and bytes = what the pass must move at least: its inputs, its output and
// the weight blocks the rows' types use (dW writes fp32).
// Needs a GPU; synchronizes the device (it is a benchmark).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace quiver::cuda {

struct AlgProjBenchOptions {
  std::vector<int64_t> M = {1, 32, 512, 2048};  // every shape; Qwen3-32B also 8192 and 32768
  std::vector<int> q;                           // empty: SPEC §1.6's grid (4..64, 32B to 256)
  bool paper_q_only = false;                    // only each shape's q* (Table 1)
  bool backward = true;     // dX and dW at M = 2048 with q* as well
  std::string model;        // only shapes whose name contains this ("" = all)
  int runs = 21;            // alternating trials per side (at least 5)
  // Also time the algebraic call's warm graph 30 ms after a dense one: a dense GEMM of
  // milliseconds leaves the GPU at a power-limited clock that takes tens of milliseconds to
  // recover, and the alternating trials, where the algebraic call follows dense at once, meet it
  // (bench/results/algproj-cuda-clocks-2026-12-06.md).
  bool clock_probe = false;
};

struct AlgProjBenchRow {
  std::string model;  // "Qwen3-8B"
  std::string pass;   // "forward", "dx", "dw"
  int64_t M = 0, K = 0, N = 0;
  int q = 0;
  std::string dense_kernel;  // "cublas" or "cublaslt"
  std::string alg_kernel;    // kernel_name() of the calibrated choice
  double dense_us = 0, alg_us = 0, speedup = 0;                  // warm medians
  double dense_flushed_us = 0, alg_flushed_us = 0, speedup_flushed = 0;
  double floor_us = 0;    // max(FLOPs / peak, bytes / bandwidth)
  double of_floor = 0;    // alg_us / floor_us
  double paper_speedup = 0;  // Table 1 (H200 NVL, warm), 0 where the paper has no entry
  double rel_error = 0;
  bool correct = false;
  double alg_after_idle_us = 0;  // clock_probe: median of the algebraic warm call 30 ms after dense
  // The least a call can take: an empty kernel launched as the algebraic ones are, timed as the
  // algebraic warm graph is (as many calls a graph, median per call). At M = 1 most floors are
  // below it.
  double launch_us = 0;
};

std::vector<AlgProjBenchRow> bench_algproj_cuda(const AlgProjBenchOptions& options = {});

}  // namespace quiver::cuda
