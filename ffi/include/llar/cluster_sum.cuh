// Cluster sum: one float per warp, summed over a thread block cluster (sm_90),
// bitwise the same total in every block, without a memory barrier.
//
// Contract
//   Every thread of every block of the cluster (launched with a cluster
//   dimension of `blocks` <= kMaxClusterBlocks along x, `warps` warps per
//   block) calls, in this order:
//     ClusterSumBegin(storage, blocks, warps)
//                                     once, early: thread 0 initialises the
//                                     block's mbarrier and every thread
//                                     arrives (relaxed) on the cluster
//                                     barrier;
//     ClusterSum(storage, value, blocks, warps)
//                                     once, with its warp's value in every
//                                     lane (e.g. after a butterfly, so lane 0
//                                     holds it): returns, in every thread of
//                                     the cluster, the sum of the cluster's
//                                     blocks * warps values, added in one
//                                     fixed order (slot s = block rank *
//                                     kMaxWarps + warp; lane l adds slots l,
//                                     l + 32, ... of the written ones in
//                                     that order, then a butterfly over the
//                                     lanes): the same operations on the
//                                     same values in every warp.
//   `storage` is a __shared__ ClusterSumStorage of the calling kernel.
//   A "cluster" of one block (blocks == 1) must be a launch without a
//   cluster dimension: then no cluster operation runs at all (below), and the
//   same order of addition gives the same bits.
//
// How (and why no memory barrier is needed)
//   Lane 0 of every warp stores its value, with st.async, into its slot of
//   every block of the cluster (itself included), each store completing 4
//   bytes of the transaction count of the target block's mbarrier. Thread 0
//   of each block arms its mbarrier for blocks * warps * 4 bytes with one
//   arrive.expect_tx; the phase completes when all of them have landed. The
//   readers wait on their own block's mbarrier with acquire at cluster scope,
//   and st.async's completion on the mbarrier is a release at cluster scope,
//   so every slot is visible to the reads that follow; all reads are of the
//   block's own shared memory. What keeps a store from reaching an mbarrier
//   before it is initialised is the cluster barrier between ClusterSumBegin
//   and the first store: the init is published with fence.mbarrier_init (release,
//   cluster) before the relaxed arrive, and every thread waits (acquire) for
//   the whole cluster's arrivals before it stores. The arrive happens early
//   (ClusterSumBegin) and the wait just before the stores, so the barrier
//   costs nothing on the critical path when there is work in between. The
//   other way, cluster barriers with the default release/acquire semantics
//   around plain shared memory stores and loads, makes the compiler emit a
//   GPU-scope MEMBAR, which waits for every outstanding global and peer
//   (NVLink) access of the thread.
//   Exit: a block writes into another block's shared memory only while that
//   block waits for exactly those writes (its mbarrier), so no block exits
//   while a store to it is in flight, and no block reads another's memory;
//   no barrier at exit.
//   Every wait here is on blocks of this cluster only, which run
//   concurrently (cluster launch): it ends when they reach ClusterSum. A
//   block that never does is stuck in a wait of its own, which wait.cuh
//   bounds.
//
// One block (blocks == 1)
//   mapa and st.async address other blocks' shared memory, and the CUDA
//   programming model does not define them in a cluster of one block
//   (compute-sanitizer reports the st.async as an invalid __shared__ write:
//   "Cluster needs to have at least 2 blocks"). So with one block the warps'
//   values meet in the block's own slots through plain shared stores and one
//   block barrier (bar.sync orders shared memory among the block's threads;
//   it emits no MEMBAR), with no mbarrier and no cluster barrier. `blocks` is
//   the same in every thread of the grid, so every thread takes the same
//   branch and reaches the barrier.
#ifndef LLAR_CLUSTER_SUM_CUH_
#define LLAR_CLUSTER_SUM_CUH_

#include <cstdint>

#include "llar/args.h"

namespace llar {

struct ClusterSumStorage {
  float slots[kMaxClusterBlocks * kMaxWarps];  // slot block_rank * kMaxWarps + warp
  alignas(8) uint64_t mbarrier;
};

namespace cluster_sum {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t BlockRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// `shared` (this block's shared memory) as mapped for block `rank` of the cluster.
__device__ __forceinline__ uint32_t MapToRank(uint32_t shared, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(mapped) : "r"(shared), "r"(rank));
  return mapped;
}

__device__ __forceinline__ bool TryWaitParity0(uint32_t mbarrier) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(mbarrier)
      : "memory");
  return done != 0;
}

}  // namespace cluster_sum

__device__ __forceinline__ void ClusterSumBegin(ClusterSumStorage& s, int blocks, int warps) {
  if (blocks == 1) return;  // no cluster (contract)
  if (threadIdx.x == 0) {
    const uint32_t bar = cluster_sum::SharedAddress(&s.mbarrier);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const uint32_t bytes = static_cast<uint32_t>(blocks * warps) * 4u;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}

__device__ __forceinline__ float ClusterSum(ClusterSumStorage& s, float value, int blocks,
                                            int warps) {
  const int lane = threadIdx.x % kWarpSize;
  if (blocks == 1) {  // no cluster (contract): slot = warp, one block barrier
    if (lane == 0) s.slots[threadIdx.x / kWarpSize] = value;
    __syncthreads();
  } else {
    asm volatile("barrier.cluster.wait;" ::: "memory");  // every mbarrier is initialised
    if (lane == 0) {
      const uint32_t slot = cluster_sum::SharedAddress(
          &s.slots[cluster_sum::BlockRank() * kMaxWarps + threadIdx.x / kWarpSize]);
      const uint32_t bar = cluster_sum::SharedAddress(&s.mbarrier);
      for (int b = 0; b < blocks; ++b) {
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                cluster_sum::MapToRank(slot, b)),
            "r"(__float_as_uint(value)), "r"(cluster_sum::MapToRank(bar, b))
            : "memory");
      }
    }
    const uint32_t bar = cluster_sum::SharedAddress(&s.mbarrier);
    while (!cluster_sum::TryWaitParity0(bar)) {
    }
  }
  float v = 0.0f;
  for (int slot = lane; slot < blocks * kMaxWarps; slot += kWarpSize) {
    if (slot % kMaxWarps < warps) v = __fadd_rn(v, s.slots[slot]);
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

}  // namespace llar

#endif  // LLAR_CLUSTER_SUM_CUH_
