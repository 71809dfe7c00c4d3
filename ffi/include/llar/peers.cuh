// The peers' scratch addresses, for kernels that send without an LLSession
// (the LL128 kernels).
//
// Contract
//   PeerScratch<kWorld>(pt, rank, world)(k) is the base of the k-th rank
//   after `rank` (k in [1, world), internal::PeerAt), as mapped on this
//   device: ranks spread their first stores over different peers. For a
//   number of ranks known at compile time (kWorld 2, 4, 8) the addresses are
//   loaded once, with the kernel's first loads; for kWorld = 0 each use
//   looks the address up in the PeerTable (through the read-only cache: the
//   host never writes the table while a kernel runs, args.h).
#ifndef LLAR_PEERS_CUH_
#define LLAR_PEERS_CUH_

#include "llar/args.h"
#include "llar/ll_session.cuh"

namespace llar {

template <int kWorld>
struct PeerScratch {
  char* to[kWorld - 1];
  __device__ __forceinline__ PeerScratch(const PeerTable* pt, int rank, int) {
#pragma unroll
    for (int k = 1; k < kWorld; ++k) {
      to[k - 1] = internal::ScratchOf(pt, internal::PeerAt(rank, k, kWorld));
    }
  }
  __device__ __forceinline__ char* operator()(int k) const { return to[k - 1]; }
};

template <>
struct PeerScratch<0> {
  const PeerTable* pt;
  int rank, world;
  __device__ __forceinline__ PeerScratch(const PeerTable* p, int r, int w)
      : pt(p), rank(r), world(w) {}
  __device__ __forceinline__ char* operator()(int k) const {
    return internal::ScratchOf(pt, internal::PeerAt(rank, k, world));
  }
};

}  // namespace llar

#endif  // LLAR_PEERS_CUH_
