// TMA streaming probe: how fast can one multiprocessor's ring of TMA boxes stream a bf16 matrix
// from DRAM or L2, with no products? The algebraic projection's TMA row pass reads W in chunks of
// 64 rows × 64·P columns (P boxes of 64 × 128 bytes, one per 64-column panel, 128-byte swizzle)
// through a ring of S stages; this probe runs the same loads and nothing else, so its rate is the
// ceiling the row pass's W stream can reach at that ring depth (docs/decisions.md).
//
// Each of G persistent blocks (one producer warp whose lane 0 issues, one consumer warp that waits
// on each stage and releases it) walks chunks b, b + G, ...; chunk c is rows 64 (c mod K/64) of
// column strip c div (K/64), so consecutive chunks go down a strip, as a tile's reduction does.
// A second walk runs clusters of C blocks that multicast each chunk's panels to all C (the
// probe of W_δδ multicast across classes). Results: bench/results/tma-stream-2026-12-03.txt.
// Printed: per configuration, µs per pass over the matrix (median of 9 after 2 warm passes),
// TB/s, and KB/µs per multiprocessor.
//
// Built with the CUDA backend as build/bin/quiver_tma_stream; run it on a GPU with TMA (sm_90).
#include <cuda.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "cuda/check.h"
#include "cuda/tma.cuh"
#include "cuda/tma.h"

namespace {

using namespace quiver::cuda::detail;
using quiver::cuda::tma_map_bf16;


struct Args {
  CUtensorMap map;
  int strips, row_chunks, chunks, passes;  // the walk covers the matrix `passes` times
};

template <int R, int P, int S>
__global__ void __launch_bounds__(64, 1) stream_kernel(const __grid_constant__ Args a) {
  constexpr int kBoxBytes = R * 128;
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* ring = raw + (1024 - smem_addr(raw) % 1024) % 1024;
  auto* full = reinterpret_cast<uint64_t*>(ring + S * P * kBoxBytes);
  uint64_t* empty = full + S;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      tma::init(&full[s], 1);
      tma::init(&empty[s], 1);
    }
    tma::fence_init();
  }
  __syncthreads();
  const int n = (a.chunks * a.passes - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  if (threadIdx.x == 0) {  // the producer
    for (int i = 0; i < n; ++i) {
      const int s = i % S, c = (static_cast<int>(blockIdx.x) + i * static_cast<int>(gridDim.x)) % a.chunks;
      if (i >= S) tma::wait(&empty[s], ((i / S) & 1) ^ 1);
      tma::arrive_expect(&full[s], P * kBoxBytes);
      const int r0 = (c % a.row_chunks) * R, c0 = (c / a.row_chunks) * 64 * P;
#pragma unroll
      for (int p = 0; p < P; ++p) tma::load_2d(ring + (s * P + p) * kBoxBytes, &a.map, &full[s], c0 + 64 * p, r0);
    }
  } else if (threadIdx.x == 32) {  // the consumer
    for (int i = 0; i < n; ++i) {
      tma::wait(&full[i % S], (i / S) & 1);
      tma::arrive(&empty[i % S]);
    }
  }
}

// The median of 9 timed launches after 2 warm ones, in µs.
template <typename Launch>
double median_us(Launch launch) {
  cudaEvent_t e0, e1;
  QV_CUDA_CHECK(cudaEventCreate(&e0));
  QV_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int rep = 0; rep < 11; ++rep) {
    QV_CUDA_CHECK(cudaEventRecord(e0));
    launch();
    QV_CUDA_CHECK(cudaEventRecord(e1));
    QV_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep >= 2) us.push_back(ms * 1000.0f);
  }
  QV_CUDA_CHECK(cudaGetLastError());
  QV_CUDA_CHECK(cudaEventDestroy(e0));
  QV_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Multicast: clusters of C blocks walk the chunks together (cluster g takes chunks g, g + G / C,
// ...); every block receives every chunk's P panels, rank r issuing the panels p ≡ r (mod C) to
// all C. A block's stage is free once all C blocks have released it (each consumer arrives on
// every block's empty barrier), since its peers write into it. L2 is read once per chunk and
// C blocks receive it: whether that raises the rate a block receives W at is the question.
template <int P, int S, int C>
__global__ void __launch_bounds__(64, 1) multicast_kernel(const __grid_constant__ Args a) {
  namespace cg = cooperative_groups;
  constexpr int kBoxBytes = 64 * 128;
  extern __shared__ __align__(16) unsigned char raw[];
  unsigned char* ring = raw + (1024 - smem_addr(raw) % 1024) % 1024;
  auto* full = reinterpret_cast<uint64_t*>(ring + S * P * kBoxBytes);
  uint64_t* empty = full + S;
  const auto cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      tma::init(&full[s], 1);
      tma::init(&empty[s], C);
    }
    tma::fence_init();
  }
  cluster.sync();  // every block's barriers initialized before any multicast reaches them
  const int g = static_cast<int>(blockIdx.x) / C, clusters = static_cast<int>(gridDim.x) / C;
  const int n = (a.chunks * a.passes - g + clusters - 1) / clusters;
  if (threadIdx.x == 0) {  // the producer
    for (int i = 0; i < n; ++i) {
      const int s = i % S, c = (g + i * clusters) % a.chunks;
      if (i >= S) tma::wait(&empty[s], ((i / S) & 1) ^ 1);
      tma::arrive_expect(&full[s], P * kBoxBytes);
      const int r0 = (c % a.row_chunks) * 64, c0 = (c / a.row_chunks) * 64 * P;
#pragma unroll
      for (int p = rank; p < P; p += C)
        tma::load_2d_multicast(ring + (s * P + p) * kBoxBytes, &a.map, &full[s], c0 + 64 * p, r0, (1u << C) - 1);
    }
  } else if (threadIdx.x == 32) {  // the consumer
    for (int i = 0; i < n; ++i) {
      tma::wait(&full[i % S], (i / S) & 1);
#pragma unroll
      for (int r = 0; r < C; ++r) tma::arrive_cluster(&empty[i % S], static_cast<uint32_t>(r));
    }
  }
  cluster.sync();  // no block leaves while a peer may still write into it or arrive on it
}

template <int P, int S, int C>
void run_multicast(const char* what, const void* base, int rows, int cols, int passes, int sms) {
  constexpr int kBoxBytes = 64 * 128;
  Args a{tma_map_bf16(base, rows, cols, cols, 64, 64), cols / (64 * P), rows / 64, 0, passes};
  a.chunks = a.strips * a.row_chunks;
  const size_t smem = 1024 + size_t(S) * P * kBoxBytes + 2 * S * sizeof(uint64_t);
  auto* kernel = multicast_kernel<P, S, C>;
  QV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = C;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.blockDim = dim3(64);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(sms / C * C));
  int fit = 0;  // clusters resident at once: a GPC's multiprocessors need not divide by C
  QV_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg));
  cfg.gridDim = dim3(static_cast<unsigned>(std::min(fit, sms / C) * C));
  const double t = median_us([&] { QV_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a)); });
  const int blocks = static_cast<int>(cfg.gridDim.x);
  const double read = double(a.chunks) * a.passes * P * kBoxBytes, got = read * C;
  std::printf("%-6s multicast C=%d P=%d S=%d blocks=%3d  in flight %4zu KB/SM  %9.1f us  read %5.2f TB/s  received %5.2f "
              "TB/s  %5.1f KB/us/SM\n",
              what, C, P, S, blocks, size_t(S) * P * kBoxBytes / 1024, t, read / t / 1e6, got / t / 1e6,
              got / t / blocks / 1024);
}

template <int R, int P, int S>
void run(const char* what, const void* base, int rows, int cols, int passes, int per_sm, int sms) {
  constexpr int kBoxBytes = R * 128;
  Args a{tma_map_bf16(base, rows, cols, cols, R, 64), cols / (64 * P), rows / R, 0, passes};
  a.chunks = a.strips * a.row_chunks;
  const size_t smem = 1024 + size_t(S) * P * kBoxBytes + 2 * S * sizeof(uint64_t);
  QV_CUDA_CHECK(cudaFuncSetAttribute(stream_kernel<R, P, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int fit = 0;
  QV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, stream_kernel<R, P, S>, 64, smem));
  if (fit < per_sm) {
    std::printf("%-6s R=%3d P=%d S=%2d blocks/SM=%d  does not fit\n", what, R, P, S, per_sm);
    return;
  }
  const int grid = per_sm * sms;
  const double t = median_us([&] { stream_kernel<R, P, S><<<grid, 64, smem>>>(a); });
  const double bytes = double(a.chunks) * a.passes * P * kBoxBytes;
  std::printf("%-6s R=%3d P=%d S=%2d blocks/SM=%d  in flight %4zu KB/SM  %9.1f us  %5.2f TB/s  %5.1f KB/us/SM\n", what,
              R, P, S, per_sm, size_t(S) * P * kBoxBytes * per_sm / 1024, t, bytes / t / 1e6, bytes / t / sms / 1024);
}

template <int R, int P, int... S>
void sweep(const char* what, const void* base, int rows, int cols, int passes, int sms) {
  for (int per_sm : {1, 2}) (run<R, P, S>(what, base, rows, cols, passes, per_sm, sms), ...);
}

}  // namespace

int main() try {
  int dev = 0, sms = 0;
  QV_CUDA_CHECK(cudaGetDevice(&dev));
  QV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  QV_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, %d multiprocessors\n", prop.name, sms);
  // DRAM: one pass over Qwen3-32B's W (5120 × 25600 bf16, 262 MB, 5× the L2); L2: 16 passes over
  // 2048 × 3072 (12.6 MB, a quarter of the L2; 201 MB in all, about what Qwen3-8B's forward reads).
  const int big_rows = 5120, big_cols = 25344;  // 25344 = 132 · 192: whole strips at P = 1 and 3
  void* big = nullptr;
  void* small = nullptr;
  QV_CUDA_CHECK(cudaMalloc(&big, size_t(big_rows) * big_cols * 2));
  QV_CUDA_CHECK(cudaMalloc(&small, size_t(2048) * 3072 * 2));
  QV_CUDA_CHECK(cudaMemset(big, 0, size_t(big_rows) * big_cols * 2));
  QV_CUDA_CHECK(cudaMemset(small, 0, size_t(2048) * 3072 * 2));
  // The row pass's shapes (R = 64 rows, P = 1 or 3 panels), then the same stage bytes in fewer,
  // taller boxes (R = 192 or 256, P = 1) against more, shorter ones (R = 64, P = 4): if the rate
  // follows the number of requests rather than the bytes, taller boxes stream faster.
  sweep<64, 1, 2, 4, 8, 16>("dram", big, big_rows, big_cols, 1, sms);
  sweep<64, 3, 2, 3, 5, 8>("dram", big, big_rows, big_cols, 1, sms);
  sweep<192, 1, 2, 3, 5, 8>("dram", big, big_rows, big_cols, 1, sms);
  sweep<64, 4, 2, 4, 6>("dram", big, big_rows, big_cols, 1, sms);
  sweep<256, 1, 2, 4, 6>("dram", big, big_rows, big_cols, 1, sms);
  sweep<64, 1, 2, 4, 8, 16>("l2", small, 2048, 3072, 16, sms);
  sweep<64, 3, 2, 3, 5, 8>("l2", small, 2048, 3072, 16, sms);
  sweep<192, 1, 2, 3, 5, 8>("l2", small, 1920, 3072, 16, sms);
  sweep<64, 4, 2, 4, 6>("l2", small, 2048, 3072, 16, sms);
  sweep<256, 1, 2, 4, 6>("l2", small, 2048, 3072, 16, sms);
  // Multicast against the same walk without it (C = 1), P = 4 panels of 64 columns per chunk.
  for (int passes : {1, 16}) {
    const bool l2 = passes > 1;
    const void* base = l2 ? small : big;
    const int rows = l2 ? 2048 : big_rows, cols = l2 ? 3072 : big_cols;
    run_multicast<4, 2, 1>(l2 ? "l2" : "dram", base, rows, cols, passes, sms);
    run_multicast<4, 4, 1>(l2 ? "l2" : "dram", base, rows, cols, passes, sms);
    run_multicast<4, 2, 2>(l2 ? "l2" : "dram", base, rows, cols, passes, sms);
    run_multicast<4, 4, 2>(l2 ? "l2" : "dram", base, rows, cols, passes, sms);
    run_multicast<4, 2, 4>(l2 ? "l2" : "dram", base, rows, cols, passes, sms);
    run_multicast<4, 4, 4>(l2 ? "l2" : "dram", base, rows, cols, passes, sms);
  }
  QV_CUDA_CHECK(cudaFree(big));
  QV_CUDA_CHECK(cudaFree(small));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "quiver_tma_stream: %s\n", e.what());
  return 1;
}
