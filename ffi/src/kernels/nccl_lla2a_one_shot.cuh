// One-shot all-reduce on NCCL's LL all-to-all device session
// (nccl_device/ll_a2a.h, ncclLLA2ASession; NCCL 2.28 device API): the
// reference that the one-shot LL (arXiv 2607.16100, sections 3 and 4.1)
// builds on, kept as a reference and fallback. The kernel template and its
// Rule (host side); nccl_lla2a_one_shot.cu instantiates them.
//
// Algorithm: the single pass of NCCL's own AllReduce_AGxLL_R symmetric
// kernel (src/device/symmetric/all_reduce.cuh in NCCL's sources) on the
// one-shot LL's grid. Block b opens session b (one per block, cooperative
// group: the whole block). Thread t owns line b * lines_per_block + t of
// the payload, 8 bytes (OneShotGridFor, the one-shot LL's rule); it
//   1. bcast: stores its line into slot rank * lines_per_block + t of every
//      rank's session buffer, its own included, as an LL line {d0, epoch,
//      d1, epoch} (NCCL's LL format, ll.cuh);
//   2. recvReduce: polls slots t, t + lines_per_block, ... (one per source
//      rank, rank 0 first) of its own buffer until each carries the epoch,
//      and folds them in that order with reduce.cuh's accumulation
//      (AccumulatorFor, AddRn), so every rank's result is bitwise the one-shot
//      LL's and the float64 rank-order reference's;
//   3. stores the result; endEpoch; the session's destructor stores the
//      block's epoch for the next call.
// The session keeps its own epoch, per block, in line 0 of the block's part
// of NCCL's buffer, and its slots in two halves chosen by the epoch's parity
// (impl/ll_a2a__funcs.h). ll_a2a.h's contract for endEpoch, "every peer was
// sent to and received from by some thread of the block", holds: every block
// of OneShotGridFor's grid has at least one line, and the thread of each line
// sends to and receives from every rank. This algorithm advances none of its
// own epoch counters (AllReduceArgs::epochs is unused).
//
// Bounded waits: a finding about the reference
//   NCCL 2.28.9's ncclLLA2ASession::recvUnrolled, which recv and recvReduce
//   call, polls its slots in a `while (true)` loop that reads no clock and has
//   no exit: if a peer never sends (a rank that skips the call, a process that
//   died), a kernel that relies on the session alone spins until its process
//   is killed, and nothing reports which peer it waits for. NCCL 2.29.7 and
//   later poll ncclDevComm::abortFlag every 10000 polls instead, so a host
//   ncclCommAbort ends the loop, and recvUnrolled then returns the slots as
//   they are, ready or not; there is still no time bound. (endEpoch and the
//   destructor wait only at __syncthreads, for the block's own threads.) So
//   the reference as NCCL writes it can hang where one_shot_ll cannot.
//
//   This kernel keeps NCCL's receive as it is and restores the bound with a
//   watchdog warp: every block has one warp more than the grid rule's threads,
//   which neither sends nor receives. The other warps count themselves in a
//   shared word once their receives are done; the watchdog polls that word,
//   reading %globaltimer every kSpinsPerClockRead polls, and once
//   PeerTable::timeout_ns has passed it looks for a slot of the block that
//   never got the epoch, fills the error record (rank, peer, block, line,
//   epoch, the flags it saw) and traps (wait.cuh: ReportTimeoutAndTrap). The
//   trap ends the whole grid, NCCL's spinning threads included. The report
//   reads the session's slot layout (ncclLLA2ASession_internal's epoch and
//   slotsOffset, impl/ll_a2a__types.h, the same in NCCL 2.28.9 to 2.30.7),
//   which ll_a2a.h does not promise; only the report depends on it. What the
//   bound costs: one warp per block, one __syncthreads before the sends (to
//   zero the shared word; the payload load is in flight across it) and one
//   shared atomic per warp.
//
// No call signature: the session writes NCCL's own LL flags (the session's
// epoch in both flag words, impl/ll_a2a__funcs.h), which leave no room for
// the call's signature that jax_llar's LL lines carry (ll.cuh, "Flags and
// signatures"). A call mispaired with another of the same grid and epoch is
// therefore summed with it, as in NCCL itself; the algorithm is not
// signature-checked (args.h: CarriesSignature; jax_llar.algorithms.SIGNED)
// and AllReduceArgs::signature is unused.
//
// Never multicast: the session is opened with multimem = false (its bcast
// then stores to each peer in turn).
#ifndef LLAR_KERNELS_NCCL_LLA2A_ONE_SHOT_CUH_
#define LLAR_KERNELS_NCCL_LLA2A_ONE_SHOT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "llar/nccl_lla2a.h"
#include "llar/reduce.cuh"
#include "llar/wait.cuh"

namespace llar {

// Threads per block, at most: the grid rule's kMaxThreads and the watchdog warp.
inline constexpr int kNcclLLA2AMaxThreads = kMaxThreads + kWarpSize;
// Slots recvReduce loads before it checks their flags (NCCL's own kernel uses 8).
inline constexpr int kNcclLLA2ARecvUnroll = 8;

// One line's accumulators: what recvReduce folds.
template <typename T, typename Acc>
struct NcclLLA2AAcc {
  Acc v[Payload<T>::kPerLine];
};

// The watchdog's report after the timeout, off the fast path: finds the
// first slot of this block's lines (source rank major) that does not carry
// `epoch`, reports it (peer -1, line -1 when every slot has arrived by now)
// and traps. `slots` is the block's half of this epoch in its own buffer.
// Every lane of the watchdog warp calls it. [[noreturn]]: the kernel keeps
// no register live across the call.
[[noreturn]] __device__ __noinline__ inline void NcclLLA2AReportAndTrap(const PeerTable* pt,
                                                            const uint4* slots,
                                                            uint32_t epoch, int rank,
                                                            int world, uint32_t stride,
                                                            uint32_t block_lines,
                                                            uint64_t waited_ns) {
  const uint32_t lane = threadIdx.x % kWarpSize;
  const uint32_t total = uint32_t(world) * block_lines;
  uint32_t first = 0xffffffffu;
  for (uint32_t i = lane; i < total; i += kWarpSize) {
    const uint4 v = LoadLine(reinterpret_cast<const char*>(
        slots + (i / block_lines) * stride + i % block_lines));
    if (v.y != epoch || v.w != epoch) {
      first = i;
      break;
    }
  }
  first = __reduce_min_sync(0xffffffffu, first);
  WaitSite site{rank, -1, static_cast<int32_t>(blockIdx.x), -1, epoch};
  uint4 seen = {0u, 0u, 0u, 0u};
  if (first != 0xffffffffu) {
    site.peer = static_cast<int32_t>(first / block_lines);
    site.line = static_cast<int32_t>(first % block_lines);
    seen = LoadLine(reinterpret_cast<const char*>(
        slots + (first / block_lines) * stride + first % block_lines));
  }
  ReportTimeoutAndTrap(pt, site, epoch, seen.y, seen.w, waited_ns);
  __trap();  // not reached: ReportTimeoutAndTrap traps
}

// T: float, __nv_bfloat16, __half or int32_t. kWorld: 2 (float accumulation,
// as the one-shot LL's two-rank kernel) or 0 (any number of ranks: double;
// uint32_t for int32 either way), reduce.cuh's AccumulatorFor.
template <typename T, int kWorld>
__global__ void __launch_bounds__(kNcclLLA2AMaxThreads)
    NcclLLA2AOneShotKernel(const AllReduceArgs a) {
  using Acc = NcclLLA2AAcc<T, AccumulatorFor<T, kWorld>>;
  __shared__ uint32_t received_warps;

  const PeerTable* pt = a.peers;
  const NcclLLA2AComm& nc = *static_cast<const NcclLLA2AComm*>(pt->nccl_lla2a);
  const int world = a.world;
  const int t = threadIdx.x;
  const int work_threads = static_cast<int>(blockDim.x) - kWarpSize;
  const uint32_t stride = a.lines_per_block;
  ncclCoopCta cta;
  ncclLLA2ASession<ncclCoopCta> session(cta, nc.comm, ncclTeamLsa(nc.comm), nc.handle,
                                        blockIdx.x, world * kLinesPerBlock,
                                        /*multimem=*/false);

  const uint32_t line = blockIdx.x * stride + t;
  const uint32_t lines = (a.n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine;
  const bool active = t < static_cast<int>(stride) && line < lines;  // never the watchdog
  uint2 mine = {0u, 0u};
  if (active) mine = LoadPayload(a.in, a.n_bytes, a.vector_lines, line);
  if (t == 0) received_warps = 0;
  __syncthreads();

  if (t < work_threads) {
    if (active) {
      session.bcast(a.rank * static_cast<int>(stride) + t, mine);
      const Acc sum = session.template recvReduce<kNcclLLA2ARecvUnroll, uint2>(
          t, world, static_cast<int>(stride),
          [](uint2 p) {
            Acc v;
            Payload<T>::Unpack(p, v.v);
            return v;
          },
          [](Acc x, const Acc& y) {
#pragma unroll
            for (int i = 0; i < Payload<T>::kPerLine; ++i) x.v[i] = AddRn(x.v[i], y.v[i]);
            return x;
          });
      StorePayload(a.out, a.n_bytes, a.vector_lines, line, Payload<T>::Pack(sum.v));
    }
    __syncwarp();
    if (t % kWarpSize == 0) atomicAdd(&received_warps, 1u);
  } else {
    // The watchdog (contract above).
    const volatile uint32_t* received = &received_warps;
    const uint32_t warps = static_cast<uint32_t>(work_threads / kWarpSize);
    uint64_t start = 0;
    uint32_t spins = 0;
    while (*received != warps) {
      if (++spins != kSpinsPerClockRead) continue;
      spins = 0;
      const uint64_t now = GlobalTimerNs();
      if (start == 0) {
        start = now;
      } else if (now - start > pt->timeout_ns) {
        const uint4* slots = static_cast<const uint4*>(
                                 ncclGetResourceBufferLocalPointer(nc.comm, nc.handle.bufHandle)) +
                             session.slotsOffset;
        const uint32_t first = blockIdx.x * stride;
        const uint32_t block_lines = lines > first ? min(stride, lines - first) : 0u;
        NcclLLA2AReportAndTrap(pt, slots, session.epoch, a.rank, world, stride, block_lines,
                               now - start);
      }
    }
  }
  session.endEpoch(cta);
}  // ~ncclLLA2ASession: thread 0 stores the block's epoch; __syncthreads

// Host side (kernel_table.cuh): the row of Algorithm::kNcclLLA2AOneShot (no
// epoch counters: lla2a_slots) on OneShotGridFor's grid over 8-byte lines,
// plus one watchdog warp per block (nccl_lla2a_one_shot.cu: threads = the
// rule's + kWarpSize).
struct NcclLLA2AOneShotRule : RuleOf<Algorithm::kNcclLLA2AOneShot, LLLines, OneShotSteps> {
  template <typename T, int kWorld>
  static constexpr auto Get() { return &NcclLLA2AOneShotKernel<T, kWorld>; }
  static KernelGrid Grid(uint32_t lines, int world, uint32_t block_lines);
};

}  // namespace llar

#endif  // LLAR_KERNELS_NCCL_LLA2A_ONE_SHOT_CUH_
