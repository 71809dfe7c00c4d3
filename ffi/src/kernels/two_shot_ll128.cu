// The production two-shot LL128 all-reduce (two_shot_ll128.cuh): four dtypes
// x world sizes any, 2, 4 and 8, its grid rule and the host side of
// Algorithm::kTwoShotLL128's row of kAlgorithms (kernel_table.cuh:
// AlgorithmHost).
#include "kernels/two_shot_ll128.cuh"

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

KernelGrid TwoShotLL128Rule::Grid(uint32_t lines, int world, uint32_t) {
  return LineGrid(TwoShotLargestChunk(lines, world), kBlockLines,
                  kLL128LinesPerWarp, kMaxWarps);
}

template <>
struct ProductionKernels<Algorithm::kTwoShotLL128>
    : AlgorithmKernels<TwoShotLL128Rule, 0, 2, 4, 8> {};
template struct AlgorithmHost<Algorithm::kTwoShotLL128>;

}  // namespace llar
