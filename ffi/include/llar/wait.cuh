// Bounded waits: every spin in jax_llar ends, either with the awaited value or
// with a report of what it waited for and a failed call.
//
// Contract
//   WaitLine polls one LL line of the caller's own scratch until it carries
//   `flag`. The fast path is a plain poll with no clock reads. After
//   kSpinsPerClockRead polls it reads %globaltimer (nanoseconds) and then
//   rereads it every kSpinsPerClockRead polls; once `timeout_ns` has passed it
//   fills the ErrorRecord (rank, peer, block, line, epoch, flags seen) in
//   host-mapped memory and executes `trap` (no device printf: it would put a
//   stack frame in every kernel; the host reads and prints the record). The trap
//   fails the kernel, so XLA reports an error for the step instead of
//   returning a wrong answer or hanging the GPU. The trap also poisons this
//   device's CUDA context: the process must be restarted, which is the right
//   outcome for a peer that never arrived (rank divergence, a dead process).
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

// One thread claims the record (claim 0 -> 1), writes it, reads it back from
// host memory so the PCIe writes have landed, and publishes (claim -> 2).
// Every other timed-out thread waits for the publication (bounded) before it
// traps: a trap ends the whole grid, and an early one would lose the report.
// Out of line: it never runs on the fast path, and inlined it would put its
// code between the kernel's hot instructions.
inline __device__ __noinline__ void ReportTimeoutAndTrap(const PeerTable* pt,
                                                     WaitSite site,
                                                     uint32_t expected,
                                                     uint32_t seen0, uint32_t seen1,
                                                     uint64_t waited_ns) {
  int32_t* claim = pt->error_claim;
  if (atomicCAS(claim, 0, 1) == 0) {
    volatile ErrorRecord* r = pt->error;
    r->rank = site.rank;
    r->peer = site.peer;
    r->block = site.block;
    r->line = site.line;
    r->flag_expected = expected;
    r->flag_seen = seen0;
    r->flag_seen2 = seen1;
    r->epoch = site.epoch;
    r->waited_ns = waited_ns;
    __threadfence_system();
    r->code = 1;
    __threadfence_system();
    for (int i = 0; i < (1 << 20) && r->code != 1; ++i) {
    }
    atomicExch(claim, 2);
  } else {
    const uint64_t t0 = GlobalTimerNs();
    while (atomicAdd(claim, 0) != 2 && GlobalTimerNs() - t0 < 1000000000ull) {
    }
  }
  __trap();
}

// Bounds a wait: every kSpinsPerClockRead polls it reads the clock, and once
// pt->timeout_ns has passed since the first read it reports and traps.
struct WaitBound {
  uint64_t start = 0;
  uint32_t spins = 0;
  __device__ __forceinline__ void Tick(const PeerTable* pt, const WaitSite& site,
                                       uint32_t flag, uint4 seen) {
    if (++spins != kSpinsPerClockRead) return;
    spins = 0;
    const uint64_t now = GlobalTimerNs();
    if (start == 0) {
      start = now;
    } else if (now - start > pt->timeout_ns) {
      ReportTimeoutAndTrap(pt, site, flag, seen.y, seen.w, now - start);
    }
  }
};

// Polls the LL line at `src` (own scratch) until it carries `flag`; returns
// its payload. Bounded by pt->timeout_ns, which is read only once the wait
// has lasted kSpinsPerClockRead polls (off the fast path).
__device__ __forceinline__ uint2 WaitLine(const PeerTable* pt,
                                          const char* src, uint32_t flag,
                                          const WaitSite& site) {
  uint4 v = LoadLine(src);
  if (LineReady(v, flag)) return LinePayload(v);
  WaitBound bound;
  while (true) {
    v = LoadLine(src);
    if (LineReady(v, flag)) return LinePayload(v);
    bound.Tick(pt, site, flag, v);
  }
}

}  // namespace llar

#endif  // LLAR_WAIT_CUH_
