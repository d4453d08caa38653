#include "gpu/wgmma_probe.h"

#include <stdexcept>
#include <string>

#include "cuda/check.h"
#include "cuda/tma.cuh"
#include "cuda/tma.h"
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

// c [64, 64] = A · Bᵀ from two K-major Panels<K> tiles in shared memory, as S = Q Kᵀ.
template <int K>
__device__ void k_major_product(const unsigned char* as, const unsigned char* bs, float* c) {
  using P = wg::Panels<K>;
  float d[32] = {};
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) wg::mma<64, 0, 0>(d, P::k_major(as, k0), P::k_major(bs, k0), k0 > 0);
  wg::commit();
  wg::wait<0>();
  store_accumulators<64>(d, c);
}

template <int K>
__global__ void __launch_bounds__(128) k_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  using P = wg::Panels<K>;
  __shared__ __align__(1024) unsigned char as[P::kBytes], bs[P::kBytes];
  put_tile<K>(as, a);
  put_tile<K>(bs, b);
  cuda::detail::fence_proxy_async_shared();
  __syncthreads();
  k_major_product<K>(as, bs, c);
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

// A 64-row Panels<kCols> tile into `tile` by TMA: thread 0 arms the barrier and calls
// load(panel, destination, barrier) for each panel; everyone waits for phase 0, a bounded number
// of tries (a wrong byte count traps instead of hanging the test).
template <int kCols, class Load>
__device__ void tma_load_panels(unsigned char* tile, uint64_t* bar, Load load) {
  using P = wg::Panels<kCols>;
  namespace tma = cuda::detail::tma;
  if (threadIdx.x == 0) {
    tma::init(bar, 1);
    tma::fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::arrive_expect(bar, P::kBytes);
    for (int p = 0; p < static_cast<int>(P::kBytes / P::kPanelBytes); ++p) load(p, tile + p * P::kPanelBytes, bar);
  }
  for (int tries = 0; !tma::try_wait(bar, 0); ++tries)
    if (tries > (1 << 22)) __trap();
}

// The 64-row tile at (row0, col0) of `map` (boxes of one panel) into `tile`.
template <int kCols>
__device__ void tma_load_tile(unsigned char* tile, const CUtensorMap* map, uint64_t* bar, int row0, int col0) {
  tma_load_panels<kCols>(tile, bar, [&](int p, unsigned char* dst, uint64_t* b) {
    cuda::detail::tma::load_2d(dst, map, b, col0 + p * wg::Panels<kCols>::kPanelCols, row0);
  });
}

// The tile's elements, row-major [64, K], read through Panels<K>::offset.
template <int K>
__device__ void read_tile(const unsigned char* tile, uint16_t* out) {
  using P = wg::Panels<K>;
  for (int i = threadIdx.x; i < 64 * K; i += blockDim.x)
    out[i] = *reinterpret_cast<const uint16_t*>(tile + P::offset(i / K, i % K));
}

template <int K>
__global__ void __launch_bounds__(128) tma_tile_kernel(const __grid_constant__ CUtensorMap map, int row0, int col0,
                                                       uint16_t* out) {
  __shared__ __align__(1024) unsigned char tile[wg::Panels<K>::kBytes];
  __shared__ uint64_t bar;
  tma_load_tile<K>(tile, &map, &bar, row0, col0);
  read_tile<K>(tile, out);
}

// The 64-row tile at rows t0.. of head h in batch b of a rank-4 heads map (boxes of one panel),
// as the warp-specialized dK/dV pass loads its tiles.
template <int K>
__global__ void __launch_bounds__(128) tma_head_tile_kernel(const __grid_constant__ CUtensorMap map, int b, int h,
                                                            int t0, uint16_t* out) {
  __shared__ __align__(1024) unsigned char tile[wg::Panels<K>::kBytes];
  __shared__ uint64_t bar;
  tma_load_panels<K>(tile, &bar, [&](int p, unsigned char* dst, uint64_t* bar_) {
    cuda::detail::tma::load_4d(dst, &map, bar_, p * wg::Panels<K>::kPanelCols, h, t0, b);
  });
  read_tile<K>(tile, out);
}

template <int K>
__global__ void __launch_bounds__(128) tma_k_major_kernel(const __grid_constant__ CUtensorMap map_a,
                                                          const __grid_constant__ CUtensorMap map_b, int row0, float* c) {
  using P = wg::Panels<K>;
  __shared__ __align__(1024) unsigned char as[P::kBytes], bs[P::kBytes];
  __shared__ uint64_t bars[2];
  tma_load_tile<K>(as, &map_a, &bars[0], row0, 0);
  tma_load_tile<K>(bs, &map_b, &bars[1], row0, 0);
  k_major_product<K>(as, bs, c);
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

// The map of a [rows, cols] matrix in boxes of one Panels<kCols> panel of 64 rows.
template <int kCols>
CUtensorMap panel_map(const uint16_t* m, int64_t rows, int64_t cols) {
  return cuda::tma_map_bf16(m, rows, cols, cols, 64, wg::Panels<kCols>::kPanelCols);
}

}  // namespace

void tma_tile(const uint16_t* m, int64_t rows, int64_t cols, int row0, int col0, uint16_t* out, int k) {
  for_width(k, [&]<int W>() { tma_tile_kernel<W><<<1, 128>>>(panel_map<W>(m, rows, cols), row0, col0, out); });
}

void tma_head_tile(const uint16_t* m, int64_t B, int64_t T, int64_t H, int64_t Dh, int b, int h, int t0,
                   uint16_t* out, int k) {
  for_width(k, [&]<int W>() {
    tma_head_tile_kernel<W><<<1, 128>>>(cuda::tma_map_heads_bf16(m, B, T, H, Dh, 64, wg::Panels<W>::kPanelCols), b,
                                        h, t0, out);
  });
}

void tma_k_major(const uint16_t* a, const uint16_t* b, int64_t rows, int row0, float* c, int k) {
  for_width(k, [&]<int W>() {
    tma_k_major_kernel<W><<<1, 128>>>(panel_map<W>(a, rows, k), panel_map<W>(b, rows, k), row0, c);
  });
}

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
