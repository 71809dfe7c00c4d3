#include "preload.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "copy.h"
#include "errors.h"
#include "one_shot_ll_diag.h"
#include "registry.h"

namespace llar {
namespace {

cudaError_t PreloadToolKernels() {
  cudaError_t e = PreloadCopy();
  if (e == cudaSuccess) e = PreloadOneShotLLDiag();
  // A failed load must not surface later in a launcher's cudaGetLastError.
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

}  // namespace

void EnsureToolKernelsPreloaded() {
  static std::once_flag once;
  std::call_once(once, [] { AddPreload(&PreloadToolKernels); });
}

void LoadToolKernels(int32_t ordinal) {
  CheckCuda(cudaSetDevice(ordinal), "cudaSetDevice");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  CheckCuda(PreloadToolKernels(), "loading the tools' kernels");
}

}  // namespace llar
