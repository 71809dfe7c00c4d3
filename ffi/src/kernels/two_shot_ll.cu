// The production two-shot LL all-reduce (two_shot_ll.cuh): four dtypes x
// world sizes any, 2, 4 and 8, its grid rule (kernels.h: TwoShotGridFor) and
// the host side of Algorithm::kTwoShotLL's row of kAlgorithms
// (kernel_table.cuh: AlgorithmHost).
#include "kernels/two_shot_ll.cuh"

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

KernelGrid TwoShotGridFor(uint32_t lines, int world) {
  return LineGrid(TwoShotLargestChunk(lines, world), kTwoShotBlockLines, kWarpSize, kMaxWarps);
}

template <>
struct ProductionKernels<Algorithm::kTwoShotLL> : AlgorithmKernels<TwoShotLLRule, 0, 2, 4, 8> {};
template struct AlgorithmHost<Algorithm::kTwoShotLL>;

}  // namespace llar
