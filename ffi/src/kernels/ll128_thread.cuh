// What an LL128 kernel's thread starts from: the one-shot LL128's
// (one_shot_ll128.cuh), the two-shot LL128's (two_shot_ll128.cuh) and its
// atomic variant's (two_shot_ll128_atomic.cuh), whose step geometry is
// two_shot_steps.cuh's.
//
// Contract: constructed once, first thing in the kernel, by every thread of
// the grid. It reads the warp's epoch counter (epoch.cuh: every lane reads
// E; the kernel stores E + 1 once every lane of the warp has read it, and
// only the next kernel reads the counter again) and the peer table
// (peers.cuh), and places the thread's lane in its LL128 line (ll128.cuh:
// kLL128LanesPerLine lanes a line, the last one the flag lane). It stores
// nothing. Its members are scalars only (the peers' addresses stay a
// PeerScratch of the kernel's own), so that the construction inlines into
// the kernel's registers.
#ifndef LLAR_KERNELS_LL128_THREAD_CUH_
#define LLAR_KERNELS_LL128_THREAD_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "llar/args.h"
#include "llar/epoch.cuh"
#include "llar/ll128.cuh"
#include "llar/peers.cuh"

namespace llar {

template <int kWorld>
struct LL128Thread {
  int world;  // ranks: kWorld, or the call's (kWorld 0)
  int rank;
  int block;
  int t;  // the thread in its block
  uint64_t* counter;  // the warp's epoch counter
  uint64_t epoch;     // E, this call's epoch
  const PeerTable* pt;
  char* own;  // this rank's scratch
  int slot;  // the line slot of the block the lane works on
  int part;  // the lane's part of its line
  bool flag_lane;

  __device__ __forceinline__ explicit LL128Thread(const AllReduceArgs& a)
      : world(kWorld > 0 ? kWorld : a.world),
        rank(a.rank),
        block(blockIdx.x),
        t(threadIdx.x),
        counter(a.epochs + (static_cast<unsigned>(block) * kMaxWarps +
                            static_cast<unsigned>(t) / kWarpSize)),
        epoch(LoadEpoch(counter)),
        pt(a.peers),
        own(internal::ScratchOf(pt, rank)),
        slot(t / kLL128LanesPerLine),
        part(LL128LaneInLine(t)),
        flag_lane(IsLL128FlagLane(t)) {}
};

}  // namespace llar

#endif  // LLAR_KERNELS_LL128_THREAD_CUH_
