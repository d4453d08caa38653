// Flash attention: the causal softmax score rule of the tiled mixer (flash_mixer.cuh), the
// forward and backward launchers, and the decode step kernel; see attention.h for the contract
// and attention_launch.h for the launcher interface.
//
// Decode: one block per (head, batch); teams of lanes (8 head-width lanes each) take positions
// in turn with an online softmax per team, merged by shuffles in the warp and through shared
// memory across warps.
#include <cmath>
#include <cstdint>

#include "cuda/attention_launch.h"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/flash_mixer.cuh"

namespace quiver::cuda::detail {
namespace {

static_assert(kAttentionTile == flash::kTile, "the mixer's tile is the launchers' tile");

// ---- Score rule -----------------------------------------------------------------------------
// The score rule of softmax attention: logit = scale · (q·k), keys visible causally (j <= p),
// no Self entry; the statistic is lse_p = ln Σ_j exp(logit) (natural units). log2(e) is folded
// into the scale, so the exponentials are base 2; the forward's score is the dot itself
// (score_log2 = scale · log2(e)).
struct CausalSoftmaxRule {
  static constexpr bool kSelf = false;
  float scale;       // 1 / sqrt(Dh): d logit / d dot in natural units
  float score_log2;  // scale · log2(e)
  float* lse_out;       // forward: [B, Hq, T] assigned
  const float* lse_in;  // backward: the forward's lse
  __device__ __forceinline__ bool visible(int64_t p, int64_t j) const { return j <= p; }
  __device__ __forceinline__ float score(float dot) const { return dot; }
  __device__ __forceinline__ flash::RowWeights finish_row(int64_t r, int64_t, float m2, float l,
                                                          float, bool writer) const {
    if (writer) lse_out[r] = l > 0.0f ? (m2 + log2f(l)) * flash::kLn2 : -INFINITY;
    return {l > 0.0f ? 1.0f / l : 0.0f, 0.0f};
  }
  __device__ __forceinline__ float row_norm2(int64_t r) const { return lse_in[r] * flash::kLog2e; }
  // P = exp(logit − lse), dS = P (dP − D).
  __device__ __forceinline__ flash::ScoreGrad grad(float dot, float norm2, float dprob,
                                                   float delta) const {
    const float prob = flash::exp2_approx(fmaf(dot, score_log2, -norm2));
    return {prob, prob * (dprob - delta)};
  }
};

CausalSoftmaxRule softmax_rule(int64_t Dh) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  return CausalSoftmaxRule{scale, scale * flash::kLog2e, nullptr, nullptr};
}

// ---- Decode -----------------------------------------------------------------------------------
constexpr int kDecodeThreads = 512;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeBatch = 4;  // positions a team loads before it uses the first

// 8 head-width lanes [c, c + 8) of a bf16 row as fp32; zero at c + i >= Dh or when !valid.
__device__ __forceinline__ void load8(float (&x)[8], const uint16_t* row, int c, int Dh, bool vec,
                                      bool valid) {
  if (vec) {
    uint4 u = make_uint4(0, 0, 0, 0);
    if (valid && c < Dh) u = *reinterpret_cast<const uint4*>(row + c);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = valid && c + i < Dh ? bf16_load(row[c + i]) : 0.0f;
  }
}

// One block per (query head, batch). A team of kTeam lanes (kTeam · 8 >= Dh) holds one position
// at a time, lane i of the team the head-width lanes [8i, 8i + 8); the teams of the block take
// positions round-robin, kDecodeBatch at a time. Rows j < pos come from the cache, row pos from
// the new k, v (the block of the group's first query head writes it into the cache; no block
// reads cache row pos, so there is no race).
template <int kTeam>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_kernel(const AttentionDecodeArgs a, float scale_log2) {
  constexpr int kTeamsPerWarp = 32 / kTeam;
  constexpr int kTeams = kDecodeThreads / kTeam;
  __shared__ float warp_m[kDecodeWarps], warp_l[kDecodeWarps];
  __shared__ float warp_acc[kDecodeWarps][kTeam * 8];

  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t group = a.Hq / a.Hkv, g = h / group;
  const int Dh = static_cast<int>(a.Dh);
  const bool vec = Dh % 8 == 0;
  const int64_t pos = *a.pos;
  const int64_t row_stride = a.Hkv * a.Dh;
  const uint16_t* k_new = a.k + (b * a.Hkv + g) * a.Dh;
  const uint16_t* v_new = a.v + (b * a.Hkv + g) * a.Dh;
  const uint16_t* k_cache = a.cache_k + (b * a.capacity * a.Hkv + g) * a.Dh;
  const uint16_t* v_cache = a.cache_v + (b * a.capacity * a.Hkv + g) * a.Dh;

  if (h % group == 0) {
    const int64_t at = ((b * a.capacity + pos) * a.Hkv + g) * a.Dh;
    for (int i = threadIdx.x; i < Dh; i += kDecodeThreads) {
      a.cache_k[at + i] = k_new[i];
      a.cache_v[at + i] = v_new[i];
    }
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c = (lane % kTeam) * 8;
  float q[8];
  load8(q, a.q + (b * a.Hq + h) * a.Dh, c, Dh, vec, true);
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] *= scale_log2;

  float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;

  // The loop bound is the warp's first position, so all lanes of a warp run it alike (full-mask
  // shuffles); a team past pos sees only invisible positions.
  for (int64_t base = static_cast<int64_t>(warp) * kTeamsPerWarp; base <= pos;
       base += static_cast<int64_t>(kTeams) * kDecodeBatch) {
    float kx[kDecodeBatch][8], vx[kDecodeBatch][8];
#pragma unroll
    for (int u = 0; u < kDecodeBatch; ++u) {
      const int64_t j = base + lane / kTeam + static_cast<int64_t>(u) * kTeams;
      const bool valid = j <= pos;
      const uint16_t* kr = j < pos ? k_cache + j * row_stride : k_new;
      const uint16_t* vr = j < pos ? v_cache + j * row_stride : v_new;
      load8(kx[u], kr, c, Dh, vec, valid);
      load8(vx[u], vr, c, Dh, vec, valid);
    }
    float s[kDecodeBatch], s_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kDecodeBatch; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(q[i], kx[u][i], dot);
#pragma unroll
      for (int off = kTeam / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const int64_t j = base + lane / kTeam + static_cast<int64_t>(u) * kTeams;
      s[u] = j <= pos ? dot : -INFINITY;
      s_max = fmaxf(s_max, s[u]);
    }
    const float m_new = fmaxf(m, s_max);
    if (m_new == -INFINITY) continue;  // the team has no visible position yet
    const float alpha = exp2f(m - m_new);
    l *= alpha;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] *= alpha;
#pragma unroll
    for (int u = 0; u < kDecodeBatch; ++u) {
      const float pr = exp2f(s[u] - m_new);
      l += pr;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(pr, vx[u][i], acc[i]);
    }
    m = m_new;
  }

  // Merge the teams of the warp (lanes kTeam apart hold the same head-width lanes).
#pragma unroll
  for (int off = kTeam; off < 32; off *= 2) {
    const float m_o = __shfl_xor_sync(0xffffffffu, m, off);
    const float l_o = __shfl_xor_sync(0xffffffffu, l, off);
    const float m_new = fmaxf(m, m_o);
    const float sa = m == -INFINITY ? 0.0f : exp2f(m - m_new);
    const float sb = m_o == -INFINITY ? 0.0f : exp2f(m_o - m_new);
    l = l * sa + l_o * sb;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float acc_o = __shfl_xor_sync(0xffffffffu, acc[i], off);
      acc[i] = acc[i] * sa + acc_o * sb;
    }
    m = m_new;
  }
  if (lane < kTeam) {
    if (lane == 0) {
      warp_m[warp] = m;
      warp_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) warp_acc[warp][c + i] = acc[i];
  }
  __syncthreads();

  // Merge the warps: thread t writes head-width lane t (position pos is visible to every
  // query, so the block's maximum is finite).
  if (threadIdx.x < Dh) {
    float m_all = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
    float l_all = 0.0f, y = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float sw = warp_m[w] == -INFINITY ? 0.0f : exp2f(warp_m[w] - m_all);
      l_all = fmaf(warp_l[w], sw, l_all);
      y = fmaf(warp_acc[w][threadIdx.x], sw, y);
    }
    a.y[(b * a.Hq + h) * a.Dh + threadIdx.x] = bf16_round(y / l_all);
  }
}

// The backward's row pass: D_p = dy_p · y_p of every query row into delta [B, Hq, T] (fp32 sums
// of the bf16 products), one warp per row of [B, T, Hq, Dh], the lanes splitting the head width.
constexpr int kDeltaThreads = 256;
__global__ void __launch_bounds__(kDeltaThreads)
    row_delta_kernel(const AttentionDims d, const uint16_t* y, const uint16_t* dy, float* delta) {
  const int64_t rows = d.B * d.T * d.Hq;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kDeltaThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t off = row * d.Dh;
  float sum = 0.0f;
  for (int64_t c = lane; c < d.Dh; c += 32) sum = fmaf(bf16_load(y[off + c]), bf16_load(dy[off + c]), sum);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) {
    const int64_t h = row % d.Hq, p = (row / d.Hq) % d.T, b = row / (d.Hq * d.T);
    delta[(b * d.Hq + h) * d.T + p] = sum;
  }
}

void launch_row_delta(const AttentionDims& d, const uint16_t* y, const uint16_t* dy, float* delta,
                      cudaStream_t stream) {
  const int64_t rows = d.B * d.T * d.Hq;
  if (rows == 0) return;
  constexpr int64_t kRowsPerBlock = kDeltaThreads / 32;
  row_delta_kernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kDeltaThreads, 0, stream>>>(
      d, y, dy, delta);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <int kPadded>
void launch_attention_forward(const AttentionForwardArgs& args, cudaStream_t stream) {
  CausalSoftmaxRule rule = softmax_rule(args.dims.Dh);
  rule.lse_out = args.lse;
  flash::launch_forward<kPadded>(
      flash::ForwardIo{args.dims, args.q, args.k, args.v, args.y}, rule, stream);
}

template <int kPadded>
void launch_attention_backward(const AttentionBackwardArgs& args, cudaStream_t stream) {
  CausalSoftmaxRule rule = softmax_rule(args.dims.Dh);
  rule.lse_in = args.lse;
  launch_row_delta(args.dims, args.y, args.dy, args.delta, stream);
  flash::launch_backward<kPadded>(
      flash::BackwardIo{args.dims, args.q, args.k, args.v, args.dy, args.delta, args.dq,
                        args.dk, args.dv, args.dq_accum},
      rule, stream);
}

void launch_attention_decode(const AttentionDecodeArgs& args, cudaStream_t stream) {
  if (args.B == 0 || args.Hq == 0) return;
  const float scale_log2 = softmax_rule(args.Dh).score_log2;
  const dim3 grid(static_cast<unsigned>(args.Hq), static_cast<unsigned>(args.B));
  const int64_t pieces = (args.Dh + 7) / 8;  // 8 head-width lanes per team lane
  if (pieces <= 1) {
    attention_decode_kernel<1><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else if (pieces <= 2) {
    attention_decode_kernel<2><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else if (pieces <= 4) {
    attention_decode_kernel<4><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else if (pieces <= 8) {
    attention_decode_kernel<8><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  } else {
    attention_decode_kernel<16><<<grid, kDecodeThreads, 0, stream>>>(args, scale_log2);
  }
  QV_CUDA_CHECK(cudaGetLastError());
}

#define QUIVER_ATTENTION_INSTANTIATE(P)                                                    \
  template void launch_attention_forward<P>(const AttentionForwardArgs&, cudaStream_t); \
  template void launch_attention_backward<P>(const AttentionBackwardArgs&, cudaStream_t);
QUIVER_ATTENTION_INSTANTIATE(16)
QUIVER_ATTENTION_INSTANTIATE(32)
QUIVER_ATTENTION_INSTANTIATE(48)
QUIVER_ATTENTION_INSTANTIATE(64)
QUIVER_ATTENTION_INSTANTIATE(80)
QUIVER_ATTENTION_INSTANTIATE(96)
QUIVER_ATTENTION_INSTANTIATE(112)
QUIVER_ATTENTION_INSTANTIATE(128)
#undef QUIVER_ATTENTION_INSTANTIATE

}  // namespace quiver::cuda::detail
