// Timing helper: the GPU algebraic projection (cuda::AlgProj, law Q_q, cyclic row types)
// against one dense cuda::gemm of the same shape, at the SPEC §1.6 expansion shapes with the
// paper's q* (M = 2048 by default).
//
// Protocol (simplified from §1.6): bf16 operands and outputs, fp32 accumulation,
// preallocated outputs; warm runs (no cache flush, no CUDA graph); dense and algebraic trials
// alternate; each time is one cudaEvent pair around one call, and the row reports medians.
// Every timed configuration is checked: sampled rows of every type are recomputed on the host
// in double from the support table (the independent formula of SPEC §1.3).
// Needs a GPU; synchronizes the device (it is a benchmark).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace quiver::cuda {

struct AlgProjBenchOptions {
  int64_t M = 2048;
  int runs = 21;   // timed trials of each side (at least 20); medians are reported
  int warmup = 3;  // untimed calls of each side first
};

struct AlgProjBenchRow {
  std::string model;  // e.g. "Qwen3-8B"
  int64_t M = 0, K = 0, N = 0;
  int q = 0;
  double dense_us = 0;     // median of one dense bf16 GEMM [M,K]·[K,N]
  double alg_us = 0;       // median of one cuda::AlgProj::forward
  double speedup = 0;      // dense_us / alg_us
  double rel_error = 0;    // sampled rows vs the double-precision formula
  bool correct = false;    // rel_error within the bf16 bound (see algproj_bench.cpp)
};

std::vector<AlgProjBenchRow> bench_algproj_cuda(const AlgProjBenchOptions& options = {});

}  // namespace quiver::cuda
