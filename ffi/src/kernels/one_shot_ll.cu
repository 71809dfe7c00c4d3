// One-shot LL all-reduce (arXiv 2607.16100, section 4.1).
//
// Every rank stores its payload, packed in LL lines (ll.cuh), into its slot of
// every peer's symmetric scratch; then it polls its own scratch for each
// peer's lines and reduces all ranks in rank order (reduce.cuh). There is no
// barrier at entry or exit: scratch reuse is proven by the epoch protocol
// (epoch.cuh), and every wait is bounded (wait.cuh).
//
// Work split: thread t of block b owns line b * lines_per_block + t. One line
// is 8 payload bytes; a 4 KiB tensor is 512 lines (grid rule: OneShotGridFor).
//
// Variants (template parameters), chosen by the host at launch:
//   kWorld   2, 4 or 8: world size known at compile time (loops unrolled,
//            peer addresses loaded with the first loads, float accumulation
//            for 2 ranks, see reduce.cuh); 0: any world size, read at run time.
//   kWrites  PeerWrites (args.h): kSend is the all-reduce; kDrop is a test
//            hook; kLoopback and kSendLoopback are kernel-bench diagnostics.
//   kTrace   the call-trace variant (args.h), launched only for communicators
//            whose trace was enabled before the call was recorded; the
//            production variant has no trace code at all (with it, each call
//            cost 0.15-0.2 us more, benchmarks/NOTES.md).
// Everything off the fast path (byte-wise tail lines, the timeout report, the
// epoch re-zeroing) is out of line, so the hot instructions stay together.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"
#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll.cuh"
#include "llar/reduce.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace {

// Rank r's scratch address as mapped on this device, through the read-only
// cache (the host writes the table only between launches).
__device__ __forceinline__ char* ScratchOf(const PeerTable* pt, int r) {
  return reinterpret_cast<char*>(
      __ldg(reinterpret_cast<const unsigned long long*>(pt->scratch + r)));
}

// The k-th rank after `rank` (k in [1, world)): ranks spread their first
// stores over different peers.
__device__ __forceinline__ int PeerAt(int rank, int k, int world) {
  const int p = rank + k;
  return p >= world ? p - world : p;
}

// Clears this thread's line in the half the call just consumed, for every
// source rank (epoch.cuh, re-zeroing). Runs twice every 2^30 calls.
__device__ __noinline__ void RezeroLines(char* own, int half, int block, int world, int t) {
  for (int src = 0; src < world; ++src) {
    ClearLine(own + ScratchOffset(half, block, world, src, t));
  }
}

template <typename T, int kWorld, PeerWrites kWrites, bool kTrace>
__global__ void __launch_bounds__(kMaxThreads)
    OneShotLLKernel(const AllReduceArgs a) {
  constexpr bool kStatic = kWorld > 0;
  constexpr bool kToPeers =
      kWrites == PeerWrites::kSend || kWrites == PeerWrites::kSendLoopback;
  constexpr int kUnroll = kStatic ? kWorld : 1;
  const int world = kStatic ? kWorld : a.world;
  const int rank = a.rank;
  const int block = blockIdx.x;
  const int t = threadIdx.x;

  // Independent loads first, back to back: the warp's epoch, the scratch
  // addresses (the PeerTable does not change while a kernel runs, so the
  // read-only path is safe) and this thread's payload.
  uint64_t* const counter =
      a.epochs + (static_cast<unsigned>(block) * kMaxWarps + static_cast<unsigned>(t) / kWarpSize);
  const uint64_t epoch = LoadEpoch(counter);
  char* const own = ScratchOf(a.peers, rank);
  char* to[kStatic ? kWorld - 1 : 1];
  if constexpr (kStatic && kToPeers) {
#pragma unroll
    for (int k = 1; k < kWorld; ++k) to[k - 1] = ScratchOf(a.peers, PeerAt(rank, k, kWorld));
  }
  // Call trace: one thread loads the pointer with the other loads and reads
  // the clock once its lines are sent.
  uint64_t* trace = nullptr;
  uint64_t t_sent = 0;
  if (kTrace && block == 0 && t == 0) {
    trace = reinterpret_cast<uint64_t*>(
        __ldg(reinterpret_cast<const unsigned long long*>(&a.peers->trace)));
  }
  const uint32_t line = block * a.lines_per_block + t;
  const uint32_t lines = (a.n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine;
  const bool active = t < static_cast<int>(a.lines_per_block) && line < lines;
  uint2 mine = {0u, 0u};
  if (active) mine = LoadPayload(a.in, a.n_bytes, a.vector_lines, line);
  const uint32_t flag = FlagOf(epoch);
  const int half = HalfOf(epoch);

  if (active) {
    // Send: one 16-byte store per peer, starting with the next rank.
    const size_t slot = ScratchOffset(half, block, world, rank, t);
    if constexpr (kToPeers) {
      const size_t dst = kWrites == PeerWrites::kSend ? slot : DiagOffset(world, block, t);
      if constexpr (kStatic) {
#pragma unroll
        for (int k = 0; k < kWorld - 1; ++k) StoreLine(to[k] + dst, mine, flag);
      } else {
        for (int k = 1; k < world; ++k) StoreLine(ScratchOf(a.peers, PeerAt(rank, k, world)) + dst, mine, flag);
      }
    }
    if constexpr (kWrites == PeerWrites::kLoopback || kWrites == PeerWrites::kSendLoopback) {
#pragma unroll kUnroll
      for (int k = 1; k < world; ++k) {
        StoreLine(own + ScratchOffset(half, block, world, PeerAt(rank, k, world), t), mine, flag);
      }
    }
    if (kTrace && trace != nullptr) t_sent = GlobalTimerNs();
  }
  // Every lane of the warp has read the epoch: advance the warp's counter
  // now, while the lines are in flight, rather than at the end.
  __syncwarp();
  if (t % kWarpSize == 0) *counter = epoch + 1;

  if (active) {
    // Receive and reduce in rank order.
    RankOrderSum<T, AccumulatorFor<kWorld>> sum;
#pragma unroll kUnroll
    for (int src = 0; src < world; ++src) {
      uint2 p = mine;
      if (src != rank) {
        p = WaitLine(a.peers, own + ScratchOffset(half, block, world, src, t),
                     flag, WaitSite{rank, src, block, t, epoch});
      }
      sum.Add(src, p);
    }
    StorePayload(a.out, a.n_bytes, a.vector_lines, line, sum.Result());
  }
  // Each thread clears only lines it consumed itself: no barrier needed.
  if (MustRezero(epoch)) RezeroLines(own, half, block, world, t);
  if constexpr (kTrace) {
    // The trace records when block 0 finished: wait for its other warps (the
    // production variant has no block barrier at all).
    __syncthreads();
  }
  if (kTrace && trace != nullptr) {
    const size_t e = 2 * size_t(epoch % kTraceSlots);
    trace[e] = t_sent;
    trace[e + 1] = GlobalTimerNs();
  }
}

using KernelFn = void (*)(AllReduceArgs);

// The variants that exist: every dtype; the all-reduce and the trace variant
// for world sizes 2, 4, 8 and any; the test hook and the diagnostics for 2
// and any (the kernel bench runs them on the machine at hand).
template <typename T, int kWorld, PeerWrites kWrites, bool kTrace>
constexpr KernelFn kKernel = OneShotLLKernel<T, kWorld, kWrites, kTrace>;

template <typename T>
KernelFn Pick(int world, PeerWrites writes, bool trace) {
  constexpr PeerWrites kSend = PeerWrites::kSend;
  switch (writes) {
    case PeerWrites::kSend:
      switch (world) {
        case 2: return trace ? kKernel<T, 2, kSend, true> : kKernel<T, 2, kSend, false>;
        case 4: return trace ? kKernel<T, 4, kSend, true> : kKernel<T, 4, kSend, false>;
        case 8: return trace ? kKernel<T, 8, kSend, true> : kKernel<T, 8, kSend, false>;
        default: return trace ? kKernel<T, 0, kSend, true> : kKernel<T, 0, kSend, false>;
      }
    case PeerWrites::kDrop:
      return world == 2 ? kKernel<T, 2, PeerWrites::kDrop, false>
                        : kKernel<T, 0, PeerWrites::kDrop, false>;
    case PeerWrites::kLoopback:
      return world == 2 ? kKernel<T, 2, PeerWrites::kLoopback, false>
                        : kKernel<T, 0, PeerWrites::kLoopback, false>;
    case PeerWrites::kSendLoopback:
      return world == 2 ? kKernel<T, 2, PeerWrites::kSendLoopback, false>
                        : kKernel<T, 0, PeerWrites::kSendLoopback, false>;
  }
  return nullptr;
}

KernelFn PickFor(DType dtype, int world, PeerWrites writes, bool trace) {
  switch (dtype) {
    case DType::kF32: return Pick<float>(world, writes, trace);
    case DType::kBF16: return Pick<__nv_bfloat16>(world, writes, trace);
    case DType::kF16: return Pick<__half>(world, writes, trace);
  }
  return nullptr;
}

}  // namespace

OneShotGrid OneShotGridFor(uint32_t lines, uint32_t block_lines) {
  if (block_lines == 0 || block_lines > kLinesPerBlock) block_lines = kOneShotBlockLines;
  uint32_t blocks = (lines + block_lines - 1) / block_lines;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (lines + blocks - 1) / blocks;
  const uint32_t threads = ((per_block + 31) / 32) * 32;
  return {blocks, per_block, threads == 0 ? 32u : threads};
}

cudaError_t LaunchOneShotLL(AllReduceArgs a, DType dtype, cudaStream_t stream,
                            const OneShotOptions& o) {
  if (a.n_bytes == 0) return cudaSuccess;
  if (a.n_bytes > kOneShotMaxBytes || a.world < 2 || a.world > kMaxRanks ||
      a.rank >= a.world || a.peers == nullptr || a.epochs == nullptr) {
    return cudaErrorInvalidValue;
  }
  const uint32_t lines = (a.n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(a.in) | reinterpret_cast<uintptr_t>(a.out)) &
       (kPayloadBytesPerLine - 1)) == 0;
  a.vector_lines = aligned ? a.n_bytes / kPayloadBytesPerLine : 0;
  const OneShotGrid g = OneShotGridFor(lines, o.block_lines);
  a.lines_per_block = static_cast<uint16_t>(g.lines_per_block);
  // Run-time world size: the generic variant (or on request, kernel bench).
  const KernelFn fn = PickFor(dtype, o.generic ? 0 : a.world, a.peer_writes, o.trace);
  if (fn == nullptr) return cudaErrorInvalidValue;
  fn<<<g.blocks, g.threads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t PreloadOneShotLL() {
  cudaFuncAttributes attr;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int world : {0, 2, 4, 8}) {
      for (PeerWrites w : {PeerWrites::kSend, PeerWrites::kDrop, PeerWrites::kLoopback,
                           PeerWrites::kSendLoopback}) {
        for (bool trace : {false, true}) {
          const KernelFn fn = PickFor(d, world, w, trace);
          const cudaError_t e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(fn));
          if (e != cudaSuccess) return e;
        }
      }
    }
  }
  return cudaSuccess;
}

}  // namespace llar
