// The pair kernel (algproj_fused_launch.h: AlgPairArgs), the forward over a pair plan
// (ops::plan_pair_pass): every output group of a tile reduces over two input blocks at most,
// its own and the row type's, each `in` columns, so a tile's whole reduction is known from its
// record and fits one stage. Narrow groups (Q_256 at Qwen3-32B: blocks of 20 into groups of 100)
// make such tiles short: the kernel is built so that a tile costs little more than its products
// and its output's store.
//
// Block b takes the tiles from segment b · S / G of the plan to segment (b + 1) · S / G (S segments,
// G blocks), in order. One producer warp (its lane 0) walks them: per tile
// it waits for a free stage of the ring, copies the tile's record into the stage's header, arms the
// stage's full barrier with its bytes and issues its TMA loads: groups + 1 boxes of x (the tile's
// rows, slot columns from the 8-column boundary at or below each block's first column: its own
// blocks and the typed block) and, per group, W's rows of its own block and of the typed block at
// the group's columns, in 128-byte-swizzled panels of 64 columns (conflict-free ldmatrix.trans).
// In the merged configurations the two groups' own blocks come in one x box instead, group 1's
// kAlgPairOwnGap columns after group 0's.
//
// In the lane-producer configurations lane 0 of consumer warp 0 does the producer's work instead:
// it fills the ring first, and at each later tile refills the stage of the tile before.
//
// Consumer warps own 32 rows × one 64-column panel of one group (warp rows of groups · panels
// warps). A warp's reduction runs over 2 · slot positions in slot / 8 k16 steps of mma.sync
// m16n8k16, step st taking its first 8 positions from its own block's box (chunk st) and its last
// 8 from the typed block's (chunk st), so that each lane reads one box at one pitch; the A
// fragments at positions outside a box's block (the neighbouring blocks' columns that the box
// starts early or ends late with), and the whole typed box where the group does not reduce over
// it, are zeroed in registers, so only the law's products count. Then the warp releases the
// stage, and each warp row lays its 32 rows of the tile out in bf16 in its staging, 8 panels of 64
// columns (128-byte swizzled) used round, and stores each 64-column box that the tile finishes (the
// tile before, the same block's, left the box's first columns there), while the next tile's products
// run. A row's last tile stores through its end.
//
// W's columns next to a group's (a box starts up to 7 columns before it, and a panel may run past
// it) give products in accumulators that are never stored; x's columns next to a block meet zeros.
// The masked positions multiply W's rows of the neighbouring blocks by zero, so a non-finite weight
// there would turn the product into NaN: weights are finite.
#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

#include "cuda/algproj_fused_launch.h"
#include "cuda/block_launch.cuh"
#include "cuda/check.h"
#include "cuda/mma_ptx.cuh"
#include "cuda/pdl.cuh"
#include "cuda/tma.cuh"

namespace quiver::cuda::detail {
namespace {

// Four 4-byte shared stores if `on` (predicated: no branch).
__device__ __forceinline__ void sts4_b32_if(const uint32_t (&addr)[4], const uint32_t (&v)[4], uint32_t on) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %8, 0;\n"
      " @p st.shared.b32 [%0], %4;\n @p st.shared.b32 [%1], %5;\n"
      " @p st.shared.b32 [%2], %6;\n @p st.shared.b32 [%3], %7;\n}\n" ::"r"(addr[0]),
      "r"(addr[1]), "r"(addr[2]), "r"(addr[3]), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]), "r"(on)
      : "memory");
}
// Named barrier `id` (1..) of `threads` threads: wait for all of them, or only arrive.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int C, int S>
struct PairLayout {
  static constexpr AlgPairConfig cfg = kAlgPairConfigs[C];
  static constexpr int BM = cfg.rows, G = cfg.groups, kStages = cfg.stages;
  static constexpr int kPanels = cfg.group_box / 64;
  static constexpr int kRowWarps = G * kPanels;  // warps of one warp row
  static constexpr int kConsumerWarps = BM / 32 * kRowWarps;
  static constexpr bool kLaneProducer = cfg.lane_producer;
  static constexpr int kThreads = 32 * (kConsumerWarps + (kLaneProducer ? 0 : 1));
  static constexpr bool kMerged = cfg.merged_own;
  static constexpr int kOwnCols = kMerged ? S + kAlgPairOwnGap : S;  // columns of an own box
  static constexpr uint32_t kXBox = BM * S * 2;                      // bytes of one x box
  static constexpr uint32_t kOwnBox = BM * kOwnCols * 2;             // bytes of the (merged) own box
  static constexpr uint32_t kPanel = S * 128;  // bytes of one W panel: S rows of 64 columns
  // The stage's x boxes: merged, the own box then the typed box; else group 0's own box, the
  // typed box, group 1's own box.
  static constexpr uint32_t kStageX = kMerged ? kOwnBox + kXBox : (G + 1) * kXBox;
  static constexpr uint32_t kTypedAt = kMerged ? kOwnBox : kXBox;
  static constexpr uint32_t kStageW = 2 * G * kPanels * kPanel;
  static constexpr int kSteps = S / 8;  // k16 steps: 8 positions of the own box and 8 of the typed box
  static_assert(BM % 32 == 0 && cfg.group_box % 64 == 0 && S % 16 == 8 && kOwnCols % 16 == 8,
                "warps of 32 × 64; boxes of odd multiples of 8 columns");
  static_assert(!kMerged || G == 2, "a merged own box holds two groups' blocks");
  static_assert(kPanel % 1024 == 0 && kXBox % 128 == 0 && kOwnBox % 128 == 0 && kStageX % 1024 == 0,
                "swizzled panels on 1024-byte boundaries");
  static constexpr uint32_t kStagingPanel = 32 * 128;  // 32 rows × 64 columns
  static constexpr uint32_t kStagingRow = kAlgPairStagingPanels * kStagingPanel;  // a warp row's panels
};

template <int C, int S>
__global__ void __launch_bounds__(PairLayout<C, S>::kThreads, 1) algproj_pair_kernel(const __grid_constant__ AlgPairArgs p) {
  using L = PairLayout<C, S>;
  constexpr int G = L::G, kStages = L::kStages, kPanels = L::kPanels, kSteps = L::kSteps;
  extern __shared__ uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  __shared__ ops::AlgPairTile header[kStages];
  // The ring's W panels (1024-byte aligned for the 128-byte swizzle), its x boxes, the staging.
  const uint32_t raw = smem_addr(smem);
  const uint32_t w_ring = (raw + 1023) & ~1023u;
  const uint32_t x_ring = w_ring + kStages * L::kStageW;
  const uint32_t staging = x_ring + kStages * L::kStageX;
  auto at = [&](uint32_t addr) { return smem + (addr - raw); };
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      tma::init(&full[s], 1);
      tma::init(&empty[s], L::kConsumerWarps);
    }
    tma::fence_init();
  }
  __syncthreads();
  pdl_trigger();  // a programmatic dependent (block_launch.cuh): the plan before, x, W and y after
  pdl_wait();
  // This block's tiles [first, last).
  const int first = alg_pair_first_tile(p.segments, p.num_segments, blockIdx.x, gridDim.x);
  const int last = alg_pair_first_tile(p.segments, p.num_segments, blockIdx.x + 1, gridDim.x);

  // A tile's record into a stage's header, and its boxes into the stage.
  auto issue = [&](const ops::AlgPairTile& t, int stage) {
    header[stage] = t;
    tma::arrive_expect(&full[stage], L::kStageX + L::kStageW);
    const int c1 = t.row0 % p.stride, c2 = t.row0 / p.stride;
    const uint32_t xs = x_ring + stage * L::kStageX, ws = w_ring + stage * L::kStageW;
    if constexpr (L::kMerged) {
      tma::load_3d(at(xs), &p.x_own, &full[stage], t.k_own[0] & ~7, c1, c2);
      tma::load_3d(at(xs + L::kTypedAt), &p.x, &full[stage], t.k_typed & ~7, c1, c2);
    } else {
#pragma unroll
      for (int b = 0; b <= G; ++b)  // own block of group 0, the typed block, own block of group 1
        tma::load_3d(at(xs + b * L::kXBox), &p.x, &full[stage], (b == 1 ? t.k_typed : t.k_own[b / 2]) & ~7, c1, c2);
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int typed = 0; typed < 2; ++typed)
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn)
          tma::load_2d(at(ws + ((2 * g + typed) * kPanels + pn) * L::kPanel), &p.w, &full[stage],
                       t.w_col[g] + 64 * pn, (typed ? t.k_typed : t.k_own[g]) & ~7);
  };
  // With a lane producer: the tile whose record `next` holds (refilling the stage of tile n − 1
  // at tile n with tile n − 1 + kStages).
  ops::AlgPairTile next{};
  if constexpr (L::kLaneProducer) {
    if (tid == 0) {
      int tile = first;
      for (int s = 0; s < kStages && tile < last; ++s, ++tile) issue(p.tiles[tile], s);
      if (tile < last) next = p.tiles[tile];
    }
  } else if (warp == L::kConsumerWarps) {  // the producer warp
    if (lane != 0) return;
    next = first < last ? p.tiles[first] : ops::AlgPairTile{};
    for (int tile = first, n = 0; tile < last; ++tile, ++n) {
      const ops::AlgPairTile t = next;
      if (tile + 1 < last) next = p.tiles[tile + 1];
      const int stage = n % kStages;
      if (n >= kStages) tma::wait(&empty[stage], ((n / kStages) & 1) ^ 1);
      issue(t, stage);
    }
    return;
  }

  // ---- consumers: warp (row wr, group g, panel pn) ----
  const int wr = warp / L::kRowWarps, g = warp / kPanels % G, pn = warp % kPanels;
  const int grp = lane >> 2, tig = lane & 3;
  // This lane's ldmatrix addresses within a stage, per k16 step: A, row wr·32 + (lane & 15) at
  // position 8 st of the own box (lanes 0-15) or the typed box (16-31), mi's rows 16 rows on (a_mi);
  // B, row 8 st + (lane & 7) of the own (lane bit 3 clear) or the typed panel, the 16-byte chunk
  // ni + (lane >> 4) swizzled by the row (b_col, per pair of n8 tiles).
  const bool a_typed = lane >> 4;
  const int own_at = L::kMerged ? 2 * kAlgPairOwnGap * g : (G == 2 && g == 1 ? 2 : 0) * L::kXBox;
  const int a_pitch = 2 * (a_typed ? S : L::kOwnCols);
  const uint32_t a_base = (a_typed ? L::kTypedAt : own_at) + (wr * 32 + (lane & 15)) * a_pitch;
  const uint32_t a_mi = 16 * a_pitch;
  uint32_t a_off[kSteps], b_off[kSteps], b_col[4];
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    a_off[st] = a_base + 16 * st;
    b_off[st] = ((2 * g + ((lane >> 3) & 1)) * kPanels + pn) * L::kPanel + (8 * st + (lane & 7)) * 128;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) b_col[j] = ((2 * j + (lane >> 4)) ^ (lane & 7)) << 4;
  const bool row_leader = warp % L::kRowWarps == 0;  // its lane 0 issues the warp row's stores
  const bool storer = row_leader && lane == 0;

  for (int tile = first, n = 0; tile < last; ++tile, ++n) {
    if constexpr (L::kLaneProducer) {
      const int refill = tile + kStages - 1;  // tile n − 1 + kStages
      if (tid == 0 && n >= 1 && refill < last) {
        const int s = (n - 1) % kStages;
        tma::wait(&empty[s], ((n - 1) / kStages) & 1);  // every warp has read tile n − 1
        issue(next, s);
        if (refill + 1 < last) next = p.tiles[refill + 1];
      }
    }
    const int stage = n % kStages;
    tma::wait(&full[stage], (n / kStages) & 1);
    const ops::AlgPairTile& h = header[stage];
    const int row0 = h.row0, col0 = h.col0, lead_own = h.k_own[g] & 7, lead_typed = h.k_typed & 7;
    const bool typed = (h.typed >> g) & 1;
    const int col_at = h.w_col[g] - col0, lo = h.shift[g];  // tile column of box column 0; the group's first
    // Bits 2 c and 2 c + 1: this lane's positions 8 c + 2 tig, + 1 of the own box (from the
    // group's 8-column boundary) and of the typed box lie in a block the group reduces over.
    uint32_t mask = 0;
#pragma unroll
    for (int c = 0; c < kSteps; ++c) {
      const int o = 8 * c + 2 * tig;
      if (o >= lead_own && o < lead_own + p.in) mask |= 1u << (2 * c);
      if (typed && o >= lead_typed && o < lead_typed + p.in) mask |= 2u << (2 * c);
    }
    float acc[2][8][4] = {};
    const uint32_t xs = x_ring + stage * L::kStageX, ws = w_ring + stage * L::kStageW;
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        ldmatrix_x4(a[mi], xs + a_off[st] + mi * a_mi);
        if (!((mask >> (2 * st)) & 1)) a[mi][0] = a[mi][1] = 0;
        if (!((mask >> (2 * st + 1)) & 1)) a[mi][2] = a[mi][3] = 0;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, ws + b_off[st] + b_col[j]);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(acc[mi][2 * j], a[mi], b[0], b[1]);
          mma_bf16(acc[mi][2 * j + 1], a[mi], b[2], b[3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) tma::arrive(&empty[stage]);  // header and boxes read

    // Bit ni: this lane's columns of n8 tile ni are the group's in this tile.
    uint32_t cols_ok = 0;
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int bc = pn * 64 + ni * 8 + 2 * tig;  // box column
      if (bc >= lo && bc < lo + p.group_cols) cols_ok |= 1u << ni;
    }
    const int tc0 = col_at + pn * 64 + 2 * tig;  // tile column of n8 tile 0
    if (p.accumulate) {  // the outputs' old values join the products, before the staging is touched
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int64_t row = row0 + static_cast<int64_t>(p.stride) * (wr * 32 + mi * 16 + grp + 8 * hh);
#pragma unroll
          for (int ni = 0; ni < 8; ++ni)
            if ((cols_ok >> ni) & 1) {
              const float2 old = __bfloat1622float2(
                  *reinterpret_cast<const __nv_bfloat162*>(p.c + row * p.ldc + col0 + tc0 + ni * 8));
              acc[mi][ni][2 * hh] += old.x;
              acc[mi][ni][2 * hh + 1] += old.y;
            }
        }
    }

    // The warp row's 32 rows into its staging, then out. Barrier 2 wr + 1: the storer says the
    // panels this tile writes are free, the others wait for that; barrier 2 wr + 2: the others say
    // their part is written, the storer waits for that. Within a row the panels of this tile, of the
    // columns the last tile left and of the last tile's stores are 8 at most (kAlgPairMaxTileCols),
    // so only older stores must have read; a row's first tile waits for all.
    const uint32_t sc = staging + wr * L::kStagingRow;
    const int free_bar = 1 + 2 * wr, full_bar = 2 + 2 * wr, row_threads = 32 * L::kRowWarps;
    if (row_leader) {
      if (lane == 0) {
        if (col0 == 0)
          bulk_wait_read();
        else
          bulk_wait_read_all_but_last();
      }
      __syncwarp();
      named_arrive(free_bar, row_threads);
    } else {
      named_sync(free_bar, row_threads);
    }
    // Per n8 tile (y's columns c to c + 8: panel c / 64 mod 8, 16-byte chunk (c mod 64) / 8
    // swizzled by the row, grp), its four stores (rows grp + 8 (2 mi + hh)) under one predicate.
    // y's column of n8 tile 0 (not from the header: the stage is released, its header may be refilled).
    const int c_at = col0 + col_at + pn * 64;
    const uint32_t row_at = sc + grp * 128 + tig * 4;
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int c = c_at + ni * 8;
      const uint32_t at_c = row_at + alg_pair_panel(c) * L::kStagingPanel +
                            ((((c & 63) >> 3) ^ grp) << 4);
      uint32_t addr[4], v[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int mi = r / 2, hh = r % 2;
        const __nv_bfloat162 o = __floats2bfloat162_rn(acc[mi][ni][2 * hh], acc[mi][ni][2 * hh + 1]);
        v[r] = *reinterpret_cast<const uint32_t*>(&o);
        addr[r] = at_c + r * 8 * 128;
      }
      sts4_b32_if(addr, v, (cols_ok >> ni) & 1);
    }
    fence_proxy_async_shared();
    if (row_leader) {
      named_sync(full_bar, row_threads);
      if (lane == 0) {  // the 64-column boxes this tile finishes; a row's last tile, through its end
        const AlgPairStores out = alg_pair_stores(col0, p.tile_cols, p.n);
        for (int c = out.begin; c < out.end; c += 64)
          tma::store_3d(&p.y, at(sc + alg_pair_panel(c) * L::kStagingPanel), c, row0 % p.stride,
                        row0 / p.stride + wr * 32);
        tma::bulk_commit();
      }
    } else {
      named_arrive(full_bar, row_threads);
    }
  }
  if (storer) bulk_wait();  // the stores have left shared memory and landed
}

template <int C, int S>
void pair_config(const AlgPairArgs& a, cudaStream_t stream) {
  using L = PairLayout<C, S>;
  // The caller checks the shared memory against kAlgPairMaxSmem (alg_pair_runs); the kernel opts
  // in to the most any plan may take. One block a segment at most.
  const size_t smem = alg_pair_smem(kAlgPairConfigs[C], S);
  launch<algproj_pair_kernel<C, S>>(L::kThreads, smem, a.num_segments, true, a, stream, kAlgPairMaxSmem);
}

template <int S, int... I>
void pair_slot(const AlgPairArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, I...>) {
  ((config == I ? pair_config<I, S>(a, stream) : void()), ...);
}

template <int... J>
void pair_slots(const AlgPairArgs& a, int config, cudaStream_t stream, std::integer_sequence<int, J...>) {
  const auto configs = std::make_integer_sequence<int, kAlgPairConfigCount>{};
  ((a.slot == kAlgPairSlots[J] ? pair_slot<kAlgPairSlots[J]>(a, config, stream, configs) : void()), ...);
}

}  // namespace

void launch_algproj_pair(const AlgPairArgs& args, int config, cudaStream_t stream) {
  constexpr int kSlots = sizeof(kAlgPairSlots) / sizeof(kAlgPairSlots[0]);
  pair_slots(args, config, stream, std::make_integer_sequence<int, kSlots>{});
}

}  // namespace quiver::cuda::detail
