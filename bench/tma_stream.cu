// TMA streaming probe: how fast can one multiprocessor's ring of TMA boxes stream a bf16 matrix
// from DRAM or L2, with no products? The algebraic projection's TMA row pass reads W in chunks of
// 64 rows × 64·P columns (P boxes of 64 × 128 bytes, one per 64-column panel, 128-byte swizzle)
// through a ring of S stages; this probe runs the same loads and nothing else, so its rate is the
// ceiling the row pass's W stream can reach at that ring depth (docs/decisions.md).
//
// Each of G persistent blocks (one producer warp whose lane 0 issues, one consumer warp that waits
// on each stage and releases it) walks chunks b, b + G, ...; chunk c is rows 64 (c mod K/64) of
// column strip c div (K/64), so consecutive chunks go down a strip, as a tile's reduction does.
// Printed: per configuration, µs per pass over the matrix (median of 9 after 2 warm passes),
// TB/s, and KB/µs per multiprocessor.
//
// Built with the CUDA backend as build/bin/quiver_tma_stream; run it on a GPU with TMA (sm_90).
#include <cuda.h>
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

constexpr int kBoxRows = 64, kBoxBytes = kBoxRows * 128;

struct Args {
  CUtensorMap map;
  int strips, row_chunks, chunks;
};

template <int P, int S>
__global__ void __launch_bounds__(64, 1) stream_kernel(const __grid_constant__ Args a) {
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
  const int n = (a.chunks - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  if (threadIdx.x == 0) {  // the producer
    for (int i = 0; i < n; ++i) {
      const int s = i % S, c = static_cast<int>(blockIdx.x) + i * static_cast<int>(gridDim.x);
      if (i >= S) tma::wait(&empty[s], ((i / S) & 1) ^ 1);
      tma::arrive_expect(&full[s], P * kBoxBytes);
      const int r0 = (c % a.row_chunks) * kBoxRows, c0 = (c / a.row_chunks) * 64 * P;
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

template <int P, int S>
void run(const char* what, const void* base, int rows, int cols, int per_sm, int sms) {
  Args a{tma_map_bf16(base, rows, cols, cols, kBoxRows, 64), cols / (64 * P), rows / kBoxRows, 0};
  a.chunks = a.strips * a.row_chunks;
  const size_t smem = 1024 + size_t(S) * P * kBoxBytes + 2 * S * sizeof(uint64_t);
  QV_CUDA_CHECK(cudaFuncSetAttribute(stream_kernel<P, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int fit = 0;
  QV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, stream_kernel<P, S>, 64, smem));
  if (fit < per_sm) {
    std::printf("%-6s P=%d S=%d blocks/SM=%d  does not fit\n", what, P, S, per_sm);
    return;
  }
  const int grid = per_sm * sms;
  cudaEvent_t e0, e1;
  QV_CUDA_CHECK(cudaEventCreate(&e0));
  QV_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int rep = 0; rep < 11; ++rep) {
    QV_CUDA_CHECK(cudaEventRecord(e0));
    stream_kernel<P, S><<<grid, 64, smem>>>(a);
    QV_CUDA_CHECK(cudaEventRecord(e1));
    QV_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep >= 2) us.push_back(ms * 1000.0f);
  }
  QV_CUDA_CHECK(cudaGetLastError());
  std::sort(us.begin(), us.end());
  const double t = us[us.size() / 2], bytes = double(a.chunks) * P * kBoxBytes;
  std::printf("%-6s P=%d S=%d blocks/SM=%d  in flight %4zu KB/SM  %9.1f us  %5.2f TB/s  %5.1f KB/us/SM\n", what, P, S,
              per_sm, size_t(S) * P * kBoxBytes * per_sm / 1024, t, bytes / t / 1e6, bytes / t / 1e3 / sms / 1024);
  QV_CUDA_CHECK(cudaEventDestroy(e0));
  QV_CUDA_CHECK(cudaEventDestroy(e1));
}

template <int P, int... S>
void sweep(const char* what, const void* base, int rows, int cols, int sms) {
  for (int per_sm : {1, 2}) (run<P, S>(what, base, rows, cols, per_sm, sms), ...);
}

}  // namespace

int main() try {
  int dev = 0, sms = 0;
  QV_CUDA_CHECK(cudaGetDevice(&dev));
  QV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  QV_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, %d multiprocessors\n", prop.name, sms);
  // DRAM: Qwen3-32B's W (5120 × 25600 bf16, 262 MB, 5× the L2); L2: 2048 × 3072 (12.6 MB).
  const int big_rows = 5120, big_cols = 25344;  // 25344 = 132 · 192: whole strips at P = 1 and 3
  void* big = nullptr;
  void* small = nullptr;
  QV_CUDA_CHECK(cudaMalloc(&big, size_t(big_rows) * big_cols * 2));
  QV_CUDA_CHECK(cudaMalloc(&small, size_t(2048) * 3072 * 2));
  QV_CUDA_CHECK(cudaMemset(big, 0, size_t(big_rows) * big_cols * 2));
  QV_CUDA_CHECK(cudaMemset(small, 0, size_t(2048) * 3072 * 2));
  sweep<1, 2, 4, 8, 16>("dram", big, big_rows, big_cols, sms);
  sweep<3, 2, 3, 5, 8>("dram", big, big_rows, big_cols, sms);
  sweep<1, 2, 4, 8, 16>("l2", small, 2048, 3072, sms);
  sweep<3, 2, 3, 5, 8>("l2", small, 2048, 3072, sms);
  QV_CUDA_CHECK(cudaFree(big));
  QV_CUDA_CHECK(cudaFree(small));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "quiver_tma_stream: %s\n", e.what());
  return 1;
}
