// The copy kernels (copy.h).
#include "copy.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace llar {
namespace {

__device__ __forceinline__ void CopyBody(const char* __restrict__ in,
                                         char* __restrict__ out, uint64_t n_bytes) {
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

__global__ void CopyKernel(const char* __restrict__ in, char* __restrict__ out,
                           uint64_t n_bytes) {
  CopyBody(in, out, n_bytes);
}

struct WideCopyArgs {
  const char* in;
  char* out;
  uint64_t n_bytes;
  uint64_t pad[23];
};
static_assert(sizeof(WideCopyArgs) == 208, "wide copy parameter block");

__global__ void WideCopyKernel(const WideCopyArgs a) { CopyBody(a.in, a.out, a.n_bytes); }

constexpr uint32_t kCopyThreads = 256;

uint32_t CopyBlocks(uint64_t n_bytes) {
  uint64_t blocks = (n_bytes / 16 + kCopyThreads - 1) / kCopyThreads;
  if (blocks == 0) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  return static_cast<uint32_t>(blocks);
}

}  // namespace

cudaError_t LaunchCopy(const void* in, void* out, uint64_t n_bytes,
                       cudaStream_t stream) {
  if (n_bytes == 0) return cudaSuccess;
  CopyKernel<<<CopyBlocks(n_bytes), kCopyThreads, 0, stream>>>(
      static_cast<const char*>(in), static_cast<char*>(out), n_bytes);
  return cudaGetLastError();
}

cudaError_t LaunchWideCopy(const void* in, void* out, uint64_t n_bytes,
                           cudaStream_t stream) {
  if (n_bytes == 0) return cudaSuccess;
  WideCopyArgs a{};
  a.in = static_cast<const char*>(in);
  a.out = static_cast<char*>(out);
  a.n_bytes = n_bytes;
  WideCopyKernel<<<CopyBlocks(n_bytes), kCopyThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t PreloadCopy() {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, CopyKernel);
  if (e != cudaSuccess) return e;
  return cudaFuncGetAttributes(&attr, WideCopyKernel);
}

}  // namespace llar
