#include "gpu/wgmma_probe.h"

#include "cuda/check.h"
#include "cuda/wgmma.cuh"

namespace quiver::gpu_testing {
namespace {

namespace wg = cuda::detail::wgmma;

// Element (r, col) of a row-major [rows, width] bf16 operand into 64-wide swizzled panels of
// `rows` rows each.
__device__ void put(unsigned char* tiles, int rows, int r, int col, uint16_t v) {
  *reinterpret_cast<uint16_t*>(tiles + (col / 64) * rows * 128 + wg::swizzle128(r, col % 64)) = v;
}

// The accumulators of a 64 x N product into row-major c [64, N].
template <int N>
__device__ void store_accumulators(const float (&d)[N / 2], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 16 * warp + grp + 8 * half, col = 8 * j + 2 * tig;
      c[r * N + col] = d[4 * j + 2 * half];
      c[r * N + col + 1] = d[4 * j + 2 * half + 1];
    }
}

template <int K>
__global__ void __launch_bounds__(128) k_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  __shared__ __align__(1024) unsigned char as[64 * K * 2], bs[64 * K * 2];
  for (int i = threadIdx.x; i < 64 * K; i += blockDim.x) {
    put(as, 64, i / K, i % K, a[i]);
    put(bs, 64, i / K, i % K, b[i]);
  }
  cuda::detail::fence_proxy_async_shared();
  __syncthreads();
  float d[32] = {};
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    const int at = (k0 / 64) * 64 * 128 + (k0 % 64) * 2;  // panel, then the k offset in the row
    wg::mma<64, 0, 0>(d, wg::descriptor(as + at, 16, 1024), wg::descriptor(bs + at, 16, 1024), k0 > 0);
  }
  wg::commit();
  wg::wait<0>();
  store_accumulators<64>(d, c);
}

template <int N>
__global__ void __launch_bounds__(128)
    registers_mn_major_kernel(const uint16_t* a, const uint16_t* b, float* c, uint32_t lbo, uint32_t sbo) {
  __shared__ __align__(1024) unsigned char bs[64 * N * 2];
  for (int i = threadIdx.x; i < 64 * N; i += blockDim.x) put(bs, 64, i / N, i % N, b[i]);
  cuda::detail::fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  auto pair = [&](int r, int col) {
    return static_cast<uint32_t>(a[r * 64 + col]) | (static_cast<uint32_t>(a[r * 64 + col + 1]) << 16);
  };
  float d[N / 2] = {};
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int r = 16 * warp + grp, k = 16 * kk + 2 * tig;
    const uint32_t frag[4] = {pair(r, k), pair(r + 8, k), pair(r, k + 8), pair(r + 8, k + 8)};
    // k rows 16 kk .. 16 kk + 15 of B: two 8-row groups, 2048 bytes per step in every panel.
    wg::mma<N, 1>(d, frag, wg::descriptor(bs + kk * 2048, lbo, sbo), kk > 0);
  }
  wg::commit();
  wg::wait<0>();
  store_accumulators<N>(d, c);
}

// A MN-major as well: both operands stored with the k index down the rows.
__global__ void __launch_bounds__(128) mn_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  __shared__ __align__(1024) unsigned char as[64 * 64 * 2], bs[64 * 64 * 2];
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    put(as, 64, i / 64, i % 64, a[i]);
    put(bs, 64, i / 64, i % 64, b[i]);
  }
  cuda::detail::fence_proxy_async_shared();
  __syncthreads();
  float d[32] = {};
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wg::mma<64, 1, 1>(d, wg::descriptor(as + kk * 2048, 8192, 1024), wg::descriptor(bs + kk * 2048, 8192, 1024),
                      kk > 0);
  wg::commit();
  wg::wait<0>();
  store_accumulators<64>(d, c);
}

}  // namespace

void wgmma_mn_major(const uint16_t* a, const uint16_t* b, float* c) {
  mn_major_kernel<<<1, 128>>>(a, b, c);
  QV_CUDA_CHECK(cudaGetLastError());
}

void wgmma_k_major(const uint16_t* a, const uint16_t* b, float* c, int k) {
  if (k == 64)
    k_major_kernel<64><<<1, 128>>>(a, b, c);
  else
    k_major_kernel<128><<<1, 128>>>(a, b, c);
  QV_CUDA_CHECK(cudaGetLastError());
}

void wgmma_registers_mn_major(const uint16_t* a, const uint16_t* b, float* c, int n, uint32_t lbo,
                              uint32_t sbo) {
  if (n == 64)
    registers_mn_major_kernel<64><<<1, 128>>>(a, b, c, lbo, sbo);
  else
    registers_mn_major_kernel<128><<<1, 128>>>(a, b, c, lbo, sbo);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::gpu_testing
