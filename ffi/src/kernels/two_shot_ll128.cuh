// Two-shot LL128 all-reduce: the two-shot of two_shot_ll.cuh in 128-byte
// LL128 lines (ll128.cuh) instead of 16-byte LL lines: the kernel template
// and its Rule (host side: the grid rule). two_shot_ll128.cu instantiates it.
//
// Source: ARCHITECTURE.md, "Algorithms", item 3 (the two-shot, arXiv
// 2607.16100, section 4), in NCCL's LL128 line format.
//
// The protocol is two_shot_ll.cuh's, step for step, with LL128 lines of 120
// payload bytes as the unit: the payload of L = ceil(n_bytes / 120) lines is
// cut into `world` chunks as equal as possible (TwoShotChunkOf over LL128
// lines; chunk 0 the largest, never empty); rank q owns chunk q; every chunk
// index i is handled by the 8 lanes of one line slot:
//   1. reduce-scatter: for every peer q with i < |chunk q|, the line slot's
//      lanes store line start(q) + i of the input into their slot of q's
//      reduce-scatter region; then the warp advances its epoch counter;
//   2. reduce: if i < |chunk rank|, the warp waits for every peer's line i of
//      its own chunk and sums all ranks in rank order (RankOrderSum, bitwise
//      the one-shot LL's result), stores the result to its output and the
//      reduced line into its slot of every peer's all-gather region;
//   3. all-gather: for every peer q with i < |chunk q|, it waits for q's
//      reduced line i and stores it to its output at start(q) + i.
// No barrier at entry, between the phases or at exit. Correctness rests on
// the hardware property that ll128.cuh states and ffi/tools/store_atomicity.cu
// tests, not on a documented guarantee.
//
// The waits are warp-collective (WaitLL128Part): every lane of a warp runs
// every step and every peer's wait in the same order, a lane whose line slot
// has nothing to wait for in it takes part without loading. Every line
// carries the flag word {LL128Flag(E), S}, S the call's signature
// (ll128.cuh): a timed-out wait reports the peer, the block and as `line`
// the payload line index; a line of this epoch with another signature (a
// mispaired call) ends the wait at once in the same report, code 2.
//
// Work split: a block of `threads` threads holds threads / 8 line slots; it
// handles lines_per_block = ceil(|chunk 0| / blocks) chunk indices,
// first = block * lines_per_block, slot t / 8 handling indices
// first + s * (threads / 8) + t / 8 for steps s = 0 .. steps - 1
// (TwoShotLL128Rule::Grid below). Units and tails as one_shot_ll128.cuh:
// lane j < 7 of a line carries payload units 2j and 2j + 1, lane 7 unit 14.
//
// Region (args.h: TwoShotLL128Offset, TwoShotLL128RegionBytes): slot
// (step s, half h, phase f, source src, block b, line slot l) of 128 bytes.
// Its position depends only on (s, b, l) besides the half, the phase and the
// source, never on the grid or the size, so it belongs to warp (b, l / 4) at
// every size. The region holds TwoShotLL128MaxSteps(world) steps, enough for
// the largest chunk of kTwoShotLL128MaxBytes.
//
// Epochs, the two regions, scratch reuse and re-zeroing: two_shot_ll.cuh's
// arguments hold word for word with "line slot" for "thread" (in call E + 1
// the 8 lanes of block 0's first line slot handle index 0 of chunk 0 on every
// rank, so every rank's kernel E + 1 waits, directly or through rank 0, for a
// store that each peer made in its kernel E + 1), with this algorithm's own
// counter set (AllReduceArgs::epochs). Re-zeroing: in MustRezero epochs
// each lane clears its own 16-byte part of its line slot in every step the
// region holds, both phases, every source, in the half it used, after its
// last wait.
//
// Template parameters:
//   T        float, __nv_bfloat16, __half or int32_t.
//   kWorld   2, 4 or 8 ranks known at compile time (loops unrolled, peer
//            addresses loaded once, float accumulation for 2 ranks); 0: any
//            number of ranks, read at run time.
#ifndef LLAR_KERNELS_TWO_SHOT_LL128_CUH_
#define LLAR_KERNELS_TWO_SHOT_LL128_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "kernels/ll128_thread.cuh"
#include "kernels/two_shot_steps.cuh"
#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll128.cuh"
#include "llar/peers.cuh"
#include "llar/reduce.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace two_shot_ll128 {

// Clears this lane's part of line slot `slot` of `block` in half `half`:
// every step the region holds, both phases, every source (re-zeroing
// above). Out of line: twice every kRezeroPeriod calls.
static __device__ __noinline__ void RezeroParts(char* own, int half, int world, int block,
                                                int slot, int part) {
  const int steps = static_cast<int>(TwoShotLL128MaxSteps(world));
  for (int s = 0; s < steps; ++s) {
    for (int phase = 0; phase < kTwoShotPhases; ++phase) {
      for (int src = 0; src < world; ++src) {
        ClearLL128Part(own + TwoShotLL128Offset(s, half, phase, world, src, block, slot) +
                       part * kLL128PartBytes);
      }
    }
  }
}

// The lane's payload units of line `line` of `in`: the first, and the
// second for lanes that are not the flag lane ({0, 0} there).
struct Units {
  uint2 u0, u1;
};
__device__ __forceinline__ Units LoadUnits(const AllReduceArgs& a, uint32_t line, bool flag_lane,
                                           int first_unit) {
  const uint32_t unit = line * kLL128UnitsPerLine + first_unit;
  Units u;
  u.u0 = LoadPayload(a.in, a.n_bytes, a.vector_lines, unit);
  u.u1 = flag_lane ? uint2{0u, 0u} : LoadPayload(a.in, a.n_bytes, a.vector_lines, unit + 1);
  return u;
}

__device__ __forceinline__ void StoreUnits(const AllReduceArgs& a, uint32_t line, bool flag_lane,
                                           int first_unit, uint2 u0, uint2 u1) {
  const uint32_t unit = line * kLL128UnitsPerLine + first_unit;
  StorePayload(a.out, a.n_bytes, a.vector_lines, unit, u0);
  if (!flag_lane) StorePayload(a.out, a.n_bytes, a.vector_lines, unit + 1, u1);
}

}  // namespace two_shot_ll128

template <typename T, int kWorld>
__global__ void __launch_bounds__(kMaxThreads) TwoShotLL128Kernel(const AllReduceArgs a) {
  constexpr int kUnroll = kWorld > 0 ? kWorld : 1;
  const LL128Thread<kWorld> th(a);
  const PeerScratch<kWorld> peer(th.pt, th.rank, th.world);
  const int first_unit = LL128FirstUnit(th.t);
  const uint32_t part_offset = static_cast<uint32_t>(th.part) * kLL128PartBytes;
  const TwoShotSteps g(a, kLL128PayloadBytes, blockDim.x / kLL128LanesPerLine, th.block,
                       th.world, th.rank, th.epoch);
  const uint32_t flag = LL128Flag(th.epoch);
  const uint32_t signature = a.signature;
  // The lane's part of its line slot in this rank's region: step s of
  // `phase`, the line from rank `src`.
  const auto own_part_of = [&](int s, int phase, int src) {
    return th.own + TwoShotLL128Offset(s, g.half, phase, th.world, src, th.block, th.slot) +
           part_offset;
  };
  // Steps a thread handles together (kBatch) and whether the waits of phases
  // 2 and 3 are batched: for 2 ranks every step the region holds, loads
  // and waits alike (one pass); otherwise one step, its loads batched over
  // the peers in phase 1 only. Batching costs registers: a 2 ranks' block
  // then needs more than two blocks of kMaxThreads threads fit on an SM,
  // which their grids never need (one rank per GPU, or two ranks' grids in
  // the loopback harness), while 4 ranks' grids fit the loopback harness
  // only at two blocks per SM. Within a batch every load is issued before
  // the stores and waits that need it: one load latency per batch, not per
  // step.
  constexpr int kPeers = kWorld > 0 ? kWorld - 1 : 1;  // per step in the batched waits
  constexpr bool kBatchedWaits = kWorld == 2;
  constexpr int kBatch = kWorld == 2 ? static_cast<int>(TwoShotLL128MaxSteps(2)) : 1;

  // 1. Reduce-scatter: line start(q) + i of the input to its owner q. A
  // thread's loads of kBatch steps are issued before their stores (one load
  // latency per batch, not per step).
  for (int s0 = 0; s0 < g.steps; s0 += kBatch) {
    if constexpr (kWorld > 0) {
      two_shot_ll128::Units v[kBatch][kWorld - 1];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const uint32_t j = static_cast<uint32_t>(s0 + b) * g.slots + th.slot;
        const uint32_t i = g.first + j;
#pragma unroll
        for (int k = 1; k < kWorld; ++k) {
          const TwoShotChunk c =
              TwoShotChunkOf(g.lines, kWorld, internal::PeerAt(th.rank, k, kWorld));
          v[b][k - 1] = j < g.per_block && i < c.lines
                            ? two_shot_ll128::LoadUnits(a, c.start + i, th.flag_lane, first_unit)
                            : two_shot_ll128::Units{{0u, 0u}, {0u, 0u}};
        }
      }
      __syncwarp();  // the 8 lanes of a line store it with one instruction
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int s = s0 + b;
        const uint32_t j = static_cast<uint32_t>(s) * g.slots + th.slot;
        const uint32_t i = g.first + j;
        const uint32_t off = TwoShotLL128Offset(s, g.half, kTwoShotReduceScatter, th.world, th.rank,
                                                th.block, th.slot) +
                             part_offset;
#pragma unroll
        for (int k = 1; k < kWorld; ++k) {
          const int q = internal::PeerAt(th.rank, k, kWorld);
          if (j < g.per_block && i < TwoShotChunkOf(g.lines, kWorld, q).lines) {
            StoreLL128Part(peer(k) + off, v[b][k - 1].u0,
                           th.flag_lane ? uint2{flag, signature} : v[b][k - 1].u1);
          }
        }
      }
    } else {
      const uint32_t j = static_cast<uint32_t>(s0) * g.slots + th.slot;
      const uint32_t i = g.first + j;
      const uint32_t off = TwoShotLL128Offset(s0, g.half, kTwoShotReduceScatter, th.world, th.rank,
                                              th.block, th.slot) +
                           part_offset;
      for (int k = 1; k < th.world; ++k) {
        const int q = internal::PeerAt(th.rank, k, th.world);
        const TwoShotChunk c = TwoShotChunkOf(g.lines, th.world, q);
        const bool act = j < g.per_block && i < c.lines;
        two_shot_ll128::Units v{{0u, 0u}, {0u, 0u}};
        if (act) v = two_shot_ll128::LoadUnits(a, c.start + i, th.flag_lane, first_unit);
        __syncwarp();
        if (act) StoreLL128Part(peer(k) + off, v.u0, th.flag_lane ? uint2{flag, signature} : v.u1);
      }
    }
  }
  // Every lane has read E; the counter is read again only by the next kernel.
  __syncwarp();
  if (th.t % kWarpSize == 0) *th.counter = th.epoch + 1;

  // 2. Reduce this rank's chunk in rank order; keep it and send it to every
  // peer. Every lane runs every step (the waits are warp-collective); the
  // own parts of kBatch steps are loaded, and their peers' lines awaited,
  // together (WaitLL128Parts).
  for (int s0 = 0; s0 < g.steps; s0 += kBatch) {
    two_shot_ll128::Units own_part[kBatch];
    uint32_t act = 0u;  // bit b: step s0 + b has a line of this rank's chunk
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const uint32_t j = static_cast<uint32_t>(s0 + b) * g.slots + th.slot;
      const uint32_t i = g.first + j;
      const bool on = j < g.per_block && i < g.mine.lines;
      act |= static_cast<uint32_t>(on) << b;
      own_part[b] = on ? two_shot_ll128::LoadUnits(a, g.mine.start + i, th.flag_lane, first_unit)
                       : two_shot_ll128::Units{{0u, 0u}, {0u, 0u}};
    }
    uint4 got[kBatch * kPeers];
    if constexpr (kBatchedWaits) {
      // Part n = b * kPeers + k - 1: step s0 + b's line from peer k.
      uint32_t awaited = 0u;
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) awaited |= ((act >> (n / kPeers)) & 1u) << n;
      const auto src_of = [&](int n) {
        return own_part_of(s0 + n / kPeers, kTwoShotReduceScatter,
                           internal::PeerAt(th.rank, n % kPeers + 1, kWorld));
      };
      const auto site_of = [&](int n) {
        const uint32_t i = g.first + static_cast<uint32_t>(s0 + n / kPeers) * g.slots + th.slot;
        return WaitSite{th.rank, internal::PeerAt(th.rank, n % kPeers + 1, kWorld), th.block,
                        static_cast<int32_t>(g.mine.start + i), th.epoch};
      };
      WaitLL128Parts<kBatch * kPeers>(th.pt, src_of, awaited, flag, signature, site_of, got);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int s = s0 + b;
      const uint32_t i = g.first + static_cast<uint32_t>(s) * g.slots + th.slot;
      const uint32_t line = g.mine.start + i;
      RankOrderSum<T, AccumulatorFor<T, kWorld>> sum0, sum1;
#pragma unroll kUnroll
      for (int src_rank = 0; src_rank < th.world; ++src_rank) {
        uint2 p0 = own_part[b].u0, p1 = own_part[b].u1;
        if (src_rank != th.rank) {
          uint4 v;
          if constexpr (kBatchedWaits) {
            // Peer src_rank is k = (src_rank - rank) mod world after rank;
            // picked by compare, not by index (an index not known at compile
            // time would move the array to local memory).
            const int k = src_rank > th.rank ? src_rank - th.rank : src_rank + kWorld - th.rank;
            v = got[b * kPeers];
#pragma unroll
            for (int kk = 2; kk <= kPeers; ++kk) {
              if (kk == k) v = got[b * kPeers + (kk - 1)];
            }
          } else {
            v = WaitLL128Part(
                th.pt, own_part_of(s, kTwoShotReduceScatter, src_rank), (act >> b) & 1u, flag,
                signature,
                WaitSite{th.rank, src_rank, th.block, static_cast<int32_t>(line), th.epoch});
          }
          p0 = LL128Unit0(v);
          p1 = LL128Unit1(v);
        }
        sum0.Add(src_rank, p0);
        sum1.Add(src_rank, p1);  // the flag lane's is unused
      }
      const uint2 r0 = sum0.Result(), r1 = sum1.Result();
      const bool on = (act >> b) & 1u;
      if (on) two_shot_ll128::StoreUnits(a, line, th.flag_lane, first_unit, r0, r1);
      const uint32_t off =
          TwoShotLL128Offset(s, g.half, kTwoShotAllGather, th.world, th.rank, th.block, th.slot) +
          part_offset;
      const uint2 second = th.flag_lane ? uint2{flag, signature} : r1;
      __syncwarp();
      if (on) {
#pragma unroll kUnroll
        for (int k = 1; k < th.world; ++k) StoreLL128Part(peer(k) + off, r0, second);
      }
    }
  }

  // 3. All-gather: every peer's reduced chunk, into the output; the lines of
  // kBatch steps from every peer awaited together.
  for (int s0 = 0; s0 < g.steps; s0 += kBatch) {
    if constexpr (kBatchedWaits) {
      // Part n = b * kPeers + k - 1: step s0 + b's line of peer k's chunk.
      const auto index_of = [&](int n) {
        return g.first + static_cast<uint32_t>(s0 + n / kPeers) * g.slots + th.slot;
      };
      const auto chunk_of = [&](int n) {
        return TwoShotChunkOf(g.lines, kWorld, internal::PeerAt(th.rank, n % kPeers + 1, kWorld));
      };
      uint32_t act = 0u;
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) {
        const uint32_t j = static_cast<uint32_t>(s0 + n / kPeers) * g.slots + th.slot;
        act |= static_cast<uint32_t>(j < g.per_block && index_of(n) < chunk_of(n).lines) << n;
      }
      const auto src_of = [&](int n) {
        return own_part_of(s0 + n / kPeers, kTwoShotAllGather,
                           internal::PeerAt(th.rank, n % kPeers + 1, kWorld));
      };
      const auto site_of = [&](int n) {
        return WaitSite{th.rank, internal::PeerAt(th.rank, n % kPeers + 1, kWorld), th.block,
                        static_cast<int32_t>(chunk_of(n).start + index_of(n)), th.epoch};
      };
      uint4 got[kBatch * kPeers];
      WaitLL128Parts<kBatch * kPeers>(th.pt, src_of, act, flag, signature, site_of, got);
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) {
        if ((act >> n) & 1u) {
          two_shot_ll128::StoreUnits(a, chunk_of(n).start + index_of(n), th.flag_lane, first_unit,
                                     LL128Unit0(got[n]), LL128Unit1(got[n]));
        }
      }
    } else {
      const uint32_t j = static_cast<uint32_t>(s0) * g.slots + th.slot;
      const uint32_t i = g.first + j;
#pragma unroll kUnroll
      for (int k = 1; k < th.world; ++k) {
        const int q = internal::PeerAt(th.rank, k, th.world);
        const TwoShotChunk c = TwoShotChunkOf(g.lines, th.world, q);
        const bool on = j < g.per_block && i < c.lines;
        const uint4 v = WaitLL128Part(
            th.pt, own_part_of(s0, kTwoShotAllGather, q), on, flag, signature,
            WaitSite{th.rank, q, th.block, static_cast<int32_t>(c.start + i), th.epoch});
        if (on) {
          two_shot_ll128::StoreUnits(a, c.start + i, th.flag_lane, first_unit, LL128Unit0(v),
                                     LL128Unit1(v));
        }
      }
    }
  }
  if (MustRezero(th.epoch))
    two_shot_ll128::RezeroParts(th.own, g.half, th.world, th.block, th.slot, th.part);
}

// Host side (kernel_table.cuh): the row of Algorithm::kTwoShotLL128 and its
// grid rule (two_shot_ll128.cu) for a payload of `lines` LL128 lines over
// `world` ranks: the largest chunk, c = TwoShotLargestChunk(lines, world)
// (kernel_table.cuh), spread over up to kMaxBlocks blocks of about
// kBlockLines chunk lines each (the one-shot LL128's rule, not measured for
// the two-shot); lines_per_block = ceil(c / blocks), threads = that in whole
// warps of 4 line slots, at most kMaxThreads, and steps = ceil(lines_per_block
// / (threads / 8)), at most TwoShotLL128MaxSteps(world), the steps its region
// holds.
struct TwoShotLL128Rule : RuleOf<Algorithm::kTwoShotLL128, LL128Lines> {
  template <typename T, int kWorld>
  static constexpr auto Get() { return &TwoShotLL128Kernel<T, kWorld>; }
  static KernelGrid Grid(uint32_t lines, int world, uint32_t block_lines);
  static constexpr uint32_t kBlockLines = 8;
  static uint32_t MaxSteps(int world) { return TwoShotLL128MaxSteps(world); }
};

}  // namespace llar

#endif  // LLAR_KERNELS_TWO_SHOT_LL128_CUH_
