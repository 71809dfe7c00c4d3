// Bounded waits: every spin in jax_llar ends, either with the awaited value or
// with a report of what it waited for and a failed call.
//
// Contract
//   WaitLine polls one LL line of the caller's own scratch until it carries
//   `flag`. The fast path is a plain poll with no clock reads. After
//   kSpinsPerClockRead polls it reads %globaltimer (nanoseconds) and then
//   rereads it every kSpinsPerClockRead polls; once `timeout_ns` has passed it
//   fills the ErrorRecord (rank, peer, block, line, epoch, flags seen) in
//   host-mapped memory with code kErrorTimeout and executes `trap` (no device
//   printf: it would put a stack frame in every kernel; the host reads and
//   prints the record). The trap fails the kernel, so XLA reports an error
//   for the step instead of returning a wrong answer or hanging the GPU. The
//   trap also poisons this device's CUDA context: the process must be
//   restarted, which is the right outcome for a peer that never arrived (rank
//   divergence, a dead process).
//   A poll that failed also checks whether the line is foreign (ll.cuh: this
//   epoch's line of another call's signature, a mispaired call). Then it
//   reports at once, without waiting for the timeout, with code
//   kErrorForeignSignature and both signatures, and traps the same way. The
//   check runs only after a failed poll, so a line that is ready at the first
//   poll costs no instruction more than before signatures.
//
// Memory ordering of the report
//   One thread claims the record with an atomic on a device word (atomics on
//   host memory over PCIe are not guaranteed), writes the fields with volatile
//   stores, publishes them with __threadfence_system(), reads them back from
//   host memory (so the writes have landed) and marks the claim word
//   published. Other threads that time out wait for that mark (at most 1 s)
//   before trapping, because a trap ends the whole grid at once.
#ifndef LLAR_WAIT_CUH_
#define LLAR_WAIT_CUH_

#include <cstdint>

#include "llar/args.h"
#include "llar/ll.cuh"

namespace llar {

inline constexpr uint32_t kSpinsPerClockRead = 256;

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Identifies what a wait is for, to report it.
struct WaitSite {
  int32_t rank, peer, block, line;
  uint64_t epoch;
};

// ErrorRecord::code values.
inline constexpr int32_t kErrorTimeout = 1;
inline constexpr int32_t kErrorForeignSignature = 2;

// What a report says about the flags (ErrorRecord's fields of the same
// names): the flag word expected, the two last read, both signatures and how
// many low bits of the flags are the epoch's (0: a protocol without
// signatures).
struct ReportFlags {
  uint32_t expected, seen, seen2;
  uint32_t signature_expected, signature_seen;
  uint32_t epoch_bits;
};

// One thread claims the record (claim 0 -> 1), writes it, reads it back from
// host memory so the PCIe writes have landed, and publishes (claim -> 2).
// Every other failing thread waits for the publication (bounded) before it
// traps: a trap ends the whole grid, and an early one would lose the report.
// Out of line and never returning: it never runs on the fast path, inlined
// it would put its code between the kernel's hot instructions, and a call
// that does not return keeps nothing live across it.
[[noreturn]] inline __device__ __noinline__ void ReportAndTrap(const PeerTable* pt,
                                                               WaitSite site, int32_t code,
                                                               ReportFlags flags,
                                                               uint64_t waited_ns) {
  int32_t* claim = pt->error_claim;
  if (atomicCAS(claim, 0, 1) == 0) {
    volatile ErrorRecord* r = pt->error;
    r->rank = site.rank;
    r->peer = site.peer;
    r->block = site.block;
    r->line = site.line;
    r->flag_expected = flags.expected;
    r->flag_seen = flags.seen;
    r->flag_seen2 = flags.seen2;
    r->epoch = site.epoch;
    r->waited_ns = waited_ns;
    r->signature_expected = flags.signature_expected;
    r->signature_seen = flags.signature_seen;
    r->flag_epoch_bits = flags.epoch_bits;
    __threadfence_system();
    r->code = code;
    __threadfence_system();
    for (int i = 0; i < (1 << 20) && r->code != code; ++i) {
    }
    atomicExch(claim, 2);
  } else {
    const uint64_t t0 = GlobalTimerNs();
    while (atomicAdd(claim, 0) != 2 && GlobalTimerNs() - t0 < 1000000000ull) {
    }
  }
  __trap();
  __builtin_unreachable();
}

// The timeout report of a protocol whose flags carry no signature (the
// sentinel, the LLA2A watchdog): `expected` and the words seen as the
// protocol defines them.
[[noreturn]] __device__ __forceinline__ void ReportTimeoutAndTrap(const PeerTable* pt,
                                                                  WaitSite site,
                                                                  uint32_t expected,
                                                                  uint32_t seen0, uint32_t seen1,
                                                                  uint64_t waited_ns) {
  ReportAndTrap(pt, site, kErrorTimeout, ReportFlags{expected, seen0, seen1, 0u, 0u, 0u},
                waited_ns);
}

// Bounds a wait: every kSpinsPerClockRead polls it reads the clock, and once
// pt->timeout_ns has passed since the first read it reports and traps.
struct WaitBound {
  uint64_t start = 0;
  uint32_t spins = 0;
  __device__ __forceinline__ void Tick(const PeerTable* pt, const WaitSite& site,
                                       const ReportFlags& flags) {
    if (++spins != kSpinsPerClockRead) return;
    spins = 0;
    const uint64_t now = GlobalTimerNs();
    if (start == 0) {
      start = now;
    } else if (now - start > pt->timeout_ns) {
      ReportAndTrap(pt, site, kErrorTimeout, flags, now - start);
    }
  }
  // A wait on flags without a signature: `flag` expected, seen.y and seen.w
  // the words last read.
  __device__ __forceinline__ void Tick(const PeerTable* pt, const WaitSite& site,
                                       uint32_t flag, uint4 seen) {
    Tick(pt, site, ReportFlags{flag, seen.y, seen.w, 0u, 0u, 0u});
  }
  // Nanoseconds waited so far (0 before the first clock read). Reads the
  // clock: call it on the way to a report only.
  __device__ __forceinline__ uint64_t Waited() const {
    return start == 0 ? 0 : GlobalTimerNs() - start;
  }
};

// The report of an LL line wait (ll.cuh): `flag` expected, `v` last read.
__device__ __forceinline__ ReportFlags LineReportFlags(uint32_t flag, uint4 v) {
  return {flag, v.y, v.w, FlagSignature(flag), FlagSignature(v.y), kFlagEpochBits};
}

// Polls the LL line at `src` (own scratch) until it carries `flag`; returns
// its payload. Bounded by pt->timeout_ns, which is read only once the wait
// has lasted kSpinsPerClockRead polls (off the fast path). A foreign line
// (ll.cuh) ends the wait at once with the kErrorForeignSignature report.
// kCheckSignature false: the wait before signatures (no foreign check, the
// flag's high half taken as part of the epoch's), for the kernel bench's
// unsigned variant only.
template <bool kCheckSignature = true>
__device__ __forceinline__ uint2 WaitLine(const PeerTable* pt,
                                          const char* src, uint32_t flag,
                                          const WaitSite& site) {
  uint4 v = LoadLine(src);
  if (LineReady(v, flag)) return LinePayload(v);
  WaitBound bound;
  while (true) {
    v = LoadLine(src);
    if (LineReady(v, flag)) return LinePayload(v);
    if constexpr (kCheckSignature) {
      if (LineForeign(v, flag)) {
        ReportAndTrap(pt, site, kErrorForeignSignature, LineReportFlags(flag, v),
                      bound.Waited());
      }
      bound.Tick(pt, site, LineReportFlags(flag, v));
    } else {
      bound.Tick(pt, site, flag, v);
    }
  }
}

// WaitLine for kParts lines at once: for every n whose bit of `active` is
// set, WaitLine's contract with src_of(n) and site_of(n), and p[n] its
// payload (p[n] is {0, 0} for the others). Every poll loads all the lines
// still awaited with back-to-back instructions, so lines that arrive
// together cost one load latency instead of kParts. Bounded as WaitLine: one
// WaitBound ticked per poll with the site of the first line still awaited; a
// foreign line reports at once. src_of and site_of are called with n known
// at compile time (loops unrolled) and site_of only on the way to a report.
template <int kParts, typename SrcOf, typename SiteOf>
__device__ __forceinline__ void WaitLines(const PeerTable* pt, SrcOf src_of, uint32_t active,
                                          uint32_t flag, SiteOf site_of, uint2 (&p)[kParts]) {
  static_assert(kParts >= 1 && kParts <= 32, "one bit per line");
  uint32_t awaited = active;
#pragma unroll
  for (int n = 0; n < kParts; ++n) p[n] = uint2{0u, 0u};
  WaitBound bound;
  bool first_poll = true;
  while (true) {
    uint4 v[kParts];
#pragma unroll
    for (int n = 0; n < kParts; ++n) {
      if ((awaited >> n) & 1u) v[n] = LoadLine(src_of(n));
    }
    int late = -1;
#pragma unroll
    for (int n = 0; n < kParts; ++n) {
      if ((awaited >> n) & 1u) {
        if (LineReady(v[n], flag)) {
          p[n] = LinePayload(v[n]);
          awaited &= ~(1u << n);
        } else {
          if (!first_poll && LineForeign(v[n], flag)) {
            ReportAndTrap(pt, site_of(n), kErrorForeignSignature, LineReportFlags(flag, v[n]),
                          bound.Waited());
          }
          if (late < 0) late = n;
        }
      }
    }
    if (awaited == 0u) return;
    if (!first_poll) {
#pragma unroll
      for (int n = 0; n < kParts; ++n) {
        if (n == late) bound.Tick(pt, site_of(n), LineReportFlags(flag, v[n]));
      }
    }
    first_poll = false;
  }
}

}  // namespace llar

#endif  // LLAR_WAIT_CUH_
