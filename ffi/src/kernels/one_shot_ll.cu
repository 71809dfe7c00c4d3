// One-shot LL all-reduce (arXiv 2607.16100, section 4.1).
//
// Every rank stores its payload, packed in LL lines (ll.cuh), into its slot of
// every peer's symmetric scratch; then it polls its own scratch for each
// peer's lines and reduces all ranks in rank order (reduce.cuh). There is no
// barrier at entry or exit: scratch reuse is proven by the epoch protocol
// (epoch.cuh), and every wait is bounded (wait.cuh).
//
// Work split: thread t of block b owns line b * lines_per_block + t. One line
// is 8 payload bytes; a 4 KiB tensor is 512 lines, two blocks of 256 threads.
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

// kTrace: the call-trace variant (args.h), launched only for communicators
// whose trace was enabled before the call was recorded; the production
// variant has no trace code at all.
template <typename T, bool kTrace>
__global__ void __launch_bounds__(kMaxThreads)
    OneShotLLKernel(const AllReduceArgs a) {
  const int block = blockIdx.x;
  const int t = threadIdx.x;
  const uint32_t line = block * a.lines_per_block + t;
  const bool active = t < static_cast<int>(a.lines_per_block) && line < a.lines;

  // Independent loads first: the epoch, this thread's payload and the scratch
  // addresses (the PeerTable does not change while a kernel runs, so the
  // read-only path is safe).
  const int rank = a.rank, world = a.world;
  const uint64_t epoch = LoadEpoch(a.epochs + block);
  char* const own = ScratchOf(a.peers, rank);
  // Call trace: one thread loads the pointer with the other loads and reads
  // the clock once its lines are sent.
  uint64_t* trace = nullptr;
  uint64_t t_sent = 0;
  if (kTrace && block == 0 && t == 0) {
    trace = reinterpret_cast<uint64_t*>(
        __ldg(reinterpret_cast<const unsigned long long*>(&a.peers->trace)));
  }
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(a.in) | reinterpret_cast<uintptr_t>(a.out)) &
       (kPayloadBytesPerLine - 1)) == 0;
  uint2 mine = {0u, 0u};
  if (active) mine = LoadPayload(static_cast<const char*>(a.in), a.n_bytes, line, aligned);
  const uint32_t flag = FlagOf(epoch);
  const int half = HalfOf(epoch);

  if (active) {
    // Send: one 16-byte store into every peer, starting with the next rank so
    // that ranks spread their first stores over different peers.
    if (a.peer_writes == PeerWrites::kSend) {
      const size_t slot = ScratchOffset(half, block, world, rank, t);
      for (int k = 1; k < world; ++k) {
        int peer = rank + k;
        if (peer >= world) peer -= world;
        StoreLine(ScratchOf(a.peers, peer) + slot, mine, flag);
      }
    } else if (a.peer_writes == PeerWrites::kLoopback) {
      for (int k = 1; k < world; ++k) {
        int peer = rank + k;
        if (peer >= world) peer -= world;
        StoreLine(own + ScratchOffset(half, block, world, peer, t), mine, flag);
      }
    }
    if (kTrace && trace != nullptr) t_sent = GlobalTimerNs();
    // Receive and reduce in rank order.
    RankOrderSum<T> sum;
    for (int src = 0; src < world; ++src) {
      uint2 p = mine;
      if (src != rank) {
        p = WaitLine(a.peers, own + ScratchOffset(half, block, world, src, t), flag,
                     WaitSite{rank, src, block, t, epoch});
      }
      sum.Add(src, p);
    }
    StorePayload(static_cast<char*>(a.out), a.n_bytes, line, aligned, sum.Result());
  }

  // Every thread of the block has read `epoch` and consumed its lines.
  __syncthreads();
  if (MustRezero(epoch)) {
    for (int i = t; i < world * kLinesPerBlock; i += blockDim.x) {
      ClearLine(own + ScratchOffset(half, block, world, 0, 0) +
                size_t(i) * kLineBytes);
    }
  }
  if (t == 0) a.epochs[block] = epoch + 1;
  if (kTrace && trace != nullptr) {
    const size_t e = 2 * size_t(epoch % kTraceSlots);
    trace[e] = t_sent;
    trace[e + 1] = GlobalTimerNs();
  }
}

template <typename T>
cudaError_t Launch(const AllReduceArgs& a, const OneShotGrid& g,
                   cudaStream_t stream, bool trace) {
  if (trace) {
    OneShotLLKernel<T, true><<<g.blocks, g.threads, 0, stream>>>(a);
  } else {
    OneShotLLKernel<T, false><<<g.blocks, g.threads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

OneShotGrid OneShotGridFor(uint32_t lines) {
  constexpr uint32_t kSmallBlockLines = 256;
  uint32_t blocks = (lines + kSmallBlockLines - 1) / kSmallBlockLines;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (lines + blocks - 1) / blocks;
  const uint32_t threads = ((per_block + 31) / 32) * 32;
  return {blocks, per_block, threads == 0 ? 32u : threads};
}

cudaError_t LaunchOneShotLL(AllReduceArgs a, DType dtype, cudaStream_t stream,
                            bool trace) {
  if (a.n_bytes == 0) return cudaSuccess;
  if (a.n_bytes > kOneShotMaxBytes || a.world < 2 || a.world > kMaxRanks ||
      a.rank >= a.world || a.peers == nullptr || a.epochs == nullptr) {
    return cudaErrorInvalidValue;
  }
  a.lines = (a.n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine;
  const OneShotGrid g = OneShotGridFor(a.lines);
  a.lines_per_block = static_cast<uint16_t>(g.lines_per_block);
  switch (dtype) {
    case DType::kF32:
      return Launch<float>(a, g, stream, trace);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(a, g, stream, trace);
    case DType::kF16:
      return Launch<__half>(a, g, stream, trace);
  }
  return cudaErrorInvalidValue;
}

cudaError_t PreloadOneShotLL() {
  cudaFuncAttributes attr;
  for (cudaError_t e : {cudaFuncGetAttributes(&attr, OneShotLLKernel<float, false>),
                        cudaFuncGetAttributes(&attr, OneShotLLKernel<__nv_bfloat16, false>),
                        cudaFuncGetAttributes(&attr, OneShotLLKernel<__half, false>),
                        cudaFuncGetAttributes(&attr, OneShotLLKernel<float, true>),
                        cudaFuncGetAttributes(&attr, OneShotLLKernel<__nv_bfloat16, true>),
                        cudaFuncGetAttributes(&attr, OneShotLLKernel<__half, true>)}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace llar
