// Trivial custom call (impl name `xla.custom_call_copy` in the benchmarks):
// copies its operand to its result. It is registered exactly like the
// all-reduce, so a chain of it measures what XLA charges per custom call step
// before any communication (BENCHMARK.md, JAX level).
#include <cuda_runtime.h>

#include "kernels.h"

namespace llar {
namespace {

__global__ void CopyKernel(const char* __restrict__ in, char* __restrict__ out,
                           uint64_t n_bytes) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t first = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
  if (aligned) {
    const uint64_t vecs = n_bytes / 16;
    for (uint64_t i = first; i < vecs; i += stride) {
      reinterpret_cast<uint4*>(out)[i] = __ldg(reinterpret_cast<const uint4*>(in) + i);
    }
    for (uint64_t i = vecs * 16 + first; i < n_bytes; i += stride) out[i] = in[i];
  } else {
    for (uint64_t i = first; i < n_bytes; i += stride) out[i] = in[i];
  }
}

}  // namespace

cudaError_t LaunchCopy(const void* in, void* out, uint64_t n_bytes,
                       cudaStream_t stream) {
  if (n_bytes == 0) return cudaSuccess;
  constexpr uint32_t kThreads = 256;
  uint64_t blocks = (n_bytes / 16 + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  CopyKernel<<<static_cast<uint32_t>(blocks), kThreads, 0, stream>>>(
      static_cast<const char*>(in), static_cast<char*>(out), n_bytes);
  return cudaGetLastError();
}

cudaError_t PreloadCopy() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, CopyKernel);
}

}  // namespace llar
