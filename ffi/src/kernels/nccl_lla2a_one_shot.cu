// The one-shot all-reduce on NCCL's LL all-to-all session
// (nccl_lla2a_one_shot.cuh): four dtypes x two-rank and any-rank kernels,
// and its launcher, the kAlgorithms entry of Algorithm::kNcclLLA2AOneShot.
#include "kernels/nccl_lla2a_one_shot.cuh"

#include <cuda_runtime.h>
#include <nccl_device.h>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

cudaError_t LaunchNcclLLA2AOneShot(AllReduceArgs a, DType dtype, cudaStream_t stream) {
  if (a.n_bytes == 0) return cudaSuccess;
  if (a.n_bytes > kNcclLLA2AOneShotMaxBytes || a.world < 2 || a.world > kMaxRanks ||
      a.rank >= a.world || a.peers == nullptr) {
    return cudaErrorInvalidValue;
  }
  const uint32_t lines = (a.n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine;
  a.vector_lines = VectorLines(a.n_bytes, {a.in, a.out});
  const OneShotGrid g = OneShotGridFor(lines);
  a.lines_per_block = static_cast<uint16_t>(g.lines_per_block);
  const NcclLLA2AOneShotKernels::Kernel fn = NcclLLA2AOneShotKernels::For(dtype, a.world);
  if (fn == nullptr) return cudaErrorInvalidValue;
  fn<<<g.blocks, g.threads + kWarpSize, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t PreloadNcclLLA2AOneShot() { return PreloadKernels<2>(&NcclLLA2AOneShotKernels::For); }

KernelGrid NcclLLA2AOneShotGrid(uint32_t n_bytes, int world) {
  (void)world;
  const OneShotGrid g =
      OneShotGridFor((n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine);
  return {g.blocks, g.lines_per_block, g.threads + kWarpSize, 1};
}

cudaError_t NcclLLA2AOneShotOccupancy(DType dtype, int world, uint32_t threads,
                                      int* regs_per_thread, int* blocks_per_sm) {
  return KernelOccupancy(&NcclLLA2AOneShotKernels::For, dtype, world, threads,
                         regs_per_thread, blocks_per_sm);
}

int NcclLLA2AOneShotSlots(int world) {
  return ncclLLA2ACalcSlots(world * kLinesPerBlock, kPayloadBytesPerLine);
}

}  // namespace llar
