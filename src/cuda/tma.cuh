// The device side of the tensor memory accelerator (sm_90): boxes of a matrix described by a
// CUtensorMap (cuda/tma.h) copied into shared memory, and the mbarriers that count the bytes of
// a stage's copies. Protocol of one stage: one thread initializes the barrier (count: its
// arrivals) and everyone syncs; per use, one thread arms it with the stage's total bytes
// (expect_tx) and issues the loads; the consumers wait for the phase, which flips once all
// bytes have landed.
// With the 32-, 64- or 128-byte swizzle of its map, a box of 16-, 32- or 64-column rows lands in
// exactly the layout of a wgmma::Panels panel (cuda/wgmma.cuh).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "cuda/mma_ptx.cuh"

namespace quiver::cuda::detail::tma {

__device__ __forceinline__ void init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes initialized barriers visible to the copy engine; then the block syncs.
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also expects `bytes` more of copies before the phase completes.
__device__ __forceinline__ void arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// One arrival (a stage released by its consumers).
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Whether the barrier's phase with parity `phase` (0, 1, 0, ... per use) has completed (after
// a bounded time the hardware may suspend the thread in).
__device__ __forceinline__ bool try_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done = 0;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(phase)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) {
  while (!try_wait(bar, phase)) {
  }
}

// The box at column c0, row r0 of `map` into `dst` (1024-byte aligned for the 128-byte swizzle),
// its bytes counted on `bar`.
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int r0) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(smem_addr(bar))
      : "memory");
}

// Multicast: the box at column c0, row r0 of `map` into `dst` of every block of the cluster whose
// rank is a bit of `mask` (the same shared-memory offset in each), its bytes counted on each
// one's barrier at `bar`'s offset. Each receiver arms its own barrier with the bytes it expects.
__device__ __forceinline__ void load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int r0,
                                                  uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}

// One arrival on the barrier at `bar`'s offset in the cluster's block of rank `rank` (a stage
// released to a block that multicasts into it).
__device__ __forceinline__ void arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nmbarrier.arrive.release.cluster.shared::cluster.b64 "
      "_, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}

// The box at coordinates (c0, c1, c2) of a rank-3 `map` into `dst`, its bytes counted on `bar`.
__device__ __forceinline__ void load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// The box at coordinates (c0, c1, c2, c3) of a rank-4 `map` into `dst`, its bytes counted on `bar`.
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// Stores: the box of shared memory at `src` (laid out as a load of the same box would leave it)
// to coordinates (c0, c1, c2[, c3]) of a rank-3 or rank-4 `map`, as one bulk group of the
// issuing thread; the parts of the box outside the map's dimensions are not written. The writers
// of `src` fence their stores (fence_proxy_async_shared) and synchronize with the issuing thread
// first; `src` may be rewritten once bulk_wait_read (mma_ptx.cuh) returns.
__device__ __forceinline__ void store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

}  // namespace quiver::cuda::detail::tma
