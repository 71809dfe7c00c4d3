// The production one-shot LL128 all-reduce (one_shot_ll128.cuh): four dtypes
// x world sizes any, 2, 4 and 8, its grid rule and the host side of
// Algorithm::kOneShotLL128's row of kAlgorithms (kernel_table.cuh:
// AlgorithmHost).
#include "kernels/one_shot_ll128.cuh"

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

KernelGrid OneShotLL128Rule::Grid(uint32_t lines, int, uint32_t) {
  return OneStep(LineGrid(lines, kBlockLines, kLL128LinesPerWarp, kNoWarpBound));
}

template <>
struct ProductionKernels<Algorithm::kOneShotLL128>
    : AlgorithmKernels<OneShotLL128Rule, 0, 2, 4, 8> {};
template struct AlgorithmHost<Algorithm::kOneShotLL128>;

}  // namespace llar
