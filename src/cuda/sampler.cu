// The sampling kernel of src/cuda/sampler.h. One block of kThreads threads per row; thread t
// owns the contiguous ids [t·chunk, (t+1)·chunk), so "in id order" is thread order, then
// chunk order. Selections are radix selects over the order-preserving integer keys of the
// logits, 8 bits per pass: by count for top-k, by fixed-point mass for top-p.
#include <cstdint>

#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/sampler_launch.h"

namespace quiver::cuda::detail {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr double kFixedScale = 1099511627776.0;  // 2^40: weights in (0, 1] as integers

// Larger logit -> larger key; NaN -> 0 (never kept unless everything is NaN).
__device__ __forceinline__ uint32_t order_key(float z) {
  if (z != z) return 0u;
  const uint32_t u = __float_as_uint(z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Exclusive prefix sum over the block in thread order; *total receives the sum.
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* warp_sums, uint64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t inclusive = v;
  for (int off = 1; off < 32; off *= 2) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    uint64_t w = lane < kWarps ? warp_sums[lane] : 0;
    for (int off = 1; off < 32; off *= 2) {
      const uint64_t up = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += up;
    }
    if (lane < kWarps) warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const uint64_t before = warp == 0 ? 0 : warp_sums[warp - 1];
  *total = warp_sums[kWarps - 1];
  __syncthreads();
  return before + inclusive - v;
}

// Radix select over keys: the largest key t such that the weight of the ids with key >= t
// reaches `target`, where weight_of(z, key, rank) gives an id's weight (0: excluded) and rank
// is its rank in id order among the ids with key == rank_key (rank_base: this thread's first
// rank). Returns t; *left receives what the ids with key == t must still contribute.
template <class WeightOf>
__device__ uint32_t radix_select(const uint16_t* row, int64_t begin, int64_t end, uint64_t target,
                                 WeightOf weight_of, uint32_t rank_key, uint64_t rank_base,
                                 unsigned long long* hist, uint64_t* shared_left,
                                 uint32_t* shared_prefix, uint64_t* left) {
  uint32_t prefix = 0, mask = 0;
  uint64_t remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) hist[d] = 0;
    __syncthreads();
    uint64_t rank = rank_base;
    for (int64_t i = begin; i < end; ++i) {
      const float z = bf16_load(row[i]);
      const uint32_t key = order_key(z);
      const uint64_t w = weight_of(z, key, rank);
      rank += key == rank_key;
      if (w == 0 || (key & mask) != prefix) continue;
      atomicAdd(&hist[(key >> shift) & 255u], static_cast<unsigned long long>(w));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      for (; d > 0; --d) {
        if (hist[d] >= remaining) break;
        remaining -= hist[d];
      }
      *shared_prefix = prefix | (static_cast<uint32_t>(d) << shift);
      *shared_left = remaining;
    }
    __syncthreads();
    prefix = *shared_prefix;
    remaining = *shared_left;
    mask |= 255u << shift;
    __syncthreads();
  }
  *left = remaining;
  return prefix;
}

// The float whose order_key is `key`.
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
  __shared__ unsigned long long hist[256];
  __shared__ uint64_t warp_sums[kWarps];
  __shared__ uint64_t shared_u64[2];
  __shared__ uint32_t shared_prefix;
  __shared__ float shared_f[kWarps];
  __shared__ int64_t shared_i[kWarps];

  const int64_t b = blockIdx.x, V = a.V;
  const uint16_t* row = a.logits + b * V;
  const int64_t chunk = (V + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * chunk < V ? threadIdx.x * chunk : V;
  const int64_t end = begin + chunk < V ? begin + chunk : V;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // The maximum (lowest id among equals): the greedy answer and the softmax shift.
  float best = -INFINITY;
  int64_t best_id = V;
  for (int64_t i = begin; i < end; ++i) {
    const float z = bf16_load(row[i]);
    if (z == z && (best_id == V || z > best)) {
      best = z;
      best_id = i;
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, best_id, off);
    if (ob > best || (ob == best && oi < best_id)) {
      best = ob;
      best_id = oi;
    }
  }
  if (lane == 0) {
    shared_f[warp] = best;
    shared_i[warp] = best_id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w)
      if (shared_f[w] > shared_f[0] || (shared_f[w] == shared_f[0] && shared_i[w] < shared_i[0])) {
        shared_f[0] = shared_f[w];
        shared_i[0] = shared_i[w];
      }
  }
  __syncthreads();
  const float z_max = shared_f[0];
  const int64_t argmax = shared_i[0] < V ? shared_i[0] : 0;
  __syncthreads();

  int64_t chosen = argmax;
  if (!a.greedy && z_max > -INFINITY && z_max < INFINITY) {
    // Top-k: keys above tk, and the first `k_ties` ids with key == tk.
    uint32_t tk = 0;
    uint64_t k_ties = ~0ull;
    if (a.top_k > 0 && a.top_k < V)
      tk = radix_select(row, begin, end, static_cast<uint64_t>(a.top_k),
                        [](float, uint32_t, uint64_t) -> uint64_t { return 1; }, 0u, 0, hist,
                        &shared_u64[0], &shared_prefix, &k_ties);
    // Rank of each id among those with key == tk (thread order = id order).
    uint64_t my_ties = 0;
    for (int64_t i = begin; i < end; ++i) my_ties += order_key(bf16_load(row[i])) == tk;
    uint64_t ties_total = 0;
    const uint64_t tie_base = block_exclusive_scan(my_ties, warp_sums, &ties_total);

    auto weight = [&](float z) -> uint64_t {
      if (z != z) return 0;
      return static_cast<uint64_t>(static_cast<double>(__expf((z - z_max) * a.inv_temperature)) * kFixedScale);
    };
    // Kept by top-k: weight, else 0. `rank` is the id's rank among key == tk ids.
    auto kept_k = [&](uint32_t key, uint64_t rank) { return key > tk || (key == tk && rank < k_ties); };

    uint64_t my_mass = 0;
    {
      uint64_t rank = tie_base;
      for (int64_t i = begin; i < end; ++i) {
        const float z = bf16_load(row[i]);
        const uint32_t key = order_key(z);
        if (kept_k(key, rank)) my_mass += weight(z);
        rank += key == tk;
      }
    }
    uint64_t mass_k = 0;
    block_exclusive_scan(my_mass, warp_sums, &mass_k);

    // Top-p among the kept: keys above tp, and the first `p_ties` kept ids with key == tp.
    uint32_t tp = 0;
    uint64_t p_ties = ~0ull;
    uint64_t tp_base = 0;
    if (a.top_p < 1.0 && mass_k > 0) {
      uint64_t target = static_cast<uint64_t>(ceil(a.top_p * static_cast<double>(mass_k)));
      if (target < 1) target = 1;
      if (target > mass_k) target = mass_k;
      uint64_t left = 0;
      tp = radix_select(row, begin, end, target,
                        [&](float z, uint32_t key, uint64_t rank) -> uint64_t {
                          return kept_k(key, rank) ? weight(z) : 0;
                        },
                        tk, tie_base, hist, &shared_u64[0], &shared_prefix, &left);
      // Every id with key == tp has the same weight; that many of them (in id order) are needed.
      const uint64_t w_tp = weight(key_value(tp));
      p_ties = w_tp > 0 ? (left + w_tp - 1) / w_tp : 1;
      if (p_ties < 1) p_ties = 1;
      uint64_t my_tp = 0;
      for (int64_t i = begin; i < end; ++i) my_tp += order_key(bf16_load(row[i])) == tp;
      uint64_t unused = 0;
      tp_base = block_exclusive_scan(my_tp, warp_sums, &unused);
    }
    auto kept_all = [&](uint32_t key, uint64_t rank_k, uint64_t rank_p) {
      return kept_k(key, rank_k) && (key > tp || (key == tp && rank_p < p_ties));
    };

    // The final weights in id order, and the draw.
    uint64_t my_final = 0;
    {
      uint64_t rk = tie_base, rp = tp_base;
      for (int64_t i = begin; i < end; ++i) {
        const float z = bf16_load(row[i]);
        const uint32_t key = order_key(z);
        if (kept_all(key, rk, rp)) my_final += weight(z);
        rk += key == tk;
        rp += key == tp;
      }
    }
    uint64_t total = 0;
    const uint64_t before = block_exclusive_scan(my_final, warp_sums, &total);
    if (total > 0) {
      const uint64_t seed = a.seeds[b];
      const uint64_t counter = static_cast<uint64_t>(static_cast<int64_t>(*a.pos));
      const uint64_t bits = mix64(seed ^ mix64(counter + 0x632be59bd9b4e019ull)) >> 11;  // 53 bits
      const double u = static_cast<double>(bits) * (1.0 / 9007199254740992.0);
      uint64_t target = static_cast<uint64_t>(u * static_cast<double>(total));
      if (target >= total) target = total - 1;
      if (threadIdx.x == 0) shared_u64[1] = static_cast<uint64_t>(argmax);
      __syncthreads();
      if (target >= before && target < before + my_final) {
        uint64_t acc = before, rk = tie_base, rp = tp_base;
        for (int64_t i = begin; i < end; ++i) {
          const float z = bf16_load(row[i]);
          const uint32_t key = order_key(z);
          if (kept_all(key, rk, rp)) {
            acc += weight(z);
            if (target < acc) {
              shared_u64[1] = static_cast<uint64_t>(i);
              break;
            }
          }
          rk += key == tk;
          rp += key == tp;
        }
      }
      __syncthreads();
      chosen = static_cast<int64_t>(shared_u64[1]);
    }
  }
  if (threadIdx.x == 0) {
    a.tokens[b] = static_cast<int32_t>(chosen);
    if (a.history) a.history[b * a.history_stride + (*a.pos - a.origin)] = static_cast<int32_t>(chosen);
  }
}

}  // namespace

void launch_sample(const SampleArgs& args, cudaStream_t stream) {
  if (args.B == 0) return;
  sample_kernel<<<static_cast<unsigned>(args.B), kThreads, 0, stream>>>(args);
  QV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quiver::cuda::detail
