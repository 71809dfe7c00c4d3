// The production two-shot LL128 all-reduce (two_shot_ll128.cuh): four dtypes
// x world sizes 2, 4, 8 and any, its grid rule and its launcher, the
// kAlgorithms entry of Algorithm::kTwoShotLL128.
#include "kernels/two_shot_ll128.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Production = TwoShotLL128Kernels<2, 4, 8>;

}  // namespace

TwoShotGrid TwoShotLL128GridFor(uint32_t lines, int world) {
  const uint32_t chunk = world >= 1 ? TwoShotChunkOf(lines, world, 0).lines : lines;
  uint32_t blocks = (chunk + kTwoShotLL128BlockLines - 1) / kTwoShotLL128BlockLines;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (chunk + blocks - 1) / blocks;
  uint32_t warps = (per_block + kLL128LinesPerWarp - 1) / kLL128LinesPerWarp;
  if (warps > kMaxWarps) warps = kMaxWarps;
  if (warps == 0) warps = 1;
  const uint32_t slots = warps * kLL128LinesPerWarp;
  return {blocks, per_block, warps * kWarpSize, (per_block + slots - 1) / slots};
}

cudaError_t LaunchTwoShotLL128(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return Production::Launch(args, dtype, stream);
}

cudaError_t PreloadTwoShotLL128() { return Production::Preload(); }

KernelGrid TwoShotLL128Grid(uint32_t n_bytes, int world) {
  const TwoShotGrid g =
      TwoShotLL128GridFor((n_bytes + kLL128PayloadBytes - 1) / kLL128PayloadBytes, world);
  return {g.blocks, g.lines_per_block, g.threads, g.steps};
}

cudaError_t TwoShotLL128Occupancy(DType dtype, int world, uint32_t threads,
                                  int* regs_per_thread, int* blocks_per_sm) {
  return KernelOccupancy(&Production::For, dtype, world, threads, regs_per_thread,
                         blocks_per_sm);
}

}  // namespace llar
