// LL128 protocol: one 128-byte line carries 120 bytes of payload and an
// 8-byte flag, stored by 8 lanes of a warp with one vector store instruction.
//
// Source: NCCL's LL128 protocol (its line of 16 eight-byte words, 15 of them
// data and 1 flag, carried by 8 threads); arXiv 2607.16100, section 4 (the
// family of line formats the algorithms are written in).
//
// Line layout
//   A line is 128 bytes, 128-byte aligned in the reader's scratch (every
//   region base is: cudaMalloc and NCCL windows align far more, and every
//   slot offset is a multiple of kLL128LineBytes). Lanes 8k .. 8k + 7 of a
//   warp carry line k of the warp (kLL128LinesPerWarp = 4 lines per warp);
//   lane 8k + j holds bytes [16j, 16j + 16) of the line. Lanes 8k .. 8k + 6
//   hold 16 payload bytes each, lane 8k + 7 holds 8 payload bytes and then
//   the flag word: 7 * 16 + 8 = 120 payload bytes. In 8-byte payload units
//   (the unit reduce.cuh's Payload<T> packs): lane j < 7 holds units 2j and
//   2j + 1 of the line, lane 7 unit 14; line L of a payload holds units
//   [15L, 15L + 15), i.e. bytes [120L, 120L + 120). 8 bytes is a whole number
//   of elements of every dtype served (4-byte and 2-byte types), so no
//   element straddles two units or two lines.
//
// Contract
//   Writer: the 8 lanes of a line store their 16-byte parts into the
//   reader's scratch with ONE warp-wide st.volatile.global.v4.u32
//   (StoreLL128Part, executed by the converged warp: the kernel calls
//   __syncwarp() before its sends), the flag lane's part carrying the flag
//   word {LL128Flag(E), S} in its second 8 bytes.
//   Reader: every lane loads its 16-byte part of its line with the same lane
//   mapping, one warp-wide ld.volatile.global.v4.u32 (LoadLL128Part); the
//   flag lane checks the flag word; the warp reloads (every lane, one
//   instruction again) while __any_sync says some line of the warp is not
//   ready (WaitLL128Part). It then uses the parts of that last load, flag and
//   payload from the same instruction. A flag lane whose line is foreign
//   (below) reports and traps at once.
//
// Memory-ordering argument, and what it rests on
//   The reader accepts a line when its flag lane sees the flag word of E and uses
//   the other 7 lanes' parts from the same load instruction. This is correct
//   only if the writer's 128-byte store reaches the reader's memory as one
//   unit AND the reader's 128-byte load reads it as one unit: then a load
//   that sees the flag word of the store sees all 120 payload bytes of it.
//   That is an ASSUMPTION about the hardware, NOT a documented guarantee.
//   The PTX memory model treats a vector access as a set of scalar accesses
//   of at most 8 bytes each, performed in an unspecified order, and the 8
//   lanes' accesses as separate operations; it only promises that each
//   aligned 8-byte word is never split (which is all the LL protocol,
//   ll.cuh, needs). NCCL's LL128 rests on the same assumption and is enabled
//   by NCCL only where that holds (its release notes name data corruption
//   where the traffic passes through the CPU). Here the evidence is the
//   hardware test ffi/tools/store_atomicity.cu (python -m
//   jax_llar.tools.store_atomicity): writers store lines shaped like these,
//   readers poll them with the same lane mapping under adversarial timing
//   and count lines whose flag is new but whose payload is not; on one
//   device that tests L2, across two devices NVLink. Where the property does
//   not hold, a reader can accept a partly stale line: a wrong answer, not a
//   hang. benchmarks/NOTES.md records each run of that test.
//   No fence is needed on either side otherwise, as in ll.cuh: the flag and
//   its payload travel in one store, and the reader never waits for a
//   separate flag.
//
// Flags and signatures
//   The flag word of epoch E and signature S (AllReduceArgs::signature) is
//   LL128Flag(E) = low32(E) | 1 in its low 32 bits and S in its high 32
//   bits (0 when signatures are off). Its low half is never 0, so zero-filled
//   scratch never looks ready; two epochs of one half share a low half only
//   2^32 epochs apart, and the re-zeroing of epoch.cuh (the LL's window,
//   made for 16 epoch bits) keeps stale content far younger. Two calls that
//   pair correctly store and expect the same flag word. A line is foreign
//   when its flag word has the expected low half and another high half:
//   under the hardware property below the flag lane sees the whole line's
//   store, so the line is complete; a correctly paired call never sees one
//   (ll.cuh's argument, with the re-zeroing bound of epoch.cuh), so the wait
//   reports it at once (ErrorRecord code 2, flag_seen2 the high half seen)
//   instead of accepting another call's line. Its limits are the LL's: calls
//   of one signature, and signatures off.
#ifndef LLAR_LL128_CUH_
#define LLAR_LL128_CUH_

#include <cstdint>

#include "llar/args.h"
#include "llar/ll.cuh"
#include "llar/wait.cuh"

namespace llar {

// kLL128LineBytes (128), kLL128PayloadBytes (120) and kLL128LinesPerBlock
// are in args.h, which the host code reads too.
inline constexpr int kLL128LanesPerLine = 8;
inline constexpr int kLL128LinesPerWarp = kWarpSize / kLL128LanesPerLine;
inline constexpr int kLL128PartBytes = kLL128LineBytes / kLL128LanesPerLine;  // per lane
inline constexpr int kLL128FlagLane = kLL128LanesPerLine - 1;  // of each line's 8
// 8-byte payload units (reduce.cuh's Payload) per line.
inline constexpr int kLL128UnitsPerLine = kLL128PayloadBytes / kPayloadBytesPerLine;
static_assert(kLL128UnitsPerLine * kPayloadBytesPerLine == kLL128PayloadBytes,
              "a line holds whole payload units");
static_assert(kLL128LinesPerWarp * kLL128LanesPerLine == kWarpSize, "lines per warp");
static_assert(kLL128LinesPerBlock * kLL128LanesPerLine == kMaxThreads, "lines per block");
static_assert(kLL128PayloadBytes == kLL128LineBytes - 8, "one 8-byte flag word per line");

// The lane's place in its line (0 .. 7) and whether it carries the flag.
__device__ __forceinline__ int LL128LaneInLine(int thread) {
  return thread & (kLL128LanesPerLine - 1);
}
__device__ __forceinline__ bool IsLL128FlagLane(int thread) {
  return LL128LaneInLine(thread) == kLL128FlagLane;
}

// The first of the lane's payload units in its line: 2j for lane j < 7 (and
// 2j + 1 after it), 14 for the flag lane (its only unit).
__device__ __forceinline__ int LL128FirstUnit(int thread) {
  return 2 * LL128LaneInLine(thread);
}

// The low 32 bits of the flag word of epoch E; the high 32 bits are the
// call's signature.
__device__ __forceinline__ uint32_t LL128Flag(uint64_t epoch) {
  return static_cast<uint32_t>(epoch) | 1u;
}

// Stores the lane's 16-byte part {a, b} at `dst` (its part of a line,
// possibly in a peer's memory). The flag lane passes b = {flag, signature}.
// All 8 lanes of the line must execute this same instruction (contract).
__device__ __forceinline__ void StoreLL128Part(char* dst, uint2 a, uint2 b) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(a.x),
               "r"(a.y), "r"(b.x), "r"(b.y)
               : "memory");
}

// Loads the lane's 16-byte part of a line of its own scratch, bypassing L1.
__device__ __forceinline__ uint4 LoadLL128Part(const char* src) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src)
               : "memory");
  return v;
}

// The flag lane's check of its part: the flag word (its second 8 bytes).
__device__ __forceinline__ bool LL128PartReady(uint4 v, uint32_t flag, uint32_t signature) {
  return v.z == flag && v.w == signature;
}

// The check of a protocol whose flag words carry no signature (high half 0):
// two_shot_ll128_atomic's all-gather.
__device__ __forceinline__ bool LL128PartReady(uint4 v, uint32_t flag) {
  return LL128PartReady(v, flag, 0u);
}

// The flag lane's part of a foreign line (above), for a part that is not
// ready: this epoch's low half, so another signature.
__device__ __forceinline__ bool LL128PartForeign(uint4 v, uint32_t flag) { return v.z == flag; }

// The report of an LL128 wait: `flag` and `signature` expected, `v` the flag
// lane's part last read (flag_seen: the low half, flag_seen2: the high half).
__device__ __forceinline__ ReportFlags LL128ReportFlags(uint32_t flag, uint32_t signature,
                                                       uint4 v) {
  return {flag, v.z, v.w, signature, v.w, 32u};
}

// The part's payload units: the first, and the second (lanes j < 7 only;
// the flag lane's second 8 bytes are the flag word).
__device__ __forceinline__ uint2 LL128Unit0(uint4 v) { return {v.x, v.y}; }
__device__ __forceinline__ uint2 LL128Unit1(uint4 v) { return {v.z, v.w}; }

// Zeroes the lane's part of a line of its own scratch (epoch.cuh re-zeroing).
__device__ __forceinline__ void ClearLL128Part(char* dst) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(dst), "r"(0u)
               : "memory");
}

// Warp-collective bounded wait: every lane of the warp calls it, with
// `src` its part of its line in this rank's scratch and `active` whether
// its line is awaited (the same for the 8 lanes of a line; inactive lines
// neither load nor wait). Returns the lane's part from the load in which
// every active line of the warp carried the flag word {flag, signature}.
// Bounded by pt->timeout_ns (wait.cuh): the flag lane of a line that is
// still not ready reports `site` (its line and peer) with the flag word it
// last saw, and traps; a flag lane that sees a foreign line (above) reports
// it at once (kErrorForeignSignature) and traps. The check runs only after a
// poll in which some line of the warp was not ready.
__device__ __forceinline__ uint4 WaitLL128Part(const PeerTable* pt, const char* src,
                                               bool active, uint32_t flag, uint32_t signature,
                                               const WaitSite& site) {
  const bool flag_lane = IsLL128FlagLane(threadIdx.x);
  uint4 v = {0u, 0u, 0u, 0u};
  if (active) v = LoadLL128Part(src);
  bool ready = !active || !flag_lane || LL128PartReady(v, flag, signature);
  if (!__any_sync(0xffffffffu, !ready)) return v;
  WaitBound bound;
  while (true) {
    if (active) v = LoadLL128Part(src);
    ready = !active || !flag_lane || LL128PartReady(v, flag, signature);
    if (!__any_sync(0xffffffffu, !ready)) return v;
    if (!ready) {
      if (LL128PartForeign(v, flag)) {
        ReportAndTrap(pt, site, kErrorForeignSignature, LL128ReportFlags(flag, signature, v),
                      bound.Waited());
      }
      bound.Tick(pt, site, LL128ReportFlags(flag, signature, v));
    }
  }
}

// Warp-collective bounded wait for kParts line parts at once: for every n,
// WaitLL128Part's contract with src_of(n), bit n of `active` and site_of(n),
// and v[n] its result. Every poll loads all the parts some line of the warp
// still waits for with back-to-back instructions, so parts that arrive
// together cost one load latency instead of kParts (one WaitLL128Part after
// another issues each load only after the previous wait returned). Which
// parts are still awaited is warp-uniform (a vote per part), so the 8 lanes
// of a line always load it with one instruction. Bounded as WaitLL128Part:
// a flag lane with a part not ready ticks one WaitBound per poll with the
// site of its first such part; a foreign part reports at once. src_of and
// site_of are called with n known at compile time (loops unrolled) and
// site_of only on the way to a report, so neither array is kept in registers.
template <int kParts, typename SrcOf, typename SiteOf>
__device__ __forceinline__ void WaitLL128Parts(const PeerTable* pt, SrcOf src_of, uint32_t active,
                                               uint32_t flag, uint32_t signature, SiteOf site_of,
                                               uint4 (&v)[kParts]) {
  static_assert(kParts >= 1 && kParts <= 32, "one vote bit per part");
  const bool flag_lane = IsLL128FlagLane(threadIdx.x);
  uint32_t awaited = (kParts == 32) ? 0xffffffffu : ((1u << kParts) - 1u);  // warp-uniform
#pragma unroll
  for (int n = 0; n < kParts; ++n) v[n] = uint4{0u, 0u, 0u, 0u};
  WaitBound bound;
  bool first_poll = true;
  while (true) {
#pragma unroll
    for (int n = 0; n < kParts; ++n) {
      if ((awaited >> n) & (active >> n) & 1u) v[n] = LoadLL128Part(src_of(n));
    }
    int late = -1;  // this lane's first part that is not ready
    uint32_t still = 0u;
#pragma unroll
    for (int n = 0; n < kParts; ++n) {
      if ((awaited >> n) & 1u) {
        const bool ready =
            !((active >> n) & 1u) || !flag_lane || LL128PartReady(v[n], flag, signature);
        if (__any_sync(0xffffffffu, !ready)) still |= 1u << n;
        if (!ready) {
          if (!first_poll && LL128PartForeign(v[n], flag)) {
            ReportAndTrap(pt, site_of(n), kErrorForeignSignature,
                          LL128ReportFlags(flag, signature, v[n]), bound.Waited());
          }
          if (late < 0) late = n;
        }
      }
    }
    awaited = still;
    if (awaited == 0u) return;
    if (!first_poll && late >= 0) {
#pragma unroll
      for (int n = 0; n < kParts; ++n) {
        if (n == late) bound.Tick(pt, site_of(n), LL128ReportFlags(flag, signature, v[n]));
      }
    }
    first_poll = false;
  }
}

// The wait of a protocol whose LL128 lines carry no signature (high half of
// the flag word 0): two_shot_ll128_atomic's all-gather. A line with another
// high half is then foreign too.
__device__ __forceinline__ uint4 WaitLL128Part(const PeerTable* pt, const char* src,
                                               bool active, uint32_t flag,
                                               const WaitSite& site) {
  return WaitLL128Part(pt, src, active, flag, 0u, site);
}

}  // namespace llar

#endif  // LLAR_LL128_CUH_
