// The one-shot all-reduce on NCCL's LL all-to-all session
// (nccl_lla2a_one_shot.cuh): four dtypes x two-rank and any-rank kernels, its
// grid rule, the host side of Algorithm::kNcclLLA2AOneShot's row of
// kAlgorithms (kernel_table.cuh: AlgorithmHost) and its session's slots
// (lla2a_slots).
#include "kernels/nccl_lla2a_one_shot.cuh"

#include <nccl_device.h>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

KernelGrid NcclLLA2AOneShotRule::Grid(uint32_t lines, int, uint32_t block_lines) {
  KernelGrid g = OneShotGridFor(lines, block_lines);
  g.threads += kWarpSize;  // the watchdog warp
  return g;
}

// The two-rank kernel first: the order nvcc emits them in (kernel_table.cuh).
template <>
struct ProductionKernels<Algorithm::kNcclLLA2AOneShot>
    : AlgorithmKernels<NcclLLA2AOneShotRule, 2, 0> {};
template struct AlgorithmHost<Algorithm::kNcclLLA2AOneShot>;

int NcclLLA2AOneShotSlots(int world) {
  return ncclLLA2ACalcSlots(world * kLinesPerBlock, kPayloadBytesPerLine);
}

}  // namespace llar
