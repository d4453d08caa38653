// The sampling kernel of src/cuda/sampler.h. One block of kThreads threads per row, two paths
// with the same kept set and the same draw:
// - top-k of 1..kThreads (sample_top_k): a lower bound of the k-th largest key from the
//   per-thread maxima, the ids at or above it gathered into shared memory and sorted there.
//   When more than kCandidates ids pass the bound (heavy ties), the row takes the radix path.
// - otherwise (sample_radix): thread t owns the contiguous ids [t·chunk, (t+1)·chunk), so "in
//   id order" is thread order, then chunk order. Selections are radix selects over the
//   order-preserving integer keys of the logits, 8 bits per pass: by count for top-k, by
//   fixed-point mass for top-p. Greedy rows take its argmax.
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

// The fixed-point weight of logit z: exp((z − z_max)·inv_temperature) · 2^40, truncated; NaN: 0.
// Both paths call this one function, so that they agree to the bit.
__device__ __forceinline__ uint64_t fixed_weight(float z, float z_max, float inv_temperature) {
  if (z != z) return 0;
  return static_cast<uint64_t>(static_cast<double>(__expf((z - z_max) * inv_temperature)) * kFixedScale);
}

// The draw's point in [0, total): floor(u · total), u uniform in [0, 1) from a counter-based
// hash of (seed, pos).
__device__ __forceinline__ uint64_t draw_target(uint64_t seed, int32_t pos, uint64_t total) {
  const uint64_t counter = static_cast<uint64_t>(static_cast<int64_t>(pos));
  const uint64_t bits = mix64(seed ^ mix64(counter + 0x632be59bd9b4e019ull)) >> 11;  // 53 bits
  const double u = static_cast<double>(bits) * (1.0 / 9007199254740992.0);
  const uint64_t target = static_cast<uint64_t>(u * static_cast<double>(total));
  return target < total ? target : total - 1;
}

// Any row: the general path (see the top of the file). Returns the chosen id.
__device__ int64_t sample_radix(const SampleArgs& a, const uint16_t* row) {
  __shared__ unsigned long long hist[256];
  __shared__ uint64_t warp_sums[kWarps];
  __shared__ uint64_t shared_u64[2];
  __shared__ uint32_t shared_prefix;
  __shared__ float shared_f[kWarps];
  __shared__ int64_t shared_i[kWarps];

  const int64_t b = blockIdx.x, V = a.V;
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

    auto weight = [&](float z) { return fixed_weight(z, z_max, a.inv_temperature); };
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
      const uint64_t target = draw_target(a.seeds[b], *a.pos, total);
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
  return chosen;
}

// ---- The top-k path ----

constexpr int kCandidates = 4096;  // ids at or above the bound that fit in shared memory
constexpr int kUnroll = 4;         // 16-byte loads in flight per thread

// The bf16 logit in halfword i (0..7) of q; halfword 0 is the lowest address.
__device__ __forceinline__ float bf16_at(const uint4& q, int i) {
  const uint32_t word = i < 2 ? q.x : i < 4 ? q.y : i < 6 ? q.z : q.w;
  return bf16_load(static_cast<uint16_t>(i % 2 ? word >> 16 : word & 0xffffu));
}

// Calls visit(q, first, n) so that every id of the row is passed exactly once, and every thread
// calls it the same number of times (visit may use warp collectives): q holds the logits of ids
// first .. first + n − 1 in its halfwords 0 .. n − 1, n in 0..8. The body of the row is read as
// coalesced 16-byte vectors; the ids before its first 16-byte boundary and after its last, one
// per thread.
template <class Visit>
__device__ void visit_row(const uint16_t* row, int64_t V, Visit visit) {
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) & 15u) / 2;
  const int64_t head = misalign == 0 ? 0 : (8 - misalign < V ? 8 - misalign : V);
  const int64_t vectors = (V - head) / 8;
  const int64_t tail = head + 8 * vectors;
  const uint4* body = reinterpret_cast<const uint4*>(row + head);
  for (int64_t v0 = 0; v0 < vectors; v0 += kUnroll * kThreads) {
    uint4 q[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kThreads + threadIdx.x;
      q[u] = v < vectors ? __ldg(body + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kThreads + threadIdx.x;
      visit(q[u], head + 8 * v, v < vectors ? 8 : 0);
    }
  }
  const int64_t t = threadIdx.x;
  const int64_t id = t < head ? t : tail + (t - head);
  const bool valid = id < V;
  visit(make_uint4(valid ? row[id] : 0u, 0, 0, 0), id, valid ? 1 : 0);
}

__device__ __forceinline__ uint32_t warp_inclusive_scan(uint32_t v) {
  const int lane = threadIdx.x % 32;
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t up = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += up;
  }
  return v;
}

// Sorts one key per thread across the block, largest first; returns the key of rank threadIdx.x.
// Bitonic: partners within a warp exchange through shuffles, the others through buf[kThreads].
__device__ uint32_t block_sort_desc(uint32_t x, uint32_t* buf) {
  const int t = threadIdx.x;
  for (int k = 2; k <= kThreads; k *= 2)
    for (int j = k / 2; j > 0; j /= 2) {
      uint32_t other;
      if (j >= 32) {
        buf[t] = x;
        __syncthreads();
        other = buf[t ^ j];
        __syncthreads();
      } else {
        other = __shfl_xor_sync(0xffffffffu, x, j);
      }
      const bool keep_max = ((t & j) == 0) == ((t & k) == 0);
      x = keep_max ? max(x, other) : min(x, other);
    }
  return x;
}

// Sorts v[0, n) in shared memory, n a power of two, so that before(v[l], v[i]) fails for i < l.
// Bitonic. The caller's writes to v precede a barrier; the sort ends with one.
template <class Before>
__device__ void block_sort(uint64_t* v, int n, Before before) {
  for (int k = 2; k <= n; k *= 2)
    for (int j = k / 2; j > 0; j /= 2) {
      for (int p = threadIdx.x; p < n / 2; p += kThreads) {
        const int i = 2 * p - (p & (j - 1)), l = i + j;
        const uint64_t x = v[i], y = v[l];
        if ((i & k) == 0 ? before(y, x) : before(x, y)) {
          v[i] = y;
          v[l] = x;
        }
      }
      __syncthreads();
    }
}

// A candidate as one integer: larger means larger key, then smaller id (ids are < 2^31, so a
// candidate is never 0, the padding).
__device__ __forceinline__ uint64_t candidate(uint32_t key, int64_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ uint32_t candidate_key(uint64_t c) { return static_cast<uint32_t>(c >> 32); }
__device__ __forceinline__ int64_t candidate_id(uint64_t c) { return 0xffffffffu - static_cast<uint32_t>(c); }

__device__ __forceinline__ int next_pow2(uint32_t n) {
  int p = 1;
  while (static_cast<uint32_t>(p) < n) p *= 2;
  return p;
}

union TopKShared {
  uint64_t candidates[kCandidates];  // candidate(), then the kept (id << 32 | rank) for the draw
  uint32_t maxima[kThreads];         // the sort of the per-thread maxima, before the gather
};

// Rows with 1 ≤ top_k ≤ kThreads, not greedy. Returns the chosen id, or −1 when more than
// kCandidates ids have a key at or above the bound (then the caller takes the radix path).
//
// Exact: each thread's maximum is the key of one of its ids (an empty thread's is 0, which every
// id meets), so at least k = min(top_k, V) ids have a key ≥ m_k, the k-th largest maximum. Every
// id below m_k ranks after all of those, so the first k candidates (key ≥ m_k) in (key desc,
// id asc) order are the top-k set, its ties in id order. The nucleus is the shortest prefix of
// that order whose mass reaches the radix path's target, which is the radix path's cut (equal
// keys have equal weights). The draw scans the kept ids in id order with the same point.
__device__ int64_t sample_top_k(const SampleArgs& a, const uint16_t* row) {
  __shared__ TopKShared s;
  __shared__ uint64_t weight_of_rank[kThreads];
  __shared__ uint64_t warp_sums[kWarps];
  __shared__ uint32_t shared_count, shared_bound, shared_keep;
  __shared__ int64_t shared_pick;

  const int64_t V = a.V;
  const int t = threadIdx.x, lane = t % 32;
  const int k = static_cast<int>(a.top_k < V ? a.top_k : V);

  // The bound m_k.
  uint32_t my_max = 0;
  visit_row(row, V, [&](const uint4& q, int64_t, int n) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) my_max = max(my_max, order_key(bf16_at(q, i)));
  });
  const uint32_t ranked = block_sort_desc(my_max, s.maxima);
  if (t == k - 1) shared_bound = ranked;
  if (t == 0) shared_count = 0;
  __syncthreads();
  const uint32_t bound = shared_bound;

  // The candidates, in any order: one shared atomic per warp and step that finds any.
  visit_row(row, V, [&](const uint4& q, int64_t first, int n) {
    uint32_t hits = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n && order_key(bf16_at(q, i)) >= bound) hits |= 1u << i;
    if (!__any_sync(0xffffffffu, hits != 0)) return;
    const uint32_t c = __popc(hits);
    const uint32_t inclusive = warp_inclusive_scan(c);
    uint32_t base = 0;
    if (lane == 31) base = atomicAdd(&shared_count, inclusive);
    uint32_t slot = __shfl_sync(0xffffffffu, base, 31) + inclusive - c;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if ((hits >> i) & 1u) {
        if (slot < kCandidates) s.candidates[slot] = candidate(order_key(bf16_at(q, i)), first + i);
        ++slot;
      }
  });
  __syncthreads();
  const uint32_t count = shared_count;
  if (count > kCandidates) return -1;

  const int n = next_pow2(count);
  for (int i = static_cast<int>(count) + t; i < n; i += kThreads) s.candidates[i] = 0;
  __syncthreads();
  block_sort(s.candidates, n, [](uint64_t x, uint64_t y) { return x > y; });

  // The first candidate is the maximum, lowest id among equals.
  const int64_t argmax = candidate_id(s.candidates[0]);
  const float z_max = key_value(candidate_key(s.candidates[0]));
  if (!(z_max > -INFINITY && z_max < INFINITY)) return argmax;  // NaN too: every logit is NaN

  // The top-k weights by rank, their prefix masses, and the nucleus: ranks [0, keep).
  const uint64_t mine = t < k ? s.candidates[t] : 0;
  const uint64_t w = t < k ? fixed_weight(key_value(candidate_key(mine)), z_max, a.inv_temperature) : 0;
  uint64_t mass_k = 0;
  const uint64_t below = block_exclusive_scan(w, warp_sums, &mass_k);
  int keep = k;
  if (a.top_p < 1.0 && mass_k > 0) {
    uint64_t target = static_cast<uint64_t>(ceil(a.top_p * static_cast<double>(mass_k)));
    if (target < 1) target = 1;
    if (target > mass_k) target = mass_k;
    // Exactly one rank is where the prefix mass first reaches the target.
    if (t < k && below < target && target <= below + w) shared_keep = static_cast<uint32_t>(t + 1);
    __syncthreads();
    keep = static_cast<int>(shared_keep);
  }
  if (keep == 1) return argmax;

  // The draw: the kept (id, rank) pairs sorted by id, their weights scanned in that order.
  if (t < keep) weight_of_rank[t] = w;
  const int m = next_pow2(static_cast<uint32_t>(keep));
  if (t < m)
    s.candidates[t] = t < keep ? (static_cast<uint64_t>(candidate_id(mine)) << 32) | static_cast<uint32_t>(t) : ~0ull;
  __syncthreads();
  block_sort(s.candidates, m, [](uint64_t x, uint64_t y) { return x < y; });
  uint64_t w_id = 0;
  int64_t id = 0;
  if (t < keep) {
    const uint64_t e = s.candidates[t];
    id = static_cast<int64_t>(e >> 32);
    w_id = weight_of_rank[static_cast<uint32_t>(e)];
  }
  uint64_t total = 0;
  const uint64_t before = block_exclusive_scan(w_id, warp_sums, &total);
  if (total == 0) return argmax;
  const uint64_t target = draw_target(a.seeds[blockIdx.x], *a.pos, total);
  if (t < keep && before <= target && target < before + w_id) shared_pick = id;
  __syncthreads();
  return shared_pick;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
  const int64_t b = blockIdx.x;
  const uint16_t* row = a.logits + b * a.V;
  int64_t chosen = -1;
  if (!a.greedy && a.top_k >= 1 && a.top_k <= kThreads) chosen = sample_top_k(a, row);
  if (chosen < 0) chosen = sample_radix(a, row);
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
