// The production two-shot LL all-reduce (two_shot_ll.cuh): four dtypes x
// world sizes 2, 4, 8 and any, its grid rule and its launcher, the
// kAlgorithms entry of Algorithm::kTwoShotLL.
#include "kernels/two_shot_ll.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Production = TwoShotLLKernels<2, 4, 8>;

}  // namespace

TwoShotGrid TwoShotGridFor(uint32_t lines, int world) {
  const uint32_t chunk = world >= 1 ? TwoShotChunkOf(lines, world, 0).lines : lines;
  uint32_t blocks = (chunk + kTwoShotBlockLines - 1) / kTwoShotBlockLines;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (chunk + blocks - 1) / blocks;
  uint32_t threads = ((per_block + 31) / 32) * 32;
  if (threads > kMaxThreads) threads = kMaxThreads;
  if (threads == 0) threads = 32;
  return {blocks, per_block, threads, (per_block + threads - 1) / threads};
}

cudaError_t LaunchTwoShotLL(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return Production::Launch(args, dtype, stream);
}

cudaError_t PreloadTwoShotLL() { return Production::Preload(); }

KernelGrid TwoShotLLGrid(uint32_t n_bytes, int world) {
  const TwoShotGrid g =
      TwoShotGridFor((n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine, world);
  return {g.blocks, g.lines_per_block, g.threads, g.steps};
}

cudaError_t TwoShotLLOccupancy(DType dtype, int world, uint32_t threads, int* regs_per_thread,
                               int* blocks_per_sm) {
  return KernelOccupancy(&Production::For, dtype, world, threads, regs_per_thread,
                         blocks_per_sm);
}

}  // namespace llar
