// Bodies of LLSession (ll_session.cuh, which states the contract).
#ifndef LLAR_IMPL_LL_SESSION__FUNCS_CUH_
#define LLAR_IMPL_LL_SESSION__FUNCS_CUH_

#include <cstddef>
#include <cstdint>

#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll.cuh"
#include "llar/ll_session.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace internal {

// Rank r's scratch address as mapped on this device, through the read-only
// cache (the host writes the table only between launches).
__device__ __forceinline__ char* ScratchOf(const PeerTable* pt, int r) {
  return reinterpret_cast<char*>(
      __ldg(reinterpret_cast<const unsigned long long*>(pt->scratch + r)));
}

// The k-th rank after `rank` (k in [1, world)): ranks spread their first
// stores over different peers.
__device__ __forceinline__ int PeerAt(int rank, int k, int world) {
  const int p = rank + k;
  return p >= world ? p - world : p;
}

// Clears this thread's line in the half the call just consumed, for every
// source rank (epoch.cuh, re-zeroing). Runs twice every kRezeroPeriod calls; out of
// line, so that it stays out of the hot instructions. Internal linkage, as
// when it lived in the kernel's file: each translation unit's device code
// keeps its own copy, under the name that puts it where ptxas placed it
// among the kernel's out-of-line functions.
static __device__ __noinline__ void RezeroLines(char* own, int half, int block,
                                                int world, int t) {
  for (int src = 0; src < world; ++src) {
    ClearLine(own + ScratchOffset(half, block, world, src, t));
  }
}

}  // namespace internal

// The loads are independent and issued back to back: the epoch, then the
// addresses (the PeerTable does not change while a kernel runs, so the
// read-only path is safe); the kernel's payload load follows them. The
// address loads use `a` and a local copy of the rank as the kernel did
// before the session existed, which keeps its generated code unchanged.
template <int kWorld, bool kSigned>
__device__ __forceinline__ LLSession<kWorld, kSigned>::LLSession(const AllReduceArgs& a,
                                                        int block, int thread)
    : world_(kStaticWorld ? kWorld : a.world),
      rank_(a.rank),
      block_(block),
      thread_(thread),
      counter_(a.epochs + (static_cast<unsigned>(block) * kMaxWarps +
                           static_cast<unsigned>(thread) / kWarpSize)) {
  const int rank = a.rank;
  epoch_ = LoadEpoch(counter_);
  signature_ = a.signature;
  peers_ = a.peers;
  own_ = internal::ScratchOf(a.peers, rank);
  if constexpr (kStaticWorld) {
#pragma unroll
    for (int k = 1; k < kWorld; ++k) {
      to_[k - 1] = internal::ScratchOf(a.peers, internal::PeerAt(rank, k, kWorld));
    }
  }
}

template <int kWorld, bool kSigned>
__device__ __forceinline__ std::size_t LLSession<kWorld, kSigned>::SlotOffset() const {
  return ScratchOffset(half_, block_, world(), rank_, thread_);
}

template <int kWorld, bool kSigned>
__device__ __forceinline__ void LLSession<kWorld, kSigned>::StoreToPeers(
    std::size_t offset, uint2 payload) const {
  StoreToPeers(offset, payload, flag_);
}

template <int kWorld, bool kSigned>
__device__ __forceinline__ void LLSession<kWorld, kSigned>::StoreToPeers(
    std::size_t offset, uint2 payload, uint32_t flag) const {
  if constexpr (kStaticWorld) {
#pragma unroll
    for (int k = 0; k < kWorld - 1; ++k) StoreLine(to_[k] + offset, payload, flag);
  } else {
    for (int k = 1; k < world_; ++k) {
      StoreLine(internal::ScratchOf(peers_, internal::PeerAt(rank_, k, world_)) + offset,
                payload, flag);
    }
  }
}

template <int kWorld, bool kSigned>
__device__ __forceinline__ void LLSession<kWorld, kSigned>::StoreLoopback(uint2 payload) const {
  constexpr int kUnroll = kStaticWorld ? kWorld : 1;
  const int world = this->world();
  const int half = half_;
  const uint32_t flag = flag_;
#pragma unroll kUnroll
  for (int k = 1; k < world; ++k) {
    StoreLine(own_ + ScratchOffset(half, block_, world, internal::PeerAt(rank_, k, world),
                                   thread_),
              payload, flag);
  }
}

// Every lane has read E once the warp is past its sends (__syncwarp); lane 0
// then stores E + 1 while the lines are in flight.
template <int kWorld, bool kSigned>
__device__ __forceinline__ void LLSession<kWorld, kSigned>::AdvanceEpoch() const {
  __syncwarp();
  if (thread_ % kWarpSize == 0) *counter_ = epoch_ + 1;
}

template <int kWorld, bool kSigned>
template <typename Store>
__device__ __forceinline__ void LLSession<kWorld, kSigned>::Send(bool active, uint2 payload,
                                                        Store store) {
  flag_ = kSigned ? FlagOf(epoch_, signature_) : UnsignedFlagOf(epoch_);
  half_ = HalfOf(epoch_);
  if (active) store(*this, payload);
  AdvanceEpoch();
}

template <int kWorld, bool kSigned>
__device__ __forceinline__ uint2 LLSession<kWorld, kSigned>::Recv(int src) const {
  return WaitLine<kSigned>(peers_,
                  own_ + ScratchOffset(half_, block_, world(), src, thread_),
                  flag_, WaitSite{rank_, src, block_, thread_, epoch_});
}

// Each thread clears only lines it consumed itself: no barrier needed.
template <int kWorld, bool kSigned>
__device__ __forceinline__ void LLSession<kWorld, kSigned>::End() const {
  if (MustRezero(epoch_)) {
    internal::RezeroLines(own_, half_, block_, world(), thread_);
  }
}

}  // namespace llar

#endif  // LLAR_IMPL_LL_SESSION__FUNCS_CUH_
