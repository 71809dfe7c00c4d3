// The production one-shot and two-shot LL kernels (src/kernels/one_shot_ll.cu,
// two_shot_ll.cu) compiled a
// second time, from the same template with the same options, only so that
// the loopback harness (loopback.h) can ask CUDA how many of their blocks one
// multiprocessor holds. Never launched: the harness launches the production
// launcher.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/one_shot_ll.cuh"
#include "kernels/two_shot_ll.cuh"
#include "llar/args.h"
#include "loopback.h"

namespace llar {
namespace {

// The production instantiation: one_shot_ll.cu's `Production`.
using ProductionCopy = OneShotLLKernels<AllReduce, 2, 4, 8>;
// two_shot_ll.cu's `Production`.
using TwoShotCopy = TwoShotLLKernels<2, 4, 8>;

cudaError_t Occupancy(const void* kernel, uint32_t threads, int* regs_per_thread,
                      int* blocks_per_sm) {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) return e;
  *regs_per_thread = attr.numRegs;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel,
                                                       static_cast<int>(threads), 0);
}

}  // namespace

cudaError_t OneShotLLOccupancy(DType dtype, int world, bool generic, uint32_t threads,
                               int* regs_per_thread, int* blocks_per_sm) {
  const ProductionCopy::Kernel kernel = ProductionCopy::For(dtype, generic ? 0 : world);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel));
  if (e != cudaSuccess) return e;
  *regs_per_thread = attr.numRegs;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks_per_sm, reinterpret_cast<const void*>(kernel), static_cast<int>(threads), 0);
}

cudaError_t TwoShotLLOccupancy(DType dtype, int world, uint32_t threads,
                               int* regs_per_thread, int* blocks_per_sm) {
  const TwoShotCopy::Kernel kernel = TwoShotCopy::For(dtype, world);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  return Occupancy(reinterpret_cast<const void*>(kernel), threads, regs_per_thread,
                   blocks_per_sm);
}

}  // namespace llar
