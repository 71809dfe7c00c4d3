// The production one-shot LL all-reduce (one_shot_ll.cuh): four dtypes x
// world sizes any, 2, 4 and 8, its grid rule (kernels.h: OneShotGridFor) and
// the host side of Algorithm::kOneShotLL's row of kAlgorithms
// (kernel_table.cuh: AlgorithmHost).
#include "kernels/one_shot_ll.cuh"

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

OneShotGrid OneShotGridFor(uint32_t lines, uint32_t block_lines) {
  if (block_lines == 0 || block_lines > kLinesPerBlock) block_lines = kOneShotBlockLines;
  return OneStep(LineGrid(lines, block_lines, kWarpSize, kNoWarpBound));
}

template <>
struct ProductionKernels<Algorithm::kOneShotLL> : OneShotLLKernels<AllReduce, 2, 4, 8> {};
template struct AlgorithmHost<Algorithm::kOneShotLL>;

}  // namespace llar
