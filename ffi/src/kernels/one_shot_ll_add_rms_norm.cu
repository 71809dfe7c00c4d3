// The production one-shot LL all-reduce + residual add + RMSNorm
// (one_shot_ll_add_rms_norm.cuh): x float32 (weight float32), bfloat16 or
// float16 (weight of x's dtype or float32) x world sizes 2, 4, 8 and any;
// its grid rule and its launcher.
#include "kernels/one_shot_ll_add_rms_norm.cuh"

#include <cuda_runtime.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Production = OneShotLLAddRmsNormKernels<2, 4, 8>;

}  // namespace

bool AddRmsNormGridFor(uint32_t rows, uint32_t d, uint32_t itemsize, AddRmsNormGrid* grid) {
  if (rows == 0 || d == 0 || (itemsize != 2 && itemsize != 4)) return false;
  const uint64_t row_bytes = uint64_t(d) * itemsize;
  if (row_bytes % kPayloadBytesPerLine != 0 || uint64_t(rows) * row_bytes > kOneShotMaxBytes) {
    return false;
  }
  const uint32_t row_lines = static_cast<uint32_t>(row_bytes / kPayloadBytesPerLine);
  const uint32_t wanted = (row_lines + kAddRmsNormBlockLines - 1) / kAddRmsNormBlockLines;
  for (uint32_t cb = kAddRmsNormMaxClusterBlocks; cb >= 1; cb /= 2) {
    if (cb > 1 && (cb > wanted || row_lines % cb != 0)) continue;
    const uint32_t per_block = row_lines / cb;
    if (per_block > kLinesPerBlock || rows * cb > kMaxBlocks) continue;
    grid->blocks = rows * cb;
    grid->cluster_blocks = cb;
    grid->lines_per_block = per_block;
    grid->threads = (per_block + kWarpSize - 1) / kWarpSize * kWarpSize;
    return true;
  }
  return false;
}

cudaError_t LaunchOneShotLLAddRmsNorm(AddRmsNormArgs args, DType dtype, DType weight,
                                      cudaStream_t stream) {
  return Production::Launch(args, dtype, weight, stream);
}

cudaError_t PreloadOneShotLLAddRmsNorm() { return Production::Preload(); }

}  // namespace llar
