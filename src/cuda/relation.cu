// FlashRelation: the Relation score rule of the tiled mixer (flash_mixer.cuh), the backward's
// row pass and dλ reduction, the launchers, and the Relation Cache decode kernel; see
// relation.h for the contract and relation_launch.h for the launcher interface.
//
// The tiled kernels are those of the flash attention (p1 in the query role, p2 in the key role,
// Ĩ in the value role, Hq = Hkv = H) with Relation's rule:
//   - the scan covers the strict history j < p, with the logit E_pj = SiLU(U_pj),
//     U = p1·p2 / sqrt(Dh), σ(U) = (1 + tanh(U/2)) / 2 by one tanh.approx (one special-function
//     result instead of ex2 + rcp);
//   - after the scan, the row's own p1_p · p2_p (the diagonal key tile is still in shared
//     memory) gives S_p, and the gate g_p = sigmoid(m + log l − λ log(p+1) − S_p) blends
//     Y_p = (1 − g_p) Ĩ_p + g_p z/l in the output staging;
//   - backward: the weights are F_pj = exp(E_pj − norm_p), norm_p = L_p − log g_p, and
//     dU_pj = F_pj (dY_p · Ĩ_j − D_p) SiLU'(U_pj) with σ recomputed from the dot; the Self
//     entry adds dU_pp p2_p to dp1_p, dU_jj p1_j to dp2_j and (1 − g_j) dY_j to dĨ_j.
// A row pass before the tile passes stores norm_p, dR_pp and D_p per row and one partial of
// dλ = Σ_p log(p+1) dR_pp per 64-row tile, summed in a fixed order by one block.
#include <cmath>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/flash_mixer.cuh"
#include "cuda/relation_launch.h"

namespace quiver::cuda::detail {
namespace {

static_assert(kRelationTile == flash::kTile, "the mixer's tile is the launchers' tile");

constexpr int kStats = 3;  // columns of ops::RelationStat
constexpr int kStatLogExchange = 0, kStatSelf = 1, kStatGate = 2;

__device__ __forceinline__ float log_sigmoid(float x) {
  return fminf(x, 0.0f) - log1pf(expf(-fabsf(x)));
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Views of the backward's workspace (relation_launch.h).
struct BackwardWorkspace {
  double* partials;  // [B, H, tiles] Σ_p log(p+1) dR_pp over the tile's rows
  float* norm;       // [B, H, T] F_pj = exp(E_pj − norm_p) for j < p
  float* dr_self;    // [B, H, T] dR_pp
  float* delta;      // [B, H, T] D_p = dY_p · Y_p, for the tile passes
};

BackwardWorkspace backward_workspace(const RelationBackwardArgs& a) {
  const RelationDims& d = a.dims;
  const int64_t rows = d.B * d.H * d.T;
  BackwardWorkspace w;
  w.partials = static_cast<double*>(a.workspace);
  w.norm = reinterpret_cast<float*>(w.partials + relation_backward_partials(d.B, d.T, d.H));
  w.dr_self = w.norm + rows;
  w.delta = w.dr_self + rows;
  return w;
}

// ---- Score rule -----------------------------------------------------------------------------
// Relation's rule for the mixer (see flash_mixer.cuh for the interface); rows r index
// [B, H, T] as the statistics and the workspace do.
struct RelationScoreRule {
  static constexpr bool kSelf = true;
  float scale;            // 1 / sqrt(Dh): dU / d dot
  float half_scale;       // scale / 2: the tanh argument U/2
  float score_log2;       // log2(e): the forward's score is E in natural units
  float inv_tau;          // 1 / τ_S
  bool exchange_only;
  const float* lambda;     // one F32 (device)
  float* stats_out;        // forward: [B, H, T, 3] assigned
  const float* stats_in;   // backward: the forward's statistics
  BackwardWorkspace work;  // backward: the row pass's norm_p and dR_pp

  __device__ __forceinline__ bool visible(int64_t p, int64_t j) const { return j < p; }
  // E = U σ(U) = y (1 + tanh(y)) with y = U / 2.
  __device__ __forceinline__ float score(float dot) const {
    const float y = dot * half_scale;
    return fmaf(y, flash::tanh_approx(y), y);
  }
  __device__ __forceinline__ flash::RowWeights finish_row(int64_t r, int64_t p, float m2, float l,
                                                          float self_dot, bool writer) const {
    const float self = logistic(self_dot * scale * inv_tau);
    float log_exchange = -INFINITY, gate = 0.0f, hist = 0.0f;
    if (p > 0) {  // p = 0 has no history: g_0 = 0, Y_0 = Ĩ_0 (exchange-only: 0)
      log_exchange = (m2 + log2f(l)) * flash::kLn2;
      gate = logistic(log_exchange - *lambda * logf(static_cast<float>(p + 1)) - self);
      hist = gate / l;
    }
    if (writer) {
      float* st = stats_out + r * kStats;
      st[kStatLogExchange] = log_exchange;
      st[kStatSelf] = self;
      st[kStatGate] = gate;
    }
    return {hist, exchange_only ? 0.0f : 1.0f - gate};
  }
  __device__ __forceinline__ float row_norm2(int64_t r) const {
    return work.norm[r] * flash::kLog2e;
  }
  // F = exp(E − norm), dU = F (dP − D) SiLU'(U), with y = U/2, t = tanh(y), σ = σ(U) = (1 + t)/2
  // and E = U σ = y (1 + t): SiLU'(U) = σ + U σ (1 − σ) = σ + E − E σ (three operations from σ
  // and E, where (1 + t)/2 + (y/2)(1 − t²) takes four).
  __device__ __forceinline__ flash::ScoreGrad grad(float dot, float norm2, float dprob,
                                                   float delta) const {
    const float y = dot * half_scale;
    const float th = flash::tanh_approx(y);
    const float e = fmaf(y, th, y);
    const float prob = flash::exp2_approx(fmaf(e, flash::kLog2e, -norm2));
    const float sig = fmaf(0.5f, th, 0.5f);
    const float silu_grad = fmaf(-e, sig, sig + e);
    return {prob, (dprob - delta) * prob * silu_grad};
  }
  // dU_pp = dR_pp S_p (1 − S_p) / τ_S.
  __device__ __forceinline__ float du_self(int64_t r) const {
    const float self = stats_in[r * kStats + kStatSelf];
    return work.dr_self[r] * self * (1.0f - self) * inv_tau;
  }
  __device__ __forceinline__ void key_self(int64_t r, float& dk, float& dv) const {
    dk = du_self(r);
    dv = exchange_only ? 0.0f : 1.0f - stats_in[r * kStats + kStatGate];
  }
  __device__ __forceinline__ float query_self(int64_t r) const { return du_self(r); }
};

RelationScoreRule score_rule(const RelationRule& rule, const float* lambda) {
  RelationScoreRule s{};
  s.scale = rule.scale;
  s.half_scale = 0.5f * rule.scale;
  s.score_log2 = flash::kLog2e;
  s.inv_tau = rule.inv_tau;
  s.exchange_only = rule.exchange_only;
  s.lambda = lambda;
  return s;
}

flash::Dims flash_dims(const RelationDims& d) { return {d.B, d.T, d.H, d.H, d.Dh}; }

// ---- Backward row pass ------------------------------------------------------------------------
constexpr int kRowThreads = 256;
constexpr int kQuad = kRowThreads / kRelationTile;  // threads per row

// Σ_d a[d]·b[d] over d < Dh of two bf16 rows, summed by the quad (all 32 lanes of the warp
// must call it); 0 when `valid` is false.
__device__ float quad_dot_bf16(const uint16_t* a, const uint16_t* b, int Dh, int quad, bool valid) {
  float s = 0.0f;
  if (valid)
    for (int d = quad; d < Dh; d += kQuad) s = fmaf(bf16_load(a[d]), bf16_load(b[d]), s);
  return flash::quad_sum(s);
}

// Row terms of the backward. Grid (tiles, H, B), 4 threads per row. For each row p: norm_p, D_p
// (the tile passes read it) and the Self entry dR_pp = F_pp (dY_p · w_p − D_p) with F_pp = 1 − g_p, D_p = dY_p · Y_p and
// w_p = Ĩ_p (0 under exchange-only transport); the block's Σ log(p+1) dR_pp goes to its slot of
// the partials.
__global__ void __launch_bounds__(kRowThreads)
    relation_backward_rows_kernel(const RelationBackwardArgs a, const BackwardWorkspace w) {
  __shared__ double scratch[kRowThreads / 32];
  const RelationDims& d = a.dims;
  const int Dh = static_cast<int>(d.Dh);
  const int64_t T = d.T;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kQuad, quad = threadIdx.x % kQuad;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kRelationTile + row;
  const bool valid = p < T;
  const int64_t stride = d.H * Dh;
  const int64_t row_off = (b * T * d.H + h) * Dh + (valid ? p : 0) * stride;
  const float delta = quad_dot_bf16(a.dy + row_off, a.y + row_off, Dh, quad, valid);
  const float dself =
      quad_dot_bf16(a.dy + row_off, a.v + row_off, Dh, quad, valid && !a.rule.exchange_only);
  double part = 0.0;
  if (valid && quad == 0) {
    const int64_t r = (b * d.H + h) * T + p;
    const float* st = a.stats + r * kStats;
    const float log_exchange = st[kStatLogExchange], self = st[kStatSelf], gate = st[kStatGate];
    const float log_count = logf(static_cast<float>(p + 1));
    float norm = 0.0f;  // unused at p = 0 (no history)
    if (p > 0) norm = log_exchange - log_sigmoid(log_exchange - *a.lambda * log_count - self);
    const float dr_self = (1.0f - gate) * (dself - delta);
    w.norm[r] = norm;
    w.dr_self[r] = dr_self;
    w.delta[r] = delta;
    part = static_cast<double>(log_count) * dr_self;
  }
  const double total = block_sum_double(part, scratch);
  if (threadIdx.x == 0) w.partials[(b * d.H + h) * gridDim.x + blockIdx.x] = total;
}

// dλ += Σ of the partials, in index order per thread and a fixed tree across threads.
__global__ void __launch_bounds__(kRowThreads)
    relation_dlambda_kernel(const double* partials, int64_t n, float* dlambda) {
  __shared__ double scratch[kRowThreads / 32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) s += partials[i];
  const double total = block_sum_double(s, scratch);
  if (threadIdx.x == 0) *dlambda = static_cast<float>(static_cast<double>(*dlambda) + total);
}

dim3 tile_grid(const RelationDims& d) {
  return dim3(static_cast<unsigned>(relation_tiles(d.T)), static_cast<unsigned>(d.H),
              static_cast<unsigned>(d.B));
}

// ---- Decode -----------------------------------------------------------------------------------
// Decode: one block per (head, sequence); warp w scans the cached rows j ≡ w (mod 8) with its
// own online-softmax state, lane l holding the channels l + 32i; the warps' states are merged
// in a fixed order at the end.
constexpr int kDecodeThreads = 256;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeLanes = kRelationMaxHeadDim / 32;

__global__ void __launch_bounds__(kDecodeThreads)
    relation_decode_kernel(const RelationDecodeArgs a) {
  __shared__ float m_s[kDecodeWarps], l_s[kDecodeWarps];
  __shared__ float z_s[kDecodeWarps][kRelationMaxHeadDim];
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int Dh = static_cast<int>(a.Dh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pos = *a.pos;
  const int64_t row_off = (b * a.H + h) * Dh;
  const int64_t stride = a.H * Dh;
  const int64_t cache_head = (b * a.capacity * a.H + h) * Dh;  // row j at + j * stride
  const float scale = a.rule.scale;

  float p1[kDecodeLanes], p2[kDecodeLanes], v[kDecodeLanes];
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) {
    const int dd = lane + 32 * i;
    const bool in = dd < Dh;
    p1[i] = in ? bf16_load(a.p1[row_off + dd]) : 0.0f;
    p2[i] = in ? bf16_load(a.p2[row_off + dd]) : 0.0f;
    v[i] = in ? bf16_load(a.v[row_off + dd]) : 0.0f;
    if (warp == 0 && in) {
      a.cache_p2[cache_head + pos * stride + dd] = a.p2[row_off + dd];
      a.cache_v[cache_head + pos * stride + dd] = a.v[row_off + dd];
    }
  }
  float self_dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) self_dot = fmaf(p1[i], p2[i], self_dot);
  const float self = logistic(warp_sum(self_dot) * scale * a.rule.inv_tau);

  float m = -INFINITY, l = 0.0f, z[kDecodeLanes];
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) z[i] = 0.0f;
  for (int64_t j = warp; j < pos; j += kDecodeWarps) {
    const uint16_t* kr = a.cache_p2 + cache_head + j * stride;
    const uint16_t* vr = a.cache_v + cache_head + j * stride;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) {
      const int dd = lane + 32 * i;
      if (dd < Dh) s = fmaf(p1[i], bf16_load(kr[dd]), s);
    }
    const float u = warp_sum(s) * scale;
    const float e = u * logistic(u);
    const float m_new = fmaxf(m, e);
    const float alpha = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float wgt = expf(e - m_new);
    l = fmaf(l, alpha, wgt);
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) {
      const int dd = lane + 32 * i;
      const float vj = dd < Dh ? bf16_load(vr[dd]) : 0.0f;
      z[i] = fmaf(z[i], alpha, wgt * vj);
    }
    m = m_new;
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) {
    const int dd = lane + 32 * i;
    if (dd < Dh) z_s[warp][dd] = z[i];
  }
  __syncthreads();
  if (warp != 0) return;

  float y[kDecodeLanes];
  if (pos == 0) {  // no history: Y_0 = Ĩ_0 (exchange-only: 0)
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) y[i] = a.rule.exchange_only ? 0.0f : v[i];
  } else {
    float m_all = -INFINITY;
    for (int k = 0; k < kDecodeWarps; ++k) m_all = fmaxf(m_all, m_s[k]);
    float l_all = 0.0f, z_all[kDecodeLanes];
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) z_all[i] = 0.0f;
    for (int k = 0; k < kDecodeWarps; ++k) {
      const float w_k = l_s[k] > 0.0f ? expf(m_s[k] - m_all) : 0.0f;
      l_all = fmaf(l_s[k], w_k, l_all);
#pragma unroll
      for (int i = 0; i < kDecodeLanes; ++i) {
        const int dd = lane + 32 * i;
        if (dd < Dh) z_all[i] = fmaf(z_s[k][dd], w_k, z_all[i]);
      }
    }
    const float log_exchange = m_all + logf(l_all);
    const float gate = logistic(log_exchange - *a.lambda * logf(static_cast<float>(pos + 1)) - self);
    const float w_hist = gate / l_all, w_self = a.rule.exchange_only ? 0.0f : 1.0f - gate;
#pragma unroll
    for (int i = 0; i < kDecodeLanes; ++i) y[i] = fmaf(w_self, v[i], w_hist * z_all[i]);
  }
#pragma unroll
  for (int i = 0; i < kDecodeLanes; ++i) {
    const int dd = lane + 32 * i;
    if (dd < Dh) a.y[row_off + dd] = bf16_round(y[i]);
  }
}

}  // namespace

template <int kPadded>
void launch_relation_forward(const RelationForwardArgs& args, cudaStream_t stream) {
  RelationScoreRule rule = score_rule(args.rule, args.lambda);
  rule.stats_out = args.stats;
  flash::launch_forward<kPadded>(
      flash::ForwardIo{flash_dims(args.dims), args.p1, args.p2, args.v, args.y}, rule, stream);
}

template <int kPadded>
void launch_relation_backward(const RelationBackwardArgs& args, cudaStream_t stream) {
  const RelationDims& d = args.dims;
  if (d.B == 0 || d.T == 0 || d.H == 0) return;
  const BackwardWorkspace w = backward_workspace(args);
  relation_backward_rows_kernel<<<tile_grid(d), kRowThreads, 0, stream>>>(args, w);
  QV_CUDA_CHECK(cudaGetLastError());
  if (args.dlambda != nullptr) {
    relation_dlambda_kernel<<<1, kRowThreads, 0, stream>>>(
        w.partials, relation_backward_partials(d.B, d.T, d.H), args.dlambda);
    QV_CUDA_CHECK(cudaGetLastError());
  }
  RelationScoreRule rule = score_rule(args.rule, args.lambda);
  rule.stats_in = args.stats;
  rule.work = w;
  flash::launch_backward<kPadded>(
      flash::BackwardIo{flash_dims(d), args.p1, args.p2, args.v, args.dy, w.delta, args.dp1,
                        args.dp2, args.dv, args.dq_accum},
      rule, stream);
}

void launch_relation_decode(const RelationDecodeArgs& args, cudaStream_t stream) {
  if (args.B == 0 || args.H == 0) return;
  relation_decode_kernel<<<dim3(static_cast<unsigned>(args.H), static_cast<unsigned>(args.B)),
                           kDecodeThreads, 0, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

#define QUIVER_RELATION_INSTANTIATE(P)                                                \
  template void launch_relation_forward<P>(const RelationForwardArgs&, cudaStream_t); \
  template void launch_relation_backward<P>(const RelationBackwardArgs&, cudaStream_t);
QUIVER_RELATION_INSTANTIATE(16)
QUIVER_RELATION_INSTANTIATE(32)
QUIVER_RELATION_INSTANTIATE(48)
QUIVER_RELATION_INSTANTIATE(64)
QUIVER_RELATION_INSTANTIATE(80)
QUIVER_RELATION_INSTANTIATE(96)
QUIVER_RELATION_INSTANTIATE(112)
QUIVER_RELATION_INSTANTIATE(128)
#undef QUIVER_RELATION_INSTANTIATE

}  // namespace quiver::cuda::detail
