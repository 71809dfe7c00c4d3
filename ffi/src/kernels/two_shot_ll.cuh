// Two-shot LL all-reduce (ARCHITECTURE.md, "Algorithms", item 3): the kernel
// template and its Rule (host side). two_shot_ll.cu instantiates it.
//
// The payload of L = ceil(n_bytes / 8) LL lines is cut into `world` chunks,
// as equal as possible: chunk q is TwoShotChunk(L, world, q) (args.h), the
// first L % world chunks one line longer, so chunk 0 is the largest and is
// never empty. Rank q owns chunk q. Every thread handles one chunk index i
// (per step, below) of every chunk:
//   1. reduce-scatter: for every peer q with i < |chunk q|, it stores line
//      start(q) + i of its input into its slot of q's reduce-scatter region;
//      then the warp advances its epoch counter (as LLSession::Send);
//   2. reduce: if i < |chunk rank|, it waits for every peer's line i of its
//      own chunk and sums all ranks' values in rank order (RankOrderSum,
//      reduce.cuh: bitwise the one-shot's result, the float64 rank-order
//      reference rounded once), stores the result to its output and stores
//      the reduced line into its slot of every peer's all-gather region;
//   3. all-gather: for every peer q with i < |chunk q|, it waits for q's
//      reduced line i and stores it to its output at start(q) + i.
// No barrier at entry, between the phases or at exit. Every line (both
// phases) carries flag(E, S) of ll.cuh, S the call's signature, so a wait
// never accepts a line of another call: a line of this epoch with another
// signature (a mispaired call) ends it at once in the foreign-signature
// report, any other wrong line in the timeout. A report (wait.cuh) names the
// peer it waited for, the block, and as `line` the payload line index (not
// the slot).
//
// Work split: lines_per_block = ceil(|chunk 0| / blocks) chunk indices per
// block (TwoShotGridFor, kernels.h), blockDim.x <= 512 threads, a thread
// handling indices first + s * blockDim.x + t for steps s = 0, 1, ... (more
// than one step only above 64 x 512 lines per chunk, 256 KiB per chunk).
//
// Scratch (args.h: TwoShotOffset, TwoShotScratchBytes): the two-shot's own
// region (AllReduceArgs::peers->scratch[p] is its base on rank p). Slot
// (step s, half h, phase f, source src, block b, thread t): 16 bytes. Its
// position depends on neither the grid nor the payload size, only on
// (s, b, t), so every slot belongs to one warp, (b, t / 32), at every size,
// as the one-shot's slots do (epoch.cuh): a slot only ever holds flags of that
// warp's counter. The region holds TwoShotMaxSteps(world) steps, enough for
// the largest chunk of kTwoShotMaxBytes.
//
// Epoch counters (args.h: EpochSetOffset): the two-shot has its own set,
// which AllReduceArgs::epochs points at. Shared counters would let a
// one-shot call take the re-zeroing epochs of a warp, leaving the two-shot's
// slots of that warp uncleared for a whole window (or the reverse); with a
// set per algorithm, epoch.cuh's contract and its re-zeroing argument hold
// for each algorithm on its own.
//
// Why two regions (reduce-scatter and all-gather), each double buffered
//   Within one call, q's all-gather line to p (slot (q, i)) is sent once q
//   has received every rank's line of ITS chunk; that says nothing about
//   whether p has consumed q's reduce-scatter line (q, i) of p's chunk, which
//   is still in flight or unread. Had the phases shared the slot, q's reduced
//   line, carrying the same flag(E), could overwrite it before p read it. In
//   separate regions each slot is written once per call. Parity (E & 1)
//   doubles each region for the reason epoch.cuh gives for the one-shot.
//
// Why no barrier is needed (reuse argument, both regions)
//   Fix warp w of block b. Rank r writes half h of w's slots (either region)
//   in p's scratch in call c0 (epoch E) and next in call c2 (epoch E + 2),
//   after r's kernel of call c1 (epoch E + 1, a two-shot call that launched
//   w) completed. In c1, thread 0 of block 0 of every rank handles index 0 of
//   chunk 0, which is never empty: every rank s != 0 sends its line 0 to rank
//   0 in its c1 kernel; rank 0 waits for all of them before it sends the
//   reduced line 0 to every rank; every rank r != 0 waits for that line in
//   its c1 kernel. So r's c1 kernel (r = 0 included: it waited for p's line
//   directly) completed only after p's c1 kernel started, and p launched that
//   kernel after its c0 kernel completed. p's reads of half h of w's slots in
//   c0 happened inside c0 (every slot written in a call is read in that call:
//   reduce-scatter slot (r, i) at q exactly when i < |chunk q|, all-gather
//   slot (q, i) at r exactly when i < |chunk q|). So p consumed them before
//   r's c2 stores: kernel completion on p orders p's reads before its later
//   launches, and r's c2 stores are causally after r's c1 completion. Unlike
//   the one-shot, the chain may pass through rank 0 rather than go from p to
//   r directly (with fewer lines than ranks, p and r exchange nothing), and
//   it holds for any payload of at least one byte.
//   Within one call the phases need nothing more: all-gather slots are read
//   only in phase 3 and written by peers in their phase 2 of the same epoch,
//   with the same flag; a line of epoch E - 2 in the same slot has other
//   epoch bits than flag(E) (ll.cuh), and was consumed in call E - 2.
//
// Re-zeroing: in MustRezero epochs (epoch.cuh) each thread clears, after its
// last wait, every slot of its (b, t) in the half it used: every step the
// region holds, both phases, every source. Peers write that half again only
// at E + 2, i.e. after this kernel completed (argument above); every write of
// an earlier epoch was consumed, so it has landed. Steps this call did not
// use are cleared too, so that a slot used by one large call and then left
// alone by many small ones is never older than kRezeroPeriod + 2 epochs.
#ifndef LLAR_KERNELS_TWO_SHOT_LL_CUH_
#define LLAR_KERNELS_TWO_SHOT_LL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "kernels/two_shot_steps.cuh"
#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll.cuh"
#include "llar/ll_session.cuh"
#include "llar/reduce.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace two_shot {

// Clears every slot of thread t of `block` in half `half` of this rank's
// two-shot region (re-zeroing above). Out of line: twice every kRezeroPeriod
// calls.
static __device__ __noinline__ void RezeroSlots(char* own, int half, int world, int block,
                                                int t) {
  const int steps = static_cast<int>(TwoShotMaxSteps(world));
  for (int s = 0; s < steps; ++s) {
    for (int phase = 0; phase < kTwoShotPhases; ++phase) {
      for (int src = 0; src < world; ++src) {
        ClearLine(own + TwoShotOffset(s, half, phase, world, src, block, t));
      }
    }
  }
}

// The peers' scratch, next rank first: loaded once for a world size known at
// compile time, looked up per use otherwise.
template <int kWorld>
struct Peers {
  char* to[kWorld - 1];
  __device__ __forceinline__ Peers(const PeerTable* pt, int rank) {
#pragma unroll
    for (int k = 1; k < kWorld; ++k) {
      to[k - 1] = internal::ScratchOf(pt, internal::PeerAt(rank, k, kWorld));
    }
  }
  __device__ __forceinline__ char* operator()(int k, int) const { return to[k - 1]; }
};
template <>
struct Peers<0> {
  const PeerTable* pt;
  __device__ __forceinline__ Peers(const PeerTable* p, int) : pt(p) {}
  __device__ __forceinline__ char* operator()(int, int q) const {
    return internal::ScratchOf(pt, q);
  }
};

}  // namespace two_shot

// T: float, __nv_bfloat16, __half or int32_t. kWorld: 2, 4 or 8 (loops
// unrolled, peer addresses loaded once, float accumulation for 2 ranks,
// reduce.cuh), or 0 (any number of ranks, read at run time).
template <typename T, int kWorld>
__global__ void __launch_bounds__(kMaxThreads) TwoShotLLKernel(const AllReduceArgs a) {
  constexpr int kUnroll = kWorld > 0 ? kWorld : 1;
  const int world = kWorld > 0 ? kWorld : a.world;
  const int rank = a.rank;
  const int block = blockIdx.x;
  const int t = threadIdx.x;
  uint64_t* counter =
      a.epochs + (static_cast<unsigned>(block) * kMaxWarps + static_cast<unsigned>(t) / kWarpSize);
  const uint64_t epoch = LoadEpoch(counter);
  const PeerTable* pt = a.peers;
  char* own = internal::ScratchOf(pt, rank);
  const two_shot::Peers<kWorld> peer(pt, rank);
  const TwoShotSteps g(a, kPayloadBytesPerLine, blockDim.x, block, world, rank, epoch);
  const uint32_t flag = FlagOf(epoch, a.signature);

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
  constexpr int kBatch = kWorld == 2 ? static_cast<int>(TwoShotMaxSteps(2)) : 1;
  // Line n = b * kPeers + k - 1 of a batch: step s0 + b, peer k.
  const auto index_of = [&](int s0, int n) {
    return g.first + static_cast<uint32_t>(s0 + n / kPeers) * g.slots + t;
  };
  const auto in_block = [&](int s0, int n) {
    return static_cast<uint32_t>(s0 + n / kPeers) * g.slots + t < g.per_block;
  };

  // 1. Reduce-scatter: line start(q) + i of the input to its owner q.
  for (int s0 = 0; s0 < g.steps; s0 += kBatch) {
    if constexpr (kWorld > 0) {
      // Every load first, then every store: a store (volatile, ll.cuh) would
      // otherwise keep the next load from being issued before it.
      uint2 v[kBatch * kPeers];
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) {
        const TwoShotChunk c =
            TwoShotChunkOf(g.lines, kWorld, internal::PeerAt(rank, n % kPeers + 1, kWorld));
        const uint32_t i = index_of(s0, n);
        v[n] = in_block(s0, n) && i < c.lines
                   ? LoadPayload(a.in, a.n_bytes, a.vector_lines, c.start + i)
                   : uint2{0u, 0u};
      }
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) {
        const int k = n % kPeers + 1;
        const int q = internal::PeerAt(rank, k, kWorld);
        const uint32_t i = index_of(s0, n);
        if (in_block(s0, n) && i < TwoShotChunkOf(g.lines, kWorld, q).lines) {
          StoreLine(peer(k, q) +
                        TwoShotOffset(s0 + n / kPeers, g.half, kTwoShotReduceScatter, world, rank,
                                      block, t),
                    v[n], flag);
        }
      }
    } else {
      const uint32_t j = static_cast<uint32_t>(s0) * g.slots + t;
      if (j >= g.per_block) break;
      const uint32_t i = g.first + j;
      const uint32_t off = TwoShotOffset(s0, g.half, kTwoShotReduceScatter, world, rank, block, t);
      for (int k = 1; k < world; ++k) {
        const int q = internal::PeerAt(rank, k, world);
        const TwoShotChunk c = TwoShotChunkOf(g.lines, world, q);
        if (i < c.lines) {
          StoreLine(peer(k, q) + off, LoadPayload(a.in, a.n_bytes, a.vector_lines, c.start + i),
                    flag);
        }
      }
    }
  }
  // Every lane has read E; the counter is read again only by the next kernel.
  __syncwarp();
  if (t % kWarpSize == 0) *counter = epoch + 1;

  // 2. Reduce this rank's chunk in rank order; keep it and send it to every
  // peer. The own lines of a batch are loaded, and the peers' lines of it
  // awaited (WaitLines), before the first sum.
  for (int s0 = 0; s0 < g.steps; s0 += kBatch) {
    if constexpr (kBatchedWaits) {
      uint2 own_part[kBatch];
      uint32_t act = 0u;  // bit n: line n of the batch is in this rank's chunk
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const uint32_t i = index_of(s0, b * kPeers);
        const bool on = in_block(s0, b * kPeers) && i < g.mine.lines;
        own_part[b] =
            on ? LoadPayload(a.in, a.n_bytes, a.vector_lines, g.mine.start + i) : uint2{0u, 0u};
#pragma unroll
        for (int k = 1; k <= kPeers; ++k) act |= static_cast<uint32_t>(on) << (b * kPeers + k - 1);
      }
      const auto src_of = [&](int n) {
        return own + TwoShotOffset(s0 + n / kPeers, g.half, kTwoShotReduceScatter, world,
                                   internal::PeerAt(rank, n % kPeers + 1, kWorld), block, t);
      };
      const auto site_of = [&](int n) {
        return WaitSite{rank, internal::PeerAt(rank, n % kPeers + 1, kWorld), block,
                        static_cast<int32_t>(g.mine.start + index_of(s0, n)), epoch};
      };
      uint2 got[kBatch * kPeers];
      WaitLines<kBatch * kPeers>(pt, src_of, act, flag, site_of, got);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (!((act >> (b * kPeers)) & 1u)) continue;
        const uint32_t line = g.mine.start + index_of(s0, b * kPeers);
        RankOrderSum<T, AccumulatorFor<T, kWorld>> sum;
#pragma unroll
        for (int src = 0; src < kWorld; ++src) {
          uint2 p = own_part[b];
          if (src != rank) {
            // Peer src is k = (src - rank) mod world after rank; picked by
            // compare, not by index (a run-time index would move the array
            // to local memory).
            const int k = src > rank ? src - rank : src + kWorld - rank;
            p = got[b * kPeers];
#pragma unroll
            for (int kk = 2; kk <= kPeers; ++kk) {
              if (kk == k) p = got[b * kPeers + kk - 1];
            }
          }
          sum.Add(src, p);
        }
        const uint2 reduced = sum.Result();
        StorePayload(a.out, a.n_bytes, a.vector_lines, line, reduced);
        const uint32_t off =
            TwoShotOffset(s0 + b, g.half, kTwoShotAllGather, world, rank, block, t);
#pragma unroll
        for (int k = 1; k < kWorld; ++k) {
          StoreLine(peer(k, internal::PeerAt(rank, k, kWorld)) + off, reduced, flag);
        }
      }
    } else {
      const uint32_t j = static_cast<uint32_t>(s0) * g.slots + t;
      const uint32_t i = g.first + j;
      if (j >= g.per_block || i >= g.mine.lines) break;
      const uint32_t line = g.mine.start + i;
      const uint2 own_part = LoadPayload(a.in, a.n_bytes, a.vector_lines, line);
      RankOrderSum<T, AccumulatorFor<T, kWorld>> sum;
#pragma unroll kUnroll
      for (int src = 0; src < world; ++src) {
        uint2 p = own_part;
        if (src != rank) {
          p = WaitLine(pt,
                       own + TwoShotOffset(s0, g.half, kTwoShotReduceScatter, world, src, block, t),
                       flag, WaitSite{rank, src, block, static_cast<int32_t>(line), epoch});
        }
        sum.Add(src, p);
      }
      const uint2 reduced = sum.Result();
      StorePayload(a.out, a.n_bytes, a.vector_lines, line, reduced);
      const uint32_t off = TwoShotOffset(s0, g.half, kTwoShotAllGather, world, rank, block, t);
#pragma unroll kUnroll
      for (int k = 1; k < world; ++k) {
        StoreLine(peer(k, internal::PeerAt(rank, k, world)) + off, reduced, flag);
      }
    }
  }

  // 3. All-gather: every peer's reduced chunk, into the output; the lines of
  // a batch awaited together.
  for (int s0 = 0; s0 < g.steps; s0 += kBatch) {
    if constexpr (kBatchedWaits) {
      const auto chunk_of = [&](int n) {
        return TwoShotChunkOf(g.lines, kWorld, internal::PeerAt(rank, n % kPeers + 1, kWorld));
      };
      uint32_t act = 0u;
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) {
        act |= static_cast<uint32_t>(in_block(s0, n) && index_of(s0, n) < chunk_of(n).lines)
               << n;
      }
      const auto src_of = [&](int n) {
        return own + TwoShotOffset(s0 + n / kPeers, g.half, kTwoShotAllGather, world,
                                   internal::PeerAt(rank, n % kPeers + 1, kWorld), block, t);
      };
      const auto site_of = [&](int n) {
        return WaitSite{rank, internal::PeerAt(rank, n % kPeers + 1, kWorld), block,
                        static_cast<int32_t>(chunk_of(n).start + index_of(s0, n)), epoch};
      };
      uint2 got[kBatch * kPeers];
      WaitLines<kBatch * kPeers>(pt, src_of, act, flag, site_of, got);
#pragma unroll
      for (int n = 0; n < kBatch * kPeers; ++n) {
        if ((act >> n) & 1u) {
          StorePayload(a.out, a.n_bytes, a.vector_lines, chunk_of(n).start + index_of(s0, n),
                       got[n]);
        }
      }
    } else {
      const uint32_t j = static_cast<uint32_t>(s0) * g.slots + t;
      if (j >= g.per_block) break;
      const uint32_t i = g.first + j;
#pragma unroll kUnroll
      for (int k = 1; k < world; ++k) {
        const int q = internal::PeerAt(rank, k, world);
        const TwoShotChunk c = TwoShotChunkOf(g.lines, world, q);
        if (i < c.lines) {
          const uint32_t line = c.start + i;
          const uint2 p =
              WaitLine(pt, own + TwoShotOffset(s0, g.half, kTwoShotAllGather, world, q, block, t),
                       flag, WaitSite{rank, q, block, static_cast<int32_t>(line), epoch});
          StorePayload(a.out, a.n_bytes, a.vector_lines, line, p);
        }
      }
    }
  }
  if (MustRezero(epoch)) two_shot::RezeroSlots(own, g.half, world, block, t);
}

// Host side (kernel_table.cuh): the row of Algorithm::kTwoShotLL on
// TwoShotGridFor's grid over LL lines (kernels.h, two_shot_ll.cu); its region
// holds TwoShotMaxSteps(world) steps.
struct TwoShotLLRule : RuleOf<Algorithm::kTwoShotLL, LLLines> {
  template <typename T, int kWorld>
  static constexpr auto Get() { return &TwoShotLLKernel<T, kWorld>; }
  static KernelGrid Grid(uint32_t lines, int world, uint32_t) {
    return TwoShotGridFor(lines, world);
  }
  static uint32_t MaxSteps(int world) { return TwoShotMaxSteps(world); }
};

}  // namespace llar

#endif  // LLAR_KERNELS_TWO_SHOT_LL_CUH_
