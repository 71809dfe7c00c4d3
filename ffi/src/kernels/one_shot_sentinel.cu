// The production one-shot sentinel all-reduce (one_shot_sentinel.cuh): three
// float dtypes x world sizes any, 2, 4 and 8, its grid rule and the host side
// of Algorithm::kOneShotSentinel's row of kAlgorithms (kernel_table.cuh:
// AlgorithmHost).
#include "kernels/one_shot_sentinel.cuh"

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

KernelGrid OneShotSentinelRule::Grid(uint32_t lines, int, uint32_t block_lines) {
  return OneShotGridFor(lines, block_lines);  // the one-shot LL's rule, in 16-byte lines
}

template <>
struct ProductionKernels<Algorithm::kOneShotSentinel>
    : AlgorithmKernels<OneShotSentinelRule, 0, 2, 4, 8> {};
template struct AlgorithmHost<Algorithm::kOneShotSentinel>;

}  // namespace llar
