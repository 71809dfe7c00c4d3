// The production one-shot LL128 all-reduce (one_shot_ll128.cuh): four dtypes
// x world sizes 2, 4, 8 and any, its grid rule and its launcher, the
// kAlgorithms entry of Algorithm::kOneShotLL128.
#include "kernels/one_shot_ll128.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Production = OneShotLL128Kernels<2, 4, 8>;

}  // namespace

OneShotGrid OneShotLL128GridFor(uint32_t lines) {
  uint32_t blocks = (lines + kOneShotLL128BlockLines - 1) / kOneShotLL128BlockLines;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (lines + blocks - 1) / blocks;
  const uint32_t warps = (per_block + kLL128LinesPerWarp - 1) / kLL128LinesPerWarp;
  return {blocks, per_block, warps == 0 ? 32u : warps * 32u};
}

cudaError_t LaunchOneShotLL128(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return Production::Launch(args, dtype, stream);
}

cudaError_t PreloadOneShotLL128() { return Production::Preload(); }

KernelGrid OneShotLL128Grid(uint32_t n_bytes, int world) {
  (void)world;
  const OneShotGrid g =
      OneShotLL128GridFor((n_bytes + kLL128PayloadBytes - 1) / kLL128PayloadBytes);
  return {g.blocks, g.lines_per_block, g.threads, 1};
}

cudaError_t OneShotLL128Occupancy(DType dtype, int world, uint32_t threads,
                                  int* regs_per_thread, int* blocks_per_sm) {
  return KernelOccupancy(&Production::For, dtype, world, threads, regs_per_thread,
                         blocks_per_sm);
}

}  // namespace llar
