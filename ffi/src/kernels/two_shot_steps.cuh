// What a two-shot kernel's thread knows of the call's geometry: the
// two-shot LL's (two_shot_ll.cuh) and the two LL128 two-shots'
// (two_shot_ll128.cuh, two_shot_ll128_atomic.cuh).
//
// Contract: constructed once, at the kernel's start, by every thread of the
// grid, after it read its epoch (epoch.cuh). The payload of `lines` lines
// (of `payload_bytes` each: 8 for LL, 120 for LL128) is cut into `world`
// chunks (args.h: TwoShotChunkOf); a block handles chunk indices first ..
// first + per_block - 1 (AllReduceArgs::lines_per_block, the grid rule's),
// `slots` of them per step (the block's threads for LL, its line slots for
// LL128), in `steps` steps; `half` is the epoch's half of the region and
// `mine` this rank's chunk. It reads only the arguments and stores nothing;
// its members are scalars, so that the construction inlines into the
// kernel's registers.
#ifndef LLAR_KERNELS_TWO_SHOT_STEPS_CUH_
#define LLAR_KERNELS_TWO_SHOT_STEPS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "llar/args.h"
#include "llar/epoch.cuh"

namespace llar {

struct TwoShotSteps {
  uint32_t lines;      // payload lines of the call
  uint32_t per_block;  // chunk indices of a block
  uint32_t slots;      // chunk indices per step
  uint32_t first;      // the block's first chunk index
  int steps;           // ceil(per_block / slots)
  int half;            // HalfOf(epoch)
  TwoShotChunk mine;   // this rank's chunk

  __device__ __forceinline__ TwoShotSteps(const AllReduceArgs& a, uint32_t payload_bytes,
                                          uint32_t slots_per_step, int block, int world,
                                          int rank, uint64_t epoch)
      : lines((a.n_bytes + payload_bytes - 1) / payload_bytes),
        per_block(a.lines_per_block),
        slots(slots_per_step),
        first(static_cast<uint32_t>(block) * per_block),
        steps(static_cast<int>((per_block + slots - 1) / slots)),
        half(HalfOf(epoch)),
        mine(TwoShotChunkOf(lines, world, rank)) {}
};

}  // namespace llar

#endif  // LLAR_KERNELS_TWO_SHOT_STEPS_CUH_
