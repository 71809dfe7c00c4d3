// The production one-shot sentinel all-reduce (one_shot_sentinel.cuh): three
// float dtypes x world sizes 2, 4, 8 and any; its launcher, grid and
// occupancy query, the kAlgorithms entry of Algorithm::kOneShotSentinel.
#include "kernels/one_shot_sentinel.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"
#include "llar/sentinel.cuh"

namespace llar {
namespace {

using Production = OneShotSentinelKernels<2, 4, 8>;

}  // namespace

cudaError_t LaunchOneShotSentinel(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return Production::Launch(args, dtype, stream, OneShotOptions{});
}

cudaError_t LaunchOneShotSentinelWith(AllReduceArgs args, DType dtype, cudaStream_t stream,
                                      const OneShotOptions& options) {
  return Production::Launch(args, dtype, stream, options);
}

cudaError_t PreloadOneShotSentinel() { return Production::Preload(); }

KernelGrid OneShotSentinelGrid(uint32_t n_bytes, int world) {
  (void)world;
  const OneShotGrid g = OneShotGridFor((n_bytes + kSentinelLineBytes - 1) / kSentinelLineBytes);
  return {g.blocks, g.lines_per_block, g.threads, 1};
}

cudaError_t OneShotSentinelOccupancy(DType dtype, int world, uint32_t threads,
                                     int* regs_per_thread, int* blocks_per_sm) {
  return KernelOccupancy(&Production::For, dtype, world, threads, regs_per_thread,
                         blocks_per_sm);
}

}  // namespace llar
