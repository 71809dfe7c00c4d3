// The production two-shot LL128 atomic all-reduce (two_shot_ll128_atomic.cuh):
// four dtypes x world sizes 2, 4, 8 and any, its launcher and the kAlgorithms
// entry of Algorithm::kTwoShotLL128Atomic. Grid: the two-shot LL128's rule
// (TwoShotLL128GridFor, two_shot_ll128.cu).
#include "kernels/two_shot_ll128_atomic.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Production = TwoShotLL128AtomicKernels<2, 4, 8>;

}  // namespace

cudaError_t LaunchTwoShotLL128Atomic(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return Production::Launch(args, dtype, stream);
}

cudaError_t PreloadTwoShotLL128Atomic() { return Production::Preload(); }

KernelGrid TwoShotLL128AtomicGrid(uint32_t n_bytes, int world) {
  const TwoShotGrid g =
      TwoShotLL128GridFor((n_bytes + kLL128PayloadBytes - 1) / kLL128PayloadBytes, world);
  return {g.blocks, g.lines_per_block, g.threads, g.steps};
}

cudaError_t TwoShotLL128AtomicOccupancy(DType dtype, int world, uint32_t threads,
                                        int* regs_per_thread, int* blocks_per_sm) {
  return KernelOccupancy(&Production::For, dtype, world, threads, regs_per_thread,
                         blocks_per_sm);
}

}  // namespace llar
