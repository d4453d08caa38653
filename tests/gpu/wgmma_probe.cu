#include "gpu/wgmma_probe.h"

#include <stdexcept>
#include <string>

#include "cuda/check.h"
#include "cuda/wgmma.cuh"

namespace quiver::gpu_testing {
namespace {

namespace wg = cuda::detail::wgmma;

// A row-major [64, kCols] operand into a Panels<kCols> tile.
template <int kCols>
__device__ void put_tile(unsigned char* tile, const uint16_t* x) {
  for (int i = threadIdx.x; i < 64 * kCols; i += blockDim.x)
    *reinterpret_cast<uint16_t*>(tile + wg::Panels<kCols>::offset(i / kCols, i % kCols)) = x[i];
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
  using P = wg::Panels<K>;
  __shared__ __align__(1024) unsigned char as[P::kBytes], bs[P::kBytes];
  put_tile<K>(as, a);
  put_tile<K>(bs, b);
  cuda::detail::fence_proxy_async_shared();
  __syncthreads();
  float d[32] = {};
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) wg::mma<64, 0, 0>(d, P::k_major(as, k0), P::k_major(bs, k0), k0 > 0);
  wg::commit();
  wg::wait<0>();
  store_accumulators<64>(d, c);
}

template <int N>
__global__ void __launch_bounds__(128) registers_mn_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  __shared__ __align__(1024) unsigned char bs[wg::Panels<N>::kBytes];
  put_tile<N>(bs, b);
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
    wg::mma<N, 1>(d, frag, wg::Panels<N>::mn_major(bs, 16 * kk), kk > 0);
  }
  wg::commit();
  wg::wait<0>();
  store_accumulators<N>(d, c);
}

// A MN-major as well: both operands stored with the k index down the rows.
template <int N>
__global__ void __launch_bounds__(128) mn_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  __shared__ __align__(1024) unsigned char as[wg::Panels<64>::kBytes], bs[wg::Panels<N>::kBytes];
  put_tile<64>(as, a);
  put_tile<N>(bs, b);
  cuda::detail::fence_proxy_async_shared();
  __syncthreads();
  float d[N / 2] = {};
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wg::mma<N, 1, 1>(d, wg::Panels<64>::mn_major(as, 16 * kk), wg::Panels<N>::mn_major(bs, 16 * kk), kk > 0);
  wg::commit();
  wg::wait<0>();
  store_accumulators<N>(d, c);
}

// Runs make<W>() for the probe width w.
template <class Make>
void for_width(int w, Make make) {
  switch (w) {
    case 16: make.template operator()<16>(); break;
    case 32: make.template operator()<32>(); break;
    case 48: make.template operator()<48>(); break;
    case 64: make.template operator()<64>(); break;
    case 80: make.template operator()<80>(); break;
    case 96: make.template operator()<96>(); break;
    case 128: make.template operator()<128>(); break;
    default: throw std::invalid_argument("wgmma probe: no width " + std::to_string(w));
  }
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void wgmma_k_major(const uint16_t* a, const uint16_t* b, float* c, int k) {
  for_width(k, [&]<int W>() { k_major_kernel<W><<<1, 128>>>(a, b, c); });
}

void wgmma_registers_mn_major(const uint16_t* a, const uint16_t* b, float* c, int n) {
  for_width(n, [&]<int W>() { registers_mn_major_kernel<W><<<1, 128>>>(a, b, c); });
}

void wgmma_mn_major(const uint16_t* a, const uint16_t* b, float* c, int n) {
  for_width(n, [&]<int W>() { mn_major_kernel<W><<<1, 128>>>(a, b, c); });
}

}  // namespace quiver::gpu_testing
