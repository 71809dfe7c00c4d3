// Bodies of the sentinel protocol and SentinelSession (sentinel.cuh, which
// states the contract).
#ifndef LLAR_IMPL_SENTINEL__FUNCS_CUH_
#define LLAR_IMPL_SENTINEL__FUNCS_CUH_

#include <cstddef>
#include <cstdint>

#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll_session.cuh"
#include "llar/sentinel.cuh"
#include "llar/wait.cuh"

namespace llar {

template <typename T>
__device__ __forceinline__ ulonglong2 CanonicalLine(ulonglong2 line) {
  constexpr uint64_t kReplacement = kSentinelWord ^ QuietBit<T>::kBit;
  if (line.x == kSentinelWord) line.x = kReplacement;
  if (line.y == kSentinelWord) line.y = kReplacement;
  return line;
}

__device__ __forceinline__ void StoreSentinelLine(char* dst, ulonglong2 line) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(line.x),
               "l"(line.y)
               : "memory");
}

__device__ __forceinline__ ulonglong2 LoadSentinelLine(const char* src) {
  ulonglong2 v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v.x), "=l"(v.y)
               : "l"(src)
               : "memory");
  return v;
}

__device__ __forceinline__ bool SentinelLineReady(ulonglong2 v) {
  return v.x != kSentinelWord && v.y != kSentinelWord;
}

__device__ __forceinline__ void ArmSlot(char* dst) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %1};" ::"l"(dst), "l"(kSentinelWord)
               : "memory");
}

__device__ __forceinline__ uint32_t SentinelFold(uint64_t w) {
  return static_cast<uint32_t>(w) & static_cast<uint32_t>(w >> 32);
}

namespace internal {

// The timeout report of a sentinel wait (wait.cuh's, with the folds of the
// last poll). Never returns: the callers keep nothing live across it.
[[noreturn]] inline __device__ __noinline__ void SentinelTimeout(const PeerTable* pt,
                                                                 WaitSite site, uint64_t w0,
                                                                 uint64_t w1,
                                                                 uint64_t waited_ns) {
  ReportTimeoutAndTrap(pt, site, kSentinelFold, SentinelFold(w0), SentinelFold(w1), waited_ns);
  __builtin_unreachable();
}

}  // namespace internal

__device__ __forceinline__ ulonglong2 WaitSentinelLine(const PeerTable* pt, const char* src,
                                                       const WaitSite& site) {
  ulonglong2 v = LoadSentinelLine(src);
  if (SentinelLineReady(v)) return v;
  // As WaitBound (wait.cuh): the clock every kSpinsPerClockRead polls.
  uint64_t start = 0;
  uint32_t spins = 0;
  while (true) {
    v = LoadSentinelLine(src);
    if (SentinelLineReady(v)) return v;
    if (++spins != kSpinsPerClockRead) continue;
    spins = 0;
    const uint64_t now = GlobalTimerNs();
    if (start == 0) {
      start = now;
    } else if (now - start > pt->timeout_ns) {
      internal::SentinelTimeout(pt, site, v.x, v.y, now - start);
    }
  }
}

// As LLSession's constructor: the epoch load first, then the addresses.
template <int kWorld>
__device__ __forceinline__ SentinelSession<kWorld>::SentinelSession(const AllReduceArgs& a,
                                                                    int block, int thread)
    : world_(kStaticWorld ? kWorld : a.world),
      rank_(a.rank),
      block_(block),
      thread_(thread),
      counter_(a.epochs + (static_cast<unsigned>(block) * kMaxWarps +
                           static_cast<unsigned>(thread) / kWarpSize)) {
  const int rank = a.rank;
  epoch_ = LoadEpoch(counter_);
  peers_ = a.peers;
  own_ = internal::ScratchOf(a.peers, rank);
  if constexpr (kStaticWorld) {
#pragma unroll
    for (int k = 1; k < kWorld; ++k) {
      to_[k - 1] = internal::ScratchOf(a.peers, internal::PeerAt(rank, k, kWorld));
    }
  }
}

template <int kWorld>
__device__ __forceinline__ uint32_t SentinelSession<kWorld>::SlotOffset(int src) const {
  return static_cast<uint32_t>(ScratchOffset(half_, block_, world(), src, thread_));
}

template <int kWorld>
__device__ __forceinline__ void SentinelSession<kWorld>::Send(bool active, ulonglong2 line) {
  half_ = HalfOf(epoch_);
  if (active) {
    const uint32_t offset = SlotOffset(rank_);
    if constexpr (kStaticWorld) {
#pragma unroll
      for (int k = 0; k < kWorld - 1; ++k) StoreSentinelLine(to_[k] + offset, line);
    } else {
      for (int k = 1; k < world_; ++k) {
        StoreSentinelLine(
            internal::ScratchOf(peers_, internal::PeerAt(rank_, k, world_)) + offset, line);
      }
    }
  }
  // Every lane has read E; the counter is read again only by the next kernel.
  __syncwarp();
  if (thread_ % kWarpSize == 0) *counter_ = epoch_ + 1;
}

template <int kWorld>
__device__ __forceinline__ ulonglong2 SentinelSession<kWorld>::Recv(int src) const {
  return WaitSentinelLine(peers_, own_ + SlotOffset(src),
                          WaitSite{rank_, src, block_, thread_, epoch_});
}

template <int kWorld>
__device__ __forceinline__ void SentinelSession<kWorld>::End(bool active) const {
  if (!active) return;
  constexpr int kUnroll = kStaticWorld ? kWorld : 1;
#pragma unroll kUnroll
  for (int k = 1; k < world(); ++k) {
    ArmSlot(own_ + SlotOffset(internal::PeerAt(rank_, k, world())));
  }
}

}  // namespace llar

#endif  // LLAR_IMPL_SENTINEL__FUNCS_CUH_
