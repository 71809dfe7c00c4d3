// The production two-shot LL128 atomic all-reduce (two_shot_ll128_atomic.cuh):
// four dtypes x world sizes any, 2, 4 and 8, its grid rule and the host side
// of Algorithm::kTwoShotLL128Atomic's row of kAlgorithms (kernel_table.cuh:
// AlgorithmHost). NOT deterministic for the float dtypes (atomic additions in
// arrival order; the header states the rule it keeps); never in a tuning
// table.
#include "kernels/two_shot_ll128_atomic.cuh"

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"

namespace llar {

KernelGrid TwoShotLL128AtomicRule::Grid(uint32_t lines, int world, uint32_t block_lines) {
  return TwoShotLL128Rule::Grid(lines, world, block_lines);  // the two-shot LL128's
}

template <>
struct ProductionKernels<Algorithm::kTwoShotLL128Atomic>
    : AlgorithmKernels<TwoShotLL128AtomicRule, 0, 2, 4, 8> {};
template struct AlgorithmHost<Algorithm::kTwoShotLL128Atomic>;

}  // namespace llar
