// One-shot sentinel all-reduce (arXiv 2607.16100, section 4: the one-shot's
// sentinel variant): the kernel template and its Rule (host side).
// one_shot_sentinel.cu instantiates it.
//
// Every rank stores its payload, 16 bytes per line with no flag word
// (sentinel.cuh), into its slot of every peer's scratch region; then it
// polls its own region for each peer's line, reduces all ranks in rank order
// (reduce.cuh: the one-shot LL's additions), stores the sum with every NaN
// made the canonical NaN (sentinel.cuh, NaN results) and re-arms the slots
// it read. No barrier at entry or exit. SentinelSession applies the protocol
// rules; the kernel is the algorithm's steps.
//
// Dtypes: float32, bfloat16, float16. Not int32 (sentinel.cuh: a payload
// equal to the sentinel cannot be changed without changing the sum); the
// launcher refuses it and jax_llar's policy never asks for it.
//
// Work split: thread t of block b owns line b * lines_per_block + t, 16
// payload bytes; the grid is the one-shot's rule in lines (OneShotGridFor,
// kernels.h: up to kOneShotBlockLines lines per block until kMaxBlocks
// blocks, then up to kLinesPerBlock), so a 16-byte line per thread moves
// twice the one-shot's bytes per thread.
//
// Scratch region (args.h: RegionBytes): the one-shot's layout, two halves
// (epoch parity) x kMaxBlocks blocks x world sources x kLinesPerBlock slots
// x 16 bytes, slot (half, b, src, t) at ScratchOffset(half, b, world, src, t)
// from the region's base, t the thread index in its block. A slot's place
// depends only on (b, t) besides the half and the source, never on the grid
// of a call, so it belongs to warp (b, t / 32) at every size. Payload per
// rank: kMaxBlocks x kLinesPerBlock x 16 bytes (kOneShotSentinelMaxBytes),
// twice the one-shot LL's in the same region size. The region is filled with
// kSentinelFill when allocated: every slot starts armed.
//
// Epoch counters: the algorithm's own set (a.epochs), one per (block,
// warp), advanced once per call by the warp's lane 0 right after its sends
// (epoch.cuh's contract, which every rule below relies on: every rank runs
// the same calls with the same grids, so a warp's counter stands for the same
// call on every rank).
//
// Slot invariant
//   Between kernels, every slot of a rank's region holds either the sentinel
//   or exactly one line that a peer wrote for the next epoch of that half in
//   which the slot's lane is active and that this rank has not run yet. A
//   lane that is active on one rank is active on every rank (same grid and
//   payload size), so each line written is read and re-armed by the same
//   lane of its reader in the same epoch. Unlike an LL flag, the sentinel
//   carries no epoch: if ranks disagreed on a call's payload size (a
//   violation of the contract above), a line written and never read would
//   be taken for the next line of its slot, where the LL would time out.
//   For the same reason a corrupted slot (a stray store, the fault of
//   FAILURE_CLASSES F13 "corrupted flag word") is taken as data: the
//   sentinel has no flag to corrupt, so such a fault gives a wrong sum
//   where an LL line would end in the bounded wait's error; and a mispaired
//   call is not detected either (no signature: jax_llar.algorithms.SIGNED).
//   Neither is chosen by a tuning table without --allow_unsigned.
//
// Why no barrier is needed (reuse argument)
//   Fix warp w of block b. Rank r writes half h of w's slots in p's scratch
//   in call c0 (epoch E) and next in call c2 (epoch E + 2). Inside p's c0
//   kernel, the lane that reads r's c0 line re-arms its slot after reading
//   it (SentinelSession::End), so both the read and the re-arm store are
//   done when p's c0 kernel completes. r stores its c2 line only after r's
//   kernel of c1 (epoch E + 1, a call whose grid launched warp w) completed.
//   Warp w may have had no active lane in c1, but c1 moved at least one byte
//   and every active line goes to every peer, so some thread of r's c1 waited
//   for a line that p stored in its own c1 kernel, which p launched after
//   its c0 kernel completed. Kernel completion on p orders p's reads and
//   re-arm stores of half h before its later remote stores, and r's c2
//   store is causally after r received p's c1 line. So r's c2 line finds
//   the slot armed, and no re-arm of an earlier epoch can land on top of it.
//   Within one call nothing more is needed: each slot is written once (by
//   its source) and re-armed once (by its reader, after reading).
//
// Error report: as the LL's (rank, peer, block, line = t, epoch), with the
// flag fields of sentinel.cuh (flag_expected = kSentinelFold; flag_seen and
// flag_seen2 equal to it for a word that never arrived).
//
// Template parameters:
//   T        float, __nv_bfloat16 or __half.
//   kWorld   2, 4 or 8: the number of ranks known at compile time (loops
//            unrolled, peer addresses loaded with the first loads, float
//            accumulation for 2 ranks, reduce.cuh); 0: any number of ranks,
//            read at run time.
// The byte-wise tail and the timeout report are out of line.
#ifndef LLAR_KERNELS_ONE_SHOT_SENTINEL_CUH_
#define LLAR_KERNELS_ONE_SHOT_SENTINEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "llar/reduce.cuh"
#include "llar/sentinel.cuh"

namespace llar {
namespace sentinel {

// The byte-wise paths: the last line, or every line of a buffer that is not
// 16-byte aligned (missing bytes read as zero). Out of line.
inline __device__ __noinline__ ulonglong2 LoadLineTail(const char* in, uint32_t n_bytes,
                                                        uint32_t line) {
  const uint32_t off = line * kSentinelLineBytes;
  uint8_t b[kSentinelLineBytes] = {};
#pragma unroll
  for (int i = 0; i < kSentinelLineBytes; ++i) {
    if (off + i < n_bytes) b[i] = static_cast<uint8_t>(in[off + i]);
  }
  ulonglong2 v;
  __builtin_memcpy(&v, b, sizeof(v));
  return v;
}

inline __device__ __noinline__ void StoreLineTail(char* out, uint32_t n_bytes, uint32_t line,
                                                  ulonglong2 v) {
  const uint32_t off = line * kSentinelLineBytes;
  uint8_t b[kSentinelLineBytes];
  __builtin_memcpy(b, &v, sizeof(v));
#pragma unroll
  for (int i = 0; i < kSentinelLineBytes; ++i) {
    if (off + i < n_bytes) out[off + i] = static_cast<char>(b[i]);
  }
}

// Line `line` of the input: one 16-byte load for the first `vector_lines`
// lines (AllReduceArgs::vector_lines, in 16-byte lines here), else byte-wise.
__device__ __forceinline__ ulonglong2 LoadLine(const void* in, uint32_t n_bytes,
                                               uint32_t vector_lines, uint32_t line) {
  if (line < vector_lines) return __ldg(static_cast<const ulonglong2*>(in) + line);
  return LoadLineTail(static_cast<const char*>(in), n_bytes, line);
}

__device__ __forceinline__ void StoreLine(void* out, uint32_t n_bytes, uint32_t vector_lines,
                                          uint32_t line, ulonglong2 v) {
  if (line < vector_lines) {
    static_cast<ulonglong2*>(out)[line] = v;
    return;
  }
  StoreLineTail(static_cast<char*>(out), n_bytes, line, v);
}

__device__ __forceinline__ uint2 Low(ulonglong2 v) {
  return {static_cast<uint32_t>(v.x), static_cast<uint32_t>(v.x >> 32)};
}
__device__ __forceinline__ uint2 High(ulonglong2 v) {
  return {static_cast<uint32_t>(v.y), static_cast<uint32_t>(v.y >> 32)};
}
__device__ __forceinline__ ulonglong2 Join(uint2 lo, uint2 hi) {
  return {uint64_t(lo.x) | (uint64_t(lo.y) << 32), uint64_t(hi.x) | (uint64_t(hi.y) << 32)};
}

}  // namespace sentinel

template <typename T, int kWorld>
__global__ void __launch_bounds__(kMaxThreads) OneShotSentinelKernel(const AllReduceArgs a) {
  static_assert(!std::is_same_v<T, int32_t>, "the sentinel protocol serves floats only");
  constexpr int kUnroll = kWorld > 0 ? kWorld : 1;
  const int block = blockIdx.x;
  const int t = threadIdx.x;
  SentinelSession<kWorld> s(a, block, t);  // loads the warp's epoch and the addresses

  const uint32_t line = block * a.lines_per_block + t;
  const uint32_t lines = (a.n_bytes + kSentinelLineBytes - 1) / kSentinelLineBytes;
  const bool active = t < static_cast<int>(a.lines_per_block) && line < lines;
  ulonglong2 mine = {0, 0};
  if (active) {
    mine = CanonicalLine<T>(sentinel::LoadLine(a.in, a.n_bytes, a.vector_lines, line));
  }

  s.Send(active, mine);  // and advance the warp's epoch

  if (active) {
    // Receive and reduce in rank order, each 8-byte half as the one-shot LL does.
    RankOrderSum<T, AccumulatorFor<T, kWorld>> lo, hi;
#pragma unroll kUnroll
    for (int src = 0; src < s.world(); ++src) {
      ulonglong2 p = mine;
      if (src != s.rank()) p = s.Recv(src);
      lo.Add(src, sentinel::Low(p));
      hi.Add(src, sentinel::High(p));
    }
    // NaN results are canonical NaNs (reduce.cuh).
    sentinel::StoreLine(a.out, a.n_bytes, a.vector_lines, line,
                        sentinel::Join(lo.Result(), hi.Result()));
  }
  s.End(active);  // re-arm the slots read
}

// Host side (kernel_table.cuh): the row of Algorithm::kOneShotSentinel on the
// one-shot grid (one_shot_sentinel.cu: OneShotGridFor) over 16-byte lines,
// moved with one 16-byte access when in and out are both 16-byte aligned
// (AllReduceArgs::vector_lines counts 16-byte lines); float dtypes only (the
// launcher refuses int32 with cudaErrorInvalidValue).
struct SentinelLines {  // sentinel.cuh: 16 bytes, no flag; no int32
  static constexpr bool kInt32 = false;
  static constexpr uint32_t kLinePayloadBytes = kSentinelLineBytes;
  static constexpr uint32_t kVectorBytes = kSentinelLineBytes;
};
struct OneShotSentinelRule
    : RuleOf<Algorithm::kOneShotSentinel, SentinelLines, OneShotSteps> {
  template <typename T, int kWorld>
  static constexpr auto Get() { return &OneShotSentinelKernel<T, kWorld>; }
  static KernelGrid Grid(uint32_t lines, int world, uint32_t block_lines);
};

}  // namespace llar

#endif  // LLAR_KERNELS_ONE_SHOT_SENTINEL_CUH_
