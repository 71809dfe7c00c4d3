// One-shot LL128 all-reduce: the one-shot of one_shot_ll.cuh in 128-byte
// LL128 lines (ll128.cuh) instead of 16-byte LL lines: the kernel template
// and its Rule (host side: the grid rule). one_shot_ll128.cu instantiates it.
//
// Source: arXiv 2607.16100, section 4.1 (the one-shot), in NCCL's LL128 line
// format (120 payload bytes and an 8-byte flag per 128-byte line).
//
// Every rank stores its payload, packed in LL128 lines, into its slot of
// every peer's region; then it polls its own region for each peer's lines
// and reduces all ranks in rank order with RankOrderSum (reduce.cuh), element
// by element exactly as the one-shot LL does, so the result is bitwise the
// one-shot LL's (both are the float64 rank-order sum rounded once; int32 sums
// are exact). No barrier at entry or exit.
//
// Correctness rests on the hardware property that ll128.cuh states and
// ffi/tools/store_atomicity.cu tests (a 128-byte warp store arrives as one
// unit), not on a documented guarantee.
//
// Work split: 8 lanes per line, 4 lines per warp. Thread t of block b carries
// part j = t % 8 of line t / 8 of the block's region, which is payload line
// L = b * lines_per_block + t / 8 (active when t / 8 < lines_per_block and
// L < ceil(n_bytes / 120)). Line L holds payload units [15L, 15L + 15)
// (8 bytes each, bytes [120L, 120L + 120)); lane j < 7 loads, reduces and
// stores units 15L + 2j and 15L + 2j + 1, lane 7 unit 15L + 14. 120 is a
// multiple of 8 (and of 4 and 2), so every element lies inside one unit of
// one line. Buffers that are not 8-byte aligned and the last units of an
// odd-sized payload go through reduce.cuh's byte-wise path (zeros past
// n_bytes; nothing stored past it), out of line.
// Grid (OneShotLL128Rule::Grid below): OneShotLL128Rule::kBlockLines lines per
// block until kMaxBlocks blocks, then up to kLL128LinesPerBlock (64 lines,
// 512 threads); threads = whole warps of 4 lines.
//
// Region (args.h: OneShotLL128Offset, OneShotLL128RegionBytes): slot
// (half, block b, source src, line l) of 128 bytes, l < kLL128LinesPerBlock;
// its position depends only on (b, l) besides the half and the source, never
// on the grid or the size, so it belongs to warp (b, l / 4) at every size.
// The largest payload per rank is kOneShotLL128MaxBytes = 64 blocks x 64
// lines x 120 bytes, in a region of 2 x 64 x world x 64 x 128 bytes.
//
// Epochs, scratch reuse and re-zeroing: exactly epoch.cuh's contract and
// arguments, with this algorithm's own counter set (AllReduceArgs::epochs,
// args.h: EpochSetOffset). Warp w of block b reads E from its counter, sends
// and receives in half E & 1 of its lines with the flag word {LL128Flag(E),
// S} (S: the call's signature, AllReduceArgs::signature; ll128.cuh) and
// stores E + 1 after its sends (after a __syncwarp: every lane has read
// E). Reuse: a call moves at least one byte, so in call E + 1 every rank
// waits for line 0 of block 0 from every peer, which the peer stored in its
// own E + 1 kernel, launched after its E kernel (where it consumed half h)
// completed; a rank writes half h again only at E + 2. Re-zeroing: in
// MustRezero epochs each lane clears its own 16-byte part of its line in
// the half it used, for every source, after its last wait; every lane of
// the grid does so (inactive ones too), so no slot of a launched warp is
// older than kRezeroPeriod + 2 of its epochs.
//
// Bounded waits: WaitLL128Part (ll128.cuh, wait.cuh): a timed-out wait
// reports the rank, the peer, the block and as `line` the payload line index
// L, with the flag word it last saw; a line of this epoch with another
// signature (a mispaired call) ends the wait at once in the same report,
// code 2 (foreign signature).
//
// Template parameters:
//   T        float, __nv_bfloat16, __half or int32_t.
//   kWorld   2, 4 or 8 ranks known at compile time (loops unrolled, peer
//            addresses loaded once, float accumulation for 2 ranks); 0: any
//            number of ranks, read at run time.
#ifndef LLAR_KERNELS_ONE_SHOT_LL128_CUH_
#define LLAR_KERNELS_ONE_SHOT_LL128_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "kernels/ll128_thread.cuh"
#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll128.cuh"
#include "llar/peers.cuh"
#include "llar/reduce.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace one_shot_ll128 {

// Clears this lane's part of line `line` of `block` in half `half`, for every
// source rank (re-zeroing above). Out of line: twice every kRezeroPeriod calls.
static __device__ __noinline__ void RezeroParts(char* own, int half, int block, int world,
                                                int line, int part) {
  for (int src = 0; src < world; ++src) {
    ClearLL128Part(own + OneShotLL128Offset(half, block, world, src, line) +
                   part * kLL128PartBytes);
  }
}

}  // namespace one_shot_ll128

template <typename T, int kWorld>
__global__ void __launch_bounds__(kMaxThreads) OneShotLL128Kernel(const AllReduceArgs a) {
  constexpr int kUnroll = kWorld > 0 ? kWorld : 1;
  const LL128Thread<kWorld> th(a);  // rank, block, lane, epoch, scratch (ll128_thread.cuh)
  const PeerScratch<kWorld> peer(th.pt, th.rank, th.world);

  const uint32_t line = static_cast<uint32_t>(th.block) * a.lines_per_block + th.slot;
  const uint32_t lines = (a.n_bytes + kLL128PayloadBytes - 1) / kLL128PayloadBytes;
  const bool active = th.slot < static_cast<int>(a.lines_per_block) && line < lines;
  const uint32_t unit = line * kLL128UnitsPerLine + LL128FirstUnit(th.t);
  uint2 mine0 = {0u, 0u}, mine1 = {0u, 0u};
  if (active) {
    mine0 = LoadPayload(a.in, a.n_bytes, a.vector_lines, unit);
    if (!th.flag_lane) mine1 = LoadPayload(a.in, a.n_bytes, a.vector_lines, unit + 1);
  }

  // Send: the 8 lanes of a line store it with one instruction (ll128.cuh),
  // so the warp is converged first.
  const uint32_t flag = LL128Flag(th.epoch);
  const uint32_t signature = a.signature;
  const int half = HalfOf(th.epoch);
  const uint32_t part_offset = static_cast<uint32_t>(th.part) * kLL128PartBytes;
  const uint2 second = th.flag_lane ? uint2{flag, signature} : mine1;
  const uint32_t to = OneShotLL128Offset(half, th.block, th.world, th.rank, th.slot) + part_offset;
  __syncwarp();
  if (active) {
#pragma unroll kUnroll
    for (int k = 1; k < th.world; ++k) StoreLL128Part(peer(k) + to, mine0, second);
  }
  // Every lane has read E; the counter is read again only by the next kernel.
  __syncwarp();
  if (th.t % kWarpSize == 0) *th.counter = th.epoch + 1;

  // Receive and reduce in rank order (warp-collective waits: every lane of
  // the warp takes part, inactive lines without loading).
  RankOrderSum<T, AccumulatorFor<T, kWorld>> sum0, sum1;
#pragma unroll kUnroll
  for (int src = 0; src < th.world; ++src) {
    uint2 p0 = mine0, p1 = mine1;
    if (src != th.rank) {
      const uint32_t from = OneShotLL128Offset(half, th.block, th.world, src, th.slot);
      const uint4 v = WaitLL128Part(
          th.pt, th.own + from + part_offset, active, flag, signature,
          WaitSite{th.rank, src, th.block, static_cast<int32_t>(line), th.epoch});
      p0 = LL128Unit0(v);
      p1 = LL128Unit1(v);
    }
    sum0.Add(src, p0);
    sum1.Add(src, p1);  // the flag lane's is unused
  }
  if (active) {
    StorePayload(a.out, a.n_bytes, a.vector_lines, unit, sum0.Result());
    if (!th.flag_lane) StorePayload(a.out, a.n_bytes, a.vector_lines, unit + 1, sum1.Result());
  }
  if (MustRezero(th.epoch)) {
    one_shot_ll128::RezeroParts(th.own, half, th.block, th.world, th.slot, th.part);
  }
}

// Host side (kernel_table.cuh): the row of Algorithm::kOneShotLL128 and its
// grid rule (one_shot_ll128.cu) for `lines` LL128 lines: up to kBlockLines
// lines per block until kMaxBlocks blocks, then up to kLL128LinesPerBlock;
// threads = the lines per block in whole warps of 4 lines (8 lanes per
// line). kBlockLines gives each block the one-shot LL's 2 warps at small
// sizes; it is not measured for LL128 yet.
struct OneShotLL128Rule : RuleOf<Algorithm::kOneShotLL128, LL128Lines, OneShotSteps> {
  template <typename T, int kWorld>
  static constexpr auto Get() { return &OneShotLL128Kernel<T, kWorld>; }
  static KernelGrid Grid(uint32_t lines, int world, uint32_t block_lines);
  static constexpr uint32_t kBlockLines = 8;
};

}  // namespace llar

#endif  // LLAR_KERNELS_ONE_SHOT_LL128_CUH_
