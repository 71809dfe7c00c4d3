// The production one-shot LL all-reduce (one_shot_ll.cuh): three dtypes x
// world sizes 2, 4, 8 and any, and its launcher, the kAlgorithms entry of
// Algorithm::kOneShotLL.
#include "kernels/one_shot_ll.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Production = OneShotLLKernels<AllReduce, 2, 4, 8>;

}  // namespace

OneShotGrid OneShotGridFor(uint32_t lines, uint32_t block_lines) {
  if (block_lines == 0 || block_lines > kLinesPerBlock) block_lines = kOneShotBlockLines;
  uint32_t blocks = (lines + block_lines - 1) / block_lines;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (lines + blocks - 1) / blocks;
  const uint32_t threads = ((per_block + 31) / 32) * 32;
  return {blocks, per_block, threads == 0 ? 32u : threads};
}

cudaError_t LaunchOneShotLL(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return Production::Launch(args, dtype, stream, OneShotOptions{});
}

cudaError_t LaunchOneShotLLWith(AllReduceArgs args, DType dtype, cudaStream_t stream,
                                const OneShotOptions& options) {
  return Production::Launch(args, dtype, stream, options);
}

cudaError_t PreloadOneShotLL() { return Production::Preload(); }

KernelGrid OneShotLLGrid(uint32_t n_bytes, int world) {
  (void)world;
  const OneShotGrid g =
      OneShotGridFor((n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine);
  return {g.blocks, g.lines_per_block, g.threads, 1};
}

cudaError_t OneShotLLOccupancy(DType dtype, int world, uint32_t threads, int* regs_per_thread,
                               int* blocks_per_sm) {
  return KernelOccupancy(&Production::For, dtype, world, threads, regs_per_thread,
                         blocks_per_sm);
}

}  // namespace llar
