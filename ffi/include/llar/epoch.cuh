// Epochs and scratch parity: how one-shot calls reuse scratch without a barrier.
//
// Source: arXiv 2607.16100, section 4 (bidirectional double buffering in place
// of entry and exit barriers).
//
// Contract
//   Warp w of block b of every call owns counter epochs[b * kMaxWarps + w]
//   (device memory, per device and communicator) and lines [32w, 32w + 32) of
//   region b of every rank's scratch. A call's warp reads E from its counter,
//   sends and receives in half (E & 1) of its lines with flag(E) (ll.cuh),
//   and stores E + 1 once every lane has read E (after a __syncwarp, right
//   after its sends: the counter is read again only by the next kernel on the
//   stream). Every rank runs the same sequence of calls with the same grid
//   (same program, same shapes), so each counter advances in lockstep on all
//   ranks without any communication; calls with fewer warps per block leave
//   the other warps' counters and lines alone. The kernel itself advances the
//   counters, so a call replayed from a CUDA graph (where no host code runs)
//   is correct. A counter per warp rather than per block means the block
//   needs no barrier at all: each warp only waits for its own lanes.
//   LLSession (ll_session.cuh) is the one place that reads, advances and
//   re-zeroes.
//
// Why no barrier is needed (reuse argument)
//   Fix warp w. Its epoch E stands for the same call on every rank (the E-th
//   call whose grid launched warp w). Rank r's warp w writes half h of its
//   lines in peer p's scratch in call c0 (epoch E) and next in call c2
//   (epoch E + 2), after r completed call c1 (epoch E + 1). Warp w itself may
//   have had no active lane in c1, but c1 moved at least one byte, so some
//   thread of r's c1 waited for a line that p stored in its own c1 kernel. p
//   launched that kernel after its c0 kernel completed, and p's reads of half h
//   of warp w's lines happened inside c0. So p consumed them before r's c2
//   overwrites them: kernel completion on p orders p's reads before its later
//   remote stores, and r's c2 store is causally after r received them.
//   Assumption, stated: the chain runs through relaxed volatile accesses on
//   both GPUs, and rests on a kernel's completion acting as a system-scope
//   fence for the kernel's memory operations (CUDA's stream semantics: a
//   kernel's writes are visible to later work once it completes). Every
//   algorithm's reuse argument (two-shot, LL128, the sentinel's re-arm)
//   relies on the same step.
//
// Re-zeroing (flag uniqueness over long runs)
//   A flag holds only the low bits of the epoch: 16 in an LL line (the other
//   16 carry the call's signature, ll.cuh), 32 in the LL128 flag word's low
//   half (ll128.cuh). So flag(E) of one signature repeats every 2^16 epochs
//   (LL). A slot that was last written long ago (lines used by a large call
//   once, then many small calls) must neither look ready to a call 2^16
//   epochs later nor, with another signature, look foreign to it (ll.cuh:
//   a foreign line is the proof of a mispaired call, so stale content must
//   never produce one). So in the last two epochs of every kRezeroPeriod
//   window each thread clears, after it consumed them, its own lines in the
//   half it just used, for every source rank (the two-shots: every slot of
//   the thread in that half, used by this call or not). Peers write that
//   half again only at E + 2, after receiving this rank's epoch-(E + 1)
//   lines, i.e. after this kernel has completed. Every launched warp runs
//   every epoch of its counter, and one epoch of each parity in each window
//   re-zeroes, so content in a half is cleared at most kRezeroPeriod epochs
//   after it was written: stale content is always less than kRezeroPeriod +
//   2 epochs old, and kRezeroPeriod + 2 < 2^16 (static_assert below). Its
//   epoch bits therefore differ from those of every epoch that reads the
//   slot, for the LL's 16 bits and a fortiori for LL128's 32. The cost: twice
//   every kRezeroPeriod calls of a warp, each thread clears its lines (out of
//   line, off the fast path).
#ifndef LLAR_EPOCH_CUH_
#define LLAR_EPOCH_CUH_

#include <cstdint>

namespace llar {

inline constexpr uint64_t kRezeroPeriod = uint64_t(1) << 14;
// The fewest epoch bits a flag carries (ll.cuh: an LL line's 16).
inline constexpr int kMinFlagEpochBits = 16;
static_assert(kRezeroPeriod + 2 < (uint64_t(1) << kMinFlagEpochBits),
              "stale content must be younger than the flags' epoch period");

// Reads the warp's epoch from L2 (ld.global.cg): the value the previous
// kernel on this stream stored, never a stale L1 line.
__device__ __forceinline__ uint64_t LoadEpoch(const uint64_t* counter) {
  return __ldcg(counter);
}

__device__ __forceinline__ int HalfOf(uint64_t epoch) {
  return static_cast<int>(epoch & 1);
}

// True for the last two epochs of every kRezeroPeriod window (one per half).
__device__ __forceinline__ bool MustRezero(uint64_t epoch) {
  return (epoch % kRezeroPeriod) >= kRezeroPeriod - 2;
}

}  // namespace llar

#endif  // LLAR_EPOCH_CUH_
