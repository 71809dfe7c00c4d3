#include "preload.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "copy.h"
#include "one_shot_ll_diag.h"
#include "registry.h"

namespace llar {
namespace {

cudaError_t PreloadToolKernels() {
  const cudaError_t e = PreloadCopy();
  if (e != cudaSuccess) return e;
  return PreloadOneShotLLDiag();
}

}  // namespace

void EnsureToolKernelsPreloaded() {
  static std::mutex mutex;
  static bool done = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (done) return;
  AddPreload(&PreloadToolKernels);  // throws on failure; a later call retries
  done = true;
}

}  // namespace llar
