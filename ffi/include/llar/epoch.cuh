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
//
// Why no barrier is needed (reuse argument, per warp and its lines)
//   Rank r's warp writes half h of its lines in peer p's scratch at epoch E
//   and next at E + 2. Before r's warp can run epoch E + 2 it finished epoch
//   E + 1, which means it received p's epoch-(E + 1) lines. p sent those from
//   a kernel launched after p's epoch-E kernel completed, and p's reads of
//   half h at epoch E happened inside that earlier kernel. So p has consumed
//   half h before r overwrites it. Kernel completion on p orders p's reads
//   before its later remote stores; r's store is causally after it received
//   them.
//
// Re-zeroing (flag uniqueness over long runs)
//   flag(E) repeats every 2^32 epochs. A slot that was last written long ago
//   (lines used by a large call once, then many small calls) must not look
//   ready to a call 2^32 epochs later. So in the last two epochs of every
//   kRezeroPeriod window each thread clears, after it consumed them, its own
//   line in the half it just used, for every source rank. Peers write that
//   half again only at E + 2, after receiving this rank's epoch-(E + 1)
//   lines, i.e. after this kernel has completed. Stale content is therefore
//   always less than kRezeroPeriod + 2 < 2^32 epochs old.
#ifndef LLAR_EPOCH_CUH_
#define LLAR_EPOCH_CUH_

#include <cstdint>

namespace llar {

inline constexpr uint64_t kRezeroPeriod = uint64_t(1) << 30;

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
