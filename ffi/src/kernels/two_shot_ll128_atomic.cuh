// Two-shot LL128 atomic all-reduce: the two-shot LL128 (two_shot_ll128.cuh)
// whose reduce-scatter adds every rank's lines into the chunk owner's
// accumulator with `red.global.add` instead of storing them into per-source
// slots for the owner to sum in rank order: the kernel template and its Rule
// (host side). two_shot_ll128_atomic.cu instantiates it.
//
// Source: arXiv 2607.16100, section 4 (the atomic variant of the two-shot:
// 128-byte lines added into the owner's zeroed accumulator, with a per-line
// arrival count); the reduction instructions are PTX's red (vector forms
// red.global.add.v2/.v4.f32, sm_90), the ordering the PTX memory model's
// release and acquire patterns.
//
// NOT DETERMINISTIC (opt-in only). Floating-point atomics add in the order
// the contributions arrive, which changes from run to run, so the result may
// differ between runs and need not be bitwise the float64 rank-order
// reference the other algorithms promise. The tuning tables never choose it
// (jax_llar.algorithms.NON_DETERMINISTIC); JAX_LLAR_ALGORITHM forces it.
//
// The rule it does keep (jax_llar.testing.atomic_sum_violations checks it):
//   * every rank gets the same bits: the owner of a chunk computes it once
//     and all-gathers that result;
//   * int32: the sum modulo 2^32 (integer atomics are exact in any order),
//     so bitwise the reference;
//   * float32, bfloat16, float16: the sum is accumulated in float32, starting
//     from +0.0, by world - 1 atomic additions in arrival order (one per
//     peer) and one last addition of the owner's own value in registers, so
//     world - 1 roundings to float32: with S = sum |x_i| and E the exact sum,
//       |acc - E| <= gamma * S + 2 (world - 1) 2^-126,
//       gamma = (world - 1) u / (1 - (world - 1) u), u = 2^-24;
//     the second term because red.add.f32 on global memory flushes subnormal
//     inputs and results to (sign-preserving) zero (PTX ISA, red; float16
//     values are never float32 subnormals, bfloat16 and float32 ones can be).
//     float32 output is acc. bfloat16 and float16 output is acc rounded once
//     to the dtype (round to nearest even): within that bound plus the
//     dtype's rounding, u_d (|E| + bound) + half its smallest subnormal
//     (u_d = 2^-8 for bfloat16, 2^-11 for float16).
//   * where a partial sum may overflow float32 (S above float32's largest
//     finite value) or the bound reaches past the dtype's largest finite
//     value, the result may also be an infinity, or NaN when an input is
//     infinite;
//   * NaN when an input is NaN or inputs hold both infinities, stored as the
//     canonical NaN (reduce.cuh's rule);
//   * a zero result's sign is not kept: the accumulator starts at +0.0, so
//     addends that are all -0.0 sum to +0.0 where the reference gives -0.0.
//
// Protocol (chunks, work split and grid as two_shot_ll128.cuh: L =
// ceil(n_bytes / 120) LL128 lines cut into `world` chunks, TwoShotChunkOf;
// rank q owns chunk q; chunk index i is handled by the 8 lanes of one line
// slot; lane j < 7 of a line carries payload units 2j and 2j + 1, lane 7
// unit 14; grid TwoShotLL128Rule::Grid):
//   1. reduce-scatter: for every peer q with i < |chunk q|, the lanes add
//      line start(q) + i of the input into q's accumulator slot of (step,
//      half, block, line slot) with red.relaxed.sys.global.add (float dtypes:
//      the elements widened to float32, one red.v4.f32 or red.v2.f32 per 4 or
//      2 of them; int32: red.add.u32 per element). After all of the warp's
//      adds of the call: __syncwarp, fence.acq_rel.sys, and the flag lane of
//      each line sets bit `rank` of each owner's arrival mask for that line
//      (red.relaxed.sys.global.or.b32); then the warp advances its epoch
//      counter.
//   2. reduce: if i < |chunk rank|, the flag lane polls the arrival mask
//      with ld.acquire.sys until it holds every peer's bit and no other
//      (warp-collective, bounded); after a __syncwarp each lane reads its
//      accumulator part, adds its own input's values (float32 addition,
//      round to nearest even; int32 modulo 2^32), converts to the dtype
//      (canonical NaN), stores the result to its output and the 8 lanes
//      store it as one LL128 line (flag word {LL128Flag(E), 0}) into every
//      peer's all-gather slot; then each lane stores zeros over its 32-byte
//      part of the accumulator slot (lane 7's part holds the arrival mask).
//   3. all-gather: as two_shot_ll128.cuh: for every peer q with
//      i < |chunk q|, wait for q's reduced line i (WaitLL128Part) and store
//      it to the output at start(q) + i.
// No call signature (args.h: CarriesSignature, jax_llar.algorithms.SIGNED):
// the adds of a mispaired call land in the accumulator like any other, with
// no line to check, so the all-gather's flag words carry 0 in their high
// half (ll128.cuh: the unsigned WaitLL128Part) and AllReduceArgs::signature
// is not read.
// No barrier at entry, between the phases or at exit.
//
// Memory ordering of the reduce-scatter (what the owner's read rests on)
//   Each lane's adds are strong (relaxed, .sys scope) operations; the
//   __syncwarp orders every lane's adds before the flag lane's fence
//   (bar.warp.sync orders memory among the lanes it synchronises: CUDA
//   Programming Guide, __syncwarp), and the fence.acq_rel.sys followed by
//   the mask's red.or is a release pattern, cumulative over those adds. The
//   owner's flag lane reads the mask with ld.acquire.sys, an acquire
//   pattern; a __syncwarp then orders its read before every lane's loads of
//   the accumulator. So when the mask holds a peer's bit, every add of that
//   peer to the slot is visible. The adds themselves are atomic with respect
//   to each other because all use .sys scope (PTX: two atomic operations
//   are atomic to each other only if each one's scope includes the other;
//   ranks on different GPUs share only .sys). A vector red is atomic per
//   element, not as a whole, which the protocol never needs: nothing reads
//   the slot before every add has been counted. Unlike two_shot_ll128, the
//   reduce-scatter does NOT rest on 128-byte stores arriving as one unit;
//   the all-gather does (LL128 lines, ll128.cuh, ffi/tools/store_atomicity.cu).
//
// Region (args.h): accumulator slots (step s, half h, block b, line slot l)
// of kAtomicSlotBytes, TwoShotLL128AtomicAccOffset, lane j's part at 32 j,
// the arrival mask at kAtomicArrivalsOffset; then the all-gather's LL128 line
// slots (s, h, src, b, l), TwoShotLL128AtomicGatherOffset. Positions depend
// only on (s, b, l) besides the half and the source, never on the grid, the
// size or the dtype, so every slot belongs to warp (b, l / 4) at every size.
// The region is zero-filled when allocated (kernels.h: fill 0).
//
// Epochs and reuse (both kinds of slots, double buffered by epoch parity):
// two_shot_ll.cuh's argument holds word for word with "line slot" for
// "thread" and this algorithm's counter set. In call E + 1, block 0's first
// line slot handles index 0 of chunk 0 on every rank: every rank s != 0 adds
// its line 0 into rank 0's slot and sets its bit, rank 0 waits for all bits
// before it sends the reduced line to every rank, and every rank waits for
// that line in its kernel E + 1. So rank r's adds into half h in call E + 2
// come after every peer's kernel E completed, and that kernel read, and
// zeroed, what it received in half h in call E. Every accumulator slot a
// call adds into is read by its owner in that call (q reads slot (s, b, l)
// exactly when i < |chunk q|, which is when peers add to it).
//
// Zeroing: accumulators every call. The owner zeroes the parts it read,
// arrival mask included, right after reading them, so every slot is zero
// (+0.0 in every float32 word, 0 in every int32 word, no bit in the mask)
// whenever a call starts, whatever dtype used it last. No peer adds to that
// half before E + 2 (argument above), after this kernel completed. The
// all-gather slots carry flags and are cleared as two_shot_ll128.cuh's: in
// MustRezero epochs each lane clears its part of its line slot in every
// step the region holds, every source, in the half it used, after its last
// wait.
//
// Fault: a rank that never adds leaves its bit out of the owner's mask; the
// owner's bounded wait reports the lowest missing rank as `peer`, the
// expected mask as flag_expected and the mask it last read as flag_seen
// (flag_seen2 = 0), and traps (wait.cuh). A rank waiting in the all-gather
// reports the chunk owner, as two_shot_ll128.
//
// Template parameters:
//   T        float, __nv_bfloat16, __half or int32_t.
//   kWorld   2, 4 or 8 ranks known at compile time (loops unrolled, peer
//            addresses loaded once); 0: any number of ranks, read at run
//            time.
#ifndef LLAR_KERNELS_TWO_SHOT_LL128_ATOMIC_CUH_
#define LLAR_KERNELS_TWO_SHOT_LL128_ATOMIC_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "kernels/ll128_thread.cuh"
#include "kernels/two_shot_steps.cuh"
#include "kernels/two_shot_ll128.cuh"  // TwoShotLL128Rule, Units
#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll128.cuh"
#include "llar/peers.cuh"
#include "llar/reduce.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace two_shot_ll128_atomic {

static_assert(kAtomicLanePartBytes * kLL128LanesPerLine == kAtomicSlotBytes,
              "lane parts cover the slot");
static_assert(kAtomicArrivalsOffset >= (kLL128LanesPerLine - 1) * kAtomicLanePartBytes + 16 &&
                  kAtomicArrivalsOffset + 4 <= kAtomicSlotBytes,
              "the arrival mask lies in lane 7's part, after the words lane 7 adds into");
static_assert(kMaxRanks <= 32, "one bit per rank in the 32-bit arrival mask");

// --- the reduction and ordering instructions ---------------------------------

__device__ __forceinline__ void RedAddF32x4(char* dst, float a, float b, float c, float d) {
  asm volatile("red.relaxed.sys.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a),
               "f"(b), "f"(c), "f"(d)
               : "memory");
}
__device__ __forceinline__ void RedAddF32x2(char* dst, float a, float b) {
  asm volatile("red.relaxed.sys.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b)
               : "memory");
}
__device__ __forceinline__ void RedAddU32(char* dst, uint32_t v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(dst), "r"(v) : "memory");
}
__device__ __forceinline__ void RedOrB32(char* dst, uint32_t v) {
  asm volatile("red.relaxed.sys.global.or.b32 [%0], %1;" ::"l"(dst), "r"(v) : "memory");
}
__device__ __forceinline__ void FenceAcqRelSys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}
__device__ __forceinline__ uint32_t LoadAcquireSys(const char* src) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(src) : "memory");
  return v;
}
// 16 bytes of this rank's accumulator, bypassing L1 (the adds happen in L2).
__device__ __forceinline__ uint4 LoadPart16(const char* src) { return LoadLL128Part(src); }
__device__ __forceinline__ void StoreZero16(char* dst) { ClearLL128Part(dst); }

// --- the accumulator words of a dtype ----------------------------------------

// Word: float for the float dtypes, uint32_t for int32; kPerUnit words per
// 8-byte payload unit (Payload<T>::kPerLine).
template <typename T>
struct Acc {
  using Word = std::conditional_t<std::is_same_v<T, int32_t>, uint32_t, float>;
  static constexpr int kPerUnit = Payload<T>::kPerLine;
  static constexpr int kWords = 2 * kPerUnit;  // per lane of two units
  static_assert(kWords * 4 <= kAtomicLanePartBytes, "a lane's words fit its part");
};

// Adds the lane's units (u1 only when `two`: not the flag lane) into its
// part of a peer's accumulator slot at `dst`.
template <typename T>
__device__ __forceinline__ void AddPart(char* dst, uint2 u0, uint2 u1, bool two) {
  using W = typename Acc<T>::Word;
  constexpr int n = Acc<T>::kPerUnit;
  W w0[n], w1[n];
  Payload<T>::Unpack(u0, w0);
  Payload<T>::Unpack(u1, w1);
  if constexpr (std::is_same_v<T, int32_t>) {
    RedAddU32(dst, w0[0]);
    RedAddU32(dst + 4, w0[1]);
    if (two) {
      RedAddU32(dst + 8, w1[0]);
      RedAddU32(dst + 12, w1[1]);
    }
  } else if constexpr (n == 2) {  // float32: 2 words per unit
    if (two) {
      RedAddF32x4(dst, w0[0], w0[1], w1[0], w1[1]);
    } else {
      RedAddF32x2(dst, w0[0], w0[1]);
    }
  } else {  // 16-bit dtypes: 4 float32 words per unit
    RedAddF32x4(dst, w0[0], w0[1], w0[2], w0[3]);
    if (two) RedAddF32x4(dst + 16, w1[0], w1[1], w1[2], w1[3]);
  }
}

// The lane's result units: its accumulator part at `src` (this rank's
// slot) plus its own input units, rounded once to T (canonical NaN). `two`:
// the lane has a second unit (not the flag lane, whose second 16 bytes hold
// the arrival mask in the 16-bit dtypes' layout); r1 is {0, 0} otherwise.
template <typename T>
__device__ __forceinline__ void ResultOfPart(const char* src, uint2 own0, uint2 own1, bool two,
                                             uint2* r0, uint2* r1) {
  using W = typename Acc<T>::Word;
  constexpr int n = Acc<T>::kPerUnit;
  W acc[2 * n];
  const uint4 lo = LoadPart16(src);
  const uint32_t lo_words[4] = {lo.x, lo.y, lo.z, lo.w};
  uint32_t hi_words[4] = {0u, 0u, 0u, 0u};
  if constexpr (n == 4) {
    uint4 hi = {0u, 0u, 0u, 0u};
    if (two) hi = LoadPart16(src + 16);
    hi_words[0] = hi.x;
    hi_words[1] = hi.y;
    hi_words[2] = hi.z;
    hi_words[3] = hi.w;
  }
#pragma unroll
  for (int k = 0; k < 2 * n; ++k) {
    const uint32_t bits = k < 4 ? lo_words[k] : hi_words[k - 4];
    if constexpr (std::is_same_v<W, float>) {
      acc[k] = __uint_as_float(bits);
    } else {
      acc[k] = bits;
    }
  }
  W m0[n], m1[n];
  Payload<T>::Unpack(own0, m0);
  Payload<T>::Unpack(own1, m1);
#pragma unroll
  for (int k = 0; k < n; ++k) {
    m0[k] = AddRn(acc[k], m0[k]);
    m1[k] = AddRn(acc[n + k], m1[k]);
  }
  *r0 = Payload<T>::Pack(m0);
  *r1 = two ? Payload<T>::Pack(m1) : uint2{0u, 0u};
}

// Zeroes the lane's 32-byte part of this rank's accumulator slot (lane 7's
// holds the arrival mask).
__device__ __forceinline__ void ZeroPart(char* dst) {
  StoreZero16(dst);
  StoreZero16(dst + 16);
}

// The timeout report of an arrivals wait (wait.cuh's record): `peer` is the
// lowest rank missing from the mask last read, -1 if none is (bits beyond
// `expected`); flag_expected = expected, flag_seen = the mask, flag_seen2 =
// 0. Inline, around wait.cuh's out-of-line ReportAndTrap, which never
// returns, so the callers keep nothing live across the call. (As a second
// out-of-line function of its own, ptxas held the 8-rank kernels that follow
// the first in this file to 64 registers, with spills.)
[[noreturn]] __device__ __forceinline__ void ArrivalsTimeout(const PeerTable* pt, int rank,
                                                                int block, int32_t line,
                                                                uint64_t epoch,
                                                                uint32_t expected,
                                                                uint32_t seen,
                                                                uint64_t waited_ns) {
  const uint32_t missing = expected & ~seen;
  const int peer = missing != 0u ? __ffs(static_cast<int>(missing)) - 1 : -1;
  ReportTimeoutAndTrap(pt, WaitSite{rank, peer, block, line, epoch}, expected, seen, 0u,
                       waited_ns);
  __builtin_unreachable();
}

// Warp-collective bounded wait for the arrival masks of the warp's lines:
// every lane calls it; `poll` is true on the flag lane of a line that is
// awaited (its mask word at `mask`). Returns when every polled mask equals
// `expected`; then a __syncwarp orders the acquire before every lane's loads.
// Bounded as WaitBound (wait.cuh): the clock every kSpinsPerClockRead polls,
// pt->timeout_ns, then ArrivalsTimeout.
__device__ __forceinline__ void WaitArrivals(const PeerTable* pt, const char* mask, bool poll,
                                             uint32_t expected, int rank, int block,
                                             int32_t line, uint64_t epoch) {
  uint32_t seen = poll ? LoadAcquireSys(mask) : expected;
  if (__any_sync(0xffffffffu, seen != expected)) {
    uint64_t start = 0;
    uint32_t spins = 0;
    while (true) {
      if (poll) seen = LoadAcquireSys(mask);
      if (!__any_sync(0xffffffffu, seen != expected)) break;
      if (seen == expected || ++spins != kSpinsPerClockRead) continue;
      spins = 0;
      const uint64_t now = GlobalTimerNs();
      if (start == 0) {
        start = now;
      } else if (now - start > pt->timeout_ns) {
        ArrivalsTimeout(pt, rank, block, line, epoch, expected, seen, now - start);
      }
    }
  }
  __syncwarp();
}

// Clears this lane's part of all-gather line slot `slot` of `block` in half
// `half`: every step the region holds, every source (re-zeroing above).
// Out of line: twice every kRezeroPeriod calls.
static __device__ __noinline__ void RezeroGather(char* own, int half, int world, int block,
                                                 int slot, int part) {
  const int steps = static_cast<int>(TwoShotLL128MaxSteps(world));
  for (int s = 0; s < steps; ++s) {
    for (int src = 0; src < world; ++src) {
      ClearLL128Part(own + TwoShotLL128AtomicGatherOffset(s, half, world, src, block, slot) +
                     part * kLL128PartBytes);
    }
  }
}

// The lane's payload units of a line, loaded from `in` and stored to `out`:
// the two-shot LL128's (two_shot_ll128.cuh).
using two_shot_ll128::LoadUnits;
using two_shot_ll128::StoreUnits;
using two_shot_ll128::Units;

}  // namespace two_shot_ll128_atomic

// At least one block of kMaxThreads per multiprocessor (a call's grid is
// at most kMaxBlocks blocks): without the 1, ptxas held the 8-rank kernels to
// 64 registers and spilled.
template <typename T, int kWorld>
__global__ void __launch_bounds__(kMaxThreads, 1)
    TwoShotLL128AtomicKernel(const AllReduceArgs a) {
  namespace at = two_shot_ll128_atomic;
  constexpr int kUnroll = kWorld > 0 ? kWorld : 1;
  const LL128Thread<kWorld> th(a);
  const PeerScratch<kWorld> peer(th.pt, th.rank, th.world);
  const int first_unit = LL128FirstUnit(th.t);
  const uint32_t acc_part = static_cast<uint32_t>(th.part) * kAtomicLanePartBytes;
  const uint32_t line_part = static_cast<uint32_t>(th.part) * kLL128PartBytes;
  const TwoShotSteps g(a, kLL128PayloadBytes, blockDim.x / kLL128LanesPerLine, th.block,
                       th.world, th.rank, th.epoch);
  const uint32_t flag = LL128Flag(th.epoch);
  const uint32_t arrivals = ((1u << th.world) - 1u) & ~(1u << th.rank);

  // 1. Reduce-scatter: add line start(q) + i of the input into owner q's
  // accumulator slot.
  for (int s = 0; s < g.steps; ++s) {
    const uint32_t j = static_cast<uint32_t>(s) * g.slots + th.slot;
    const uint32_t i = g.first + j;
    const bool in_block = j < g.per_block;
    const uint32_t off = TwoShotLL128AtomicAccOffset(s, g.half, th.block, th.slot) + acc_part;
    if constexpr (kWorld > 0) {
      // Every load first, then every add.
      at::Units v[kWorld - 1];
#pragma unroll
      for (int k = 1; k < kWorld; ++k) {
        const TwoShotChunk c =
            TwoShotChunkOf(g.lines, kWorld, internal::PeerAt(th.rank, k, kWorld));
        v[k - 1] = in_block && i < c.lines ? at::LoadUnits(a, c.start + i, th.flag_lane, first_unit)
                                           : at::Units{{0u, 0u}, {0u, 0u}};
      }
#pragma unroll
      for (int k = 1; k < kWorld; ++k) {
        const int q = internal::PeerAt(th.rank, k, kWorld);
        if (in_block && i < TwoShotChunkOf(g.lines, kWorld, q).lines) {
          at::AddPart<T>(peer(k) + off, v[k - 1].u0, v[k - 1].u1, !th.flag_lane);
        }
      }
    } else {
      for (int k = 1; k < th.world; ++k) {
        const TwoShotChunk c =
            TwoShotChunkOf(g.lines, th.world, internal::PeerAt(th.rank, k, th.world));
        if (in_block && i < c.lines) {
          const at::Units v = at::LoadUnits(a, c.start + i, th.flag_lane, first_unit);
          at::AddPart<T>(peer(k) + off, v.u0, v.u1, !th.flag_lane);
        }
      }
    }
  }
  // Publish: every add of the warp before its arrival bits (release pattern).
  __syncwarp();
  at::FenceAcqRelSys();
  if (th.flag_lane) {
    for (int s = 0; s < g.steps; ++s) {
      const uint32_t j = static_cast<uint32_t>(s) * g.slots + th.slot;
      const uint32_t i = g.first + j;
      if (j >= g.per_block) continue;
      const uint32_t off =
          TwoShotLL128AtomicAccOffset(s, g.half, th.block, th.slot) + kAtomicArrivalsOffset;
#pragma unroll kUnroll
      for (int k = 1; k < th.world; ++k) {
        if (i < TwoShotChunkOf(g.lines, th.world, internal::PeerAt(th.rank, k, th.world)).lines) {
          at::RedOrB32(peer(k) + off, 1u << th.rank);
        }
      }
    }
  }
  // Every lane has read E; the counter is read again only by the next kernel.
  __syncwarp();
  if (th.t % kWarpSize == 0) *th.counter = th.epoch + 1;

  // 2. Reduce: wait for every peer's adds to this rank's chunk, add this
  // rank's own values, keep the result and send it to every peer; zero the
  // slot. Every lane runs every step (the waits are warp-collective).
  for (int s = 0; s < g.steps; ++s) {
    const uint32_t j = static_cast<uint32_t>(s) * g.slots + th.slot;
    const uint32_t i = g.first + j;
    const bool act = j < g.per_block && i < g.mine.lines;
    const uint32_t line = g.mine.start + i;
    at::Units own_part{{0u, 0u}, {0u, 0u}};
    if (act) own_part = at::LoadUnits(a, line, th.flag_lane, first_unit);
    char* acc = th.own + TwoShotLL128AtomicAccOffset(s, g.half, th.block, th.slot);
    at::WaitArrivals(th.pt, acc + kAtomicArrivalsOffset, act && th.flag_lane, arrivals, th.rank,
                     th.block, static_cast<int32_t>(line), th.epoch);
    uint2 r0 = {0u, 0u}, r1 = {0u, 0u};
    if (act) {
      at::ResultOfPart<T>(acc + acc_part, own_part.u0, own_part.u1, !th.flag_lane, &r0, &r1);
      at::ZeroPart(acc + acc_part);
      at::StoreUnits(a, line, th.flag_lane, first_unit, r0, r1);
    }
    const uint32_t off =
        TwoShotLL128AtomicGatherOffset(s, g.half, th.world, th.rank, th.block, th.slot) + line_part;
    const uint2 second = th.flag_lane ? uint2{flag, 0u} : r1;
    __syncwarp();  // the 8 lanes of a line store it with one instruction
    if (act) {
#pragma unroll kUnroll
      for (int k = 1; k < th.world; ++k) StoreLL128Part(peer(k) + off, r0, second);
    }
  }

  // 3. All-gather: every peer's reduced chunk, into the output.
  for (int s = 0; s < g.steps; ++s) {
    const uint32_t j = static_cast<uint32_t>(s) * g.slots + th.slot;
    const uint32_t i = g.first + j;
    const bool in_block = j < g.per_block;
#pragma unroll kUnroll
    for (int k = 1; k < th.world; ++k) {
      const int q = internal::PeerAt(th.rank, k, th.world);
      const TwoShotChunk c = TwoShotChunkOf(g.lines, th.world, q);
      const bool act = in_block && i < c.lines;
      const uint32_t line = c.start + i;
      const uint4 v = WaitLL128Part(
          th.pt,
          th.own + TwoShotLL128AtomicGatherOffset(s, g.half, th.world, q, th.block, th.slot) +
              line_part,
          act, flag, WaitSite{th.rank, q, th.block, static_cast<int32_t>(line), th.epoch});
      if (act) at::StoreUnits(a, line, th.flag_lane, first_unit, LL128Unit0(v), LL128Unit1(v));
    }
  }
  if (MustRezero(th.epoch)) at::RezeroGather(th.own, g.half, th.world, th.block, th.slot, th.part);
}

// Host side (kernel_table.cuh): the row of Algorithm::kTwoShotLL128Atomic on
// the two-shot LL128's lines, grid rule (two_shot_ll128_atomic.cu) and steps
// (TwoShotLL128Rule; the region holds as many steps).
struct TwoShotLL128AtomicRule : TwoShotLL128Rule {
  static constexpr Algorithm kAlgorithm = Algorithm::kTwoShotLL128Atomic;
  template <typename T, int kWorld>
  static constexpr auto Get() { return &TwoShotLL128AtomicKernel<T, kWorld>; }
  static KernelGrid Grid(uint32_t lines, int world, uint32_t block_lines);
};

}  // namespace llar

#endif  // LLAR_KERNELS_TWO_SHOT_LL128_ATOMIC_CUH_
