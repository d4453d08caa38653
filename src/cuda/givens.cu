// Givens head mixing kernels (forward, backward) and their launchers; see givens.h for the
// contract and relation_launch.h for the launcher interface.
#include <cooperative_groups.h>

#include <cstdint>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/relation_launch.h"

namespace quiver::cuda::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kRotateThreads = 256;
// The dθ reduction of one pair runs on one cluster of kClusterBlocks blocks; the blocks'
// partials are merged by cluster rank, so the order of the sum is fixed.
constexpr int kClusterBlocks = 8;
constexpr int kDthetaThreads = 512;

struct HeadPair {
  int64_t a, b;
};

// ops::givens_pairs: even layers (2k, 2k+1), odd layers (2k+1, (2k+2) mod H).
__device__ __forceinline__ HeadPair pair_heads(int64_t k, int64_t heads, int64_t layer) {
  if (layer % 2 == 0) return {2 * k, 2 * k + 1};
  return {2 * k + 1, (2 * k + 2) % heads};
}

// out_a = c·in_a − s·in_b, out_b = s·in_a + c·in_b with (c, s) = (cos θ_k, sin_sign · sin θ_k):
// the forward (sin_sign = 1) and dI = Gᵀ dOut (sin_sign = −1). One thread per (row, pair,
// channel) reads both inputs before writing both outputs, so out may equal in.
__global__ void __launch_bounds__(kRotateThreads)
    givens_rotate_kernel(const uint16_t* in, const float* theta, float sin_sign, int64_t rows,
                         int64_t heads, int64_t head_dim, int64_t layer, uint16_t* out) {
  const int64_t pairs = heads / 2, n = rows * pairs * head_dim;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t dd = idx % head_dim, k = (idx / head_dim) % pairs, r = idx / (head_dim * pairs);
    const HeadPair hp = pair_heads(k, heads, layer);
    float s, c;
    sincosf(theta[k], &s, &c);
    s *= sin_sign;
    const int64_t ia = (r * heads + hp.a) * head_dim + dd, ib = (r * heads + hp.b) * head_dim + dd;
    const float xa = bf16_load(in[ia]), xb = bf16_load(in[ib]);
    out[ia] = bf16_round(c * xa - s * xb);
    out[ib] = bf16_round(s * xa + c * xb);
  }
}

// dtheta[k] += Σ_{rows, channels} dOut_b·Ĩ_a − dOut_a·Ĩ_b. Cluster k owns pair k; block `rank`
// of it sums the elements e ≡ rank·blockDim + threadIdx (mod kClusterBlocks·blockDim) of the
// rows × Dh plane in index order, each block reduces in a fixed tree, and rank 0 adds the
// blocks' totals in rank order.
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kDthetaThreads)
    givens_dtheta_kernel(const uint16_t* d_out, const uint16_t* in, const float* theta,
                         int64_t rows, int64_t heads, int64_t head_dim, int64_t layer,
                         float* dtheta) {
  __shared__ double scratch[kDthetaThreads / 32];
  __shared__ double block_total;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int64_t k = blockIdx.x / kClusterBlocks;
  const HeadPair hp = pair_heads(k, heads, layer);
  float s, c;
  sincosf(theta[k], &s, &c);
  const int64_t n = rows * head_dim;
  double sum = 0.0;
  for (int64_t e = static_cast<int64_t>(rank) * kDthetaThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(kClusterBlocks) * kDthetaThreads) {
    const int64_t r = e / head_dim, dd = e % head_dim;
    const int64_t ia = (r * heads + hp.a) * head_dim + dd, ib = (r * heads + hp.b) * head_dim + dd;
    const float xa = bf16_load(in[ia]), xb = bf16_load(in[ib]);
    const float ya = c * xa - s * xb, yb = s * xa + c * xb;
    sum += static_cast<double>(bf16_load(d_out[ib]) * ya - bf16_load(d_out[ia]) * yb);
  }
  const double total = block_sum_double(sum, scratch);
  if (threadIdx.x == 0) block_total = total;
  cluster.sync();  // every block's total is written
  if (rank == 0 && threadIdx.x == 0) {
    double acc = 0.0;
    for (unsigned q = 0; q < kClusterBlocks; ++q) acc += *cluster.map_shared_rank(&block_total, q);
    dtheta[k] = static_cast<float>(static_cast<double>(dtheta[k]) + acc);
  }
  cluster.sync();  // no block leaves while rank 0 reads its shared memory
}

}  // namespace

void launch_givens_forward(const uint16_t* in, const float* theta, int64_t rows, int64_t heads,
                           int64_t head_dim, int64_t layer, uint16_t* out, cudaStream_t stream) {
  const int64_t n = rows * (heads / 2) * head_dim;
  if (n == 0) return;
  givens_rotate_kernel<<<grid_for(n, kRotateThreads), kRotateThreads, 0, stream>>>(
      in, theta, 1.0f, rows, heads, head_dim, layer, out);
  QV_CUDA_CHECK(cudaGetLastError());
}

void launch_givens_backward(const uint16_t* d_out, const uint16_t* in, const float* theta,
                            int64_t rows, int64_t heads, int64_t head_dim, int64_t layer,
                            uint16_t* d_in, float* dtheta, cudaStream_t stream) {
  const int64_t pairs = heads / 2, n = rows * pairs * head_dim;
  if (n == 0) return;
  // dθ first: it reads d_out, which the rotation below may overwrite (d_in == d_out).
  givens_dtheta_kernel<<<static_cast<unsigned>(pairs * kClusterBlocks), kDthetaThreads, 0,
                         stream>>>(d_out, in, theta, rows, heads, head_dim, layer, dtheta);
  QV_CUDA_CHECK(cudaGetLastError());
  givens_rotate_kernel<<<grid_for(n, kRotateThreads), kRotateThreads, 0, stream>>>(
      d_out, theta, -1.0f, rows, heads, head_dim, layer, d_in);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
